"""Sends the training process a real SIGTERM (once or twice) at the moment a stage begins, so a
test stops a run at a chosen stage of a chosen step; imported by the run itself
(``imports=[sigterm_at]`` with this folder on ``PYTHONPATH``). Nothing of the run is replaced:
each wrapped method signals, then runs unchanged.

``SIGTERM_AT`` says where: ``sampling:N`` (the training sampling of step N), ``update:N`` (the
update of step N), ``optimizer_step:N`` (right after the first optimizer step of step N's update;
the number of optimizer steps that update took, when it ends, goes to ``SIGTERM_STAMP.steps``),
``validation:N`` (the validation at step N), ``export`` (the end-of-run export). ``SIGTERM_TIMES``:
how many signals (default 1). ``SIGTERM_SIGNAL``: which (default ``SIGTERM``; ``SIGINT`` is
Ctrl-C). ``SIGTERM_STAMP``: a file that gets the ``time.time()`` of the signal.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.backends.torch_backend.update import PolicyUpdater

WHERE = os.environ.get("SIGTERM_AT", "")
TIMES = int(os.environ.get("SIGTERM_TIMES", "1"))
SIGNAL = signal.Signals[os.environ.get("SIGTERM_SIGNAL", "SIGTERM")]


def _signal() -> None:
    Path(os.environ["SIGTERM_STAMP"]).write_text(repr(time.time()))
    for _ in range(TIMES):
        os.kill(os.getpid(), SIGNAL)
        time.sleep(0.01)  # two deliveries, not one pending signal


def _wrap(cls: type, name: str, due) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    async def wrapped(self, *args, **kwargs):
        if due(self, *args, **kwargs):
            _signal()
        return await original(self, *args, **kwargs)

    setattr(cls, name, wrapped)


kind, _, step = WHERE.partition(":")
if kind in ("sampling", "validation"):

    def _sampling_due(backend, batch, agent_workflow_engine, is_validation=False):
        return is_validation == (kind == "validation") and agent_workflow_engine.step == int(step)

    _wrap(TorchBackend, "generate_episodes", _sampling_due)
elif kind == "update":
    _wrap(PolicyUpdater, "update", lambda updater, state: state.global_step == int(step))
elif kind == "optimizer_step":
    _update = PolicyUpdater.update

    @functools.wraps(_update)
    async def _update_signalling_after_its_first_step(self, state):
        if state.global_step != int(step):
            return await _update(self, state)
        steps = []

        def after_step(optimizer, args, kwargs):
            steps.append(1)
            if len(steps) == 1:
                _signal()

        hook = self.actor.optimizer.register_step_post_hook(after_step)
        try:
            await _update(self, state)
        finally:
            hook.remove()
        Path(os.environ["SIGTERM_STAMP"] + ".steps").write_text(str(len(steps)))  # the update ran to its end

    PolicyUpdater.update = _update_signalling_after_its_first_step
elif kind == "export":
    _wrap(TorchBackend, "on_train_end", lambda backend, state: True)

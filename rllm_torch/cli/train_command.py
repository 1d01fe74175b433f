"""``rllm-torch-train`` / ``python -m rllm_torch.train``: a Hydra-launched RL training run.

With no arguments: the default arithmetic task, a tiny GPT-2-style model with random weights,
GRPO and the embedded torch backend. Any key can be overridden, e.g.
``rllm-torch-train rllm.algorithm.adv_estimator=rloo rllm.rollout.n=4``. The run directory
(``outputs/<project>/<experiment>``) gets ``config.yaml`` (resolved), ``metrics.jsonl``,
resumable ``checkpoints/step_*``, the exported model ``checkpoints/final`` and ``curves.png``.
Starting the same command again continues the run from its newest checkpoint; one run at a time
may use a run directory (:mod:`~rllm_torch.cli.run_directory`).

Exit status: 0 trained (or already complete); 1 an exception raised in the user's own code (a
reward, workflow, hook, estimator or loss: one block naming its file and line); 2 a configuration,
data, checkpoint or run-directory error, or a workflow that kept failing (one block, no traceback);
143 stopped by SIGTERM, 130 by Ctrl-C (SIGINT), each with the trained weights checkpointed first,
within seconds (a second SIGTERM changes nothing; a second Ctrl-C ends the run at once, losing what
was trained since the newest checkpoint; a Ctrl-C during the start-up, before the steps, ends it at
once: nothing is trained yet).

Under ``torchrun`` (``torchrun --nproc_per_node=N -m rllm_torch.train ...``, or the
``rllm-torch-train`` script) the N processes are one run: see :mod:`rllm_torch.trainer.ranks`.
Rank 0 alone prints and writes the run directory.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
import torch.distributed as dist
import transformers
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from rllm_torch.cli.backend_choice import import_user_modules
from rllm_torch.cli.command_line import (
    check_command_line,
    check_known_keys,
    config_groups,
    experiment_names,
    register_configs,
)
from rllm_torch.cli.error_lines import ERROR_EXIT_STATUS, report_error
from rllm_torch.cli.interrupts import ctrl_c_received, ignore_stop_signals, interrupted
from rllm_torch.cli.run_directory import check_run_directory, claimed_run_directory, remove_empty_run_dir
from rllm_torch.cli.usage import help_text, version_text
from rllm_torch.cli.warning_lines import one_line_warnings
from rllm_torch.core.errors import ConfigError, DistributedTimeoutError, RLLMTorchError
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rollouts import build_task
from rllm_torch.rollouts.single_turn import SingleTurnWorkflow
from rllm_torch.rollouts.task import Task
from rllm_torch.trainer.backend_registry import backend_class, typed_backend_config
from rllm_torch.trainer.backend_schema import BackendConfig
from rllm_torch.trainer.config_checks import RunSettings, check_run_config
from rllm_torch.trainer.logs.run_directory import run_directory
from rllm_torch.trainer.pipeline.trainable_groups import check_groups_can_train
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks, init_run_ranks, shutdown, torchrun_world_size
from rllm_torch.trainer.runtime.stop import InterruptedAgain, StopSignals, TrainingStopped
from rllm_torch.trainer.unified_trainer import UnifiedTrainer
from rllm_torch.trainer.user_errors import describe_error, user_frame

__all__ = ["main", "run", "backend_class"]


def check_reward_components(task: Task, plan: AdvantagePlan) -> None:
    """An estimator that declares it needs several rewards per trajectory (``reward_components``,
    e.g. ``gdpo``) needs a task that scores at least two reward functions
    (``Task.reward_components``; a task with its own workflow sets them itself).

    Raises:
        ConfigError: naming the estimator, the task and its reward functions.
    """
    needing = plan.estimators_needing("reward_components")
    if needing and task.workflow is None and len(task.reward_components) < 2:
        have = ", ".join(task.reward_components) or "none"
        raise ConfigError(
            f"estimator {', '.join(needing)} normalises several rewards per trajectory, and task.name={task.name!r} "
            f"scores {len(task.reward_components)} reward function(s) besides its reward ({have}); with one reward "
            "it is GRPO plus a batch whitening: use grpo, or a task with reward_components (the default arithmetic "
            "task has two)."
        )


def run(config: DictConfig, *, run_files: dict[str, str] | None = None, task: Task | None = None) -> UnifiedTrainer:
    """Train with a composed config; returns the (shut down) trainer, whose ``val_history``
    holds every validation's metrics. Under torchrun, initialises ``torch.distributed`` first and
    destroys the process group at the end. ``task``: what to train on, instead of the one
    ``config.task`` builds (rLLM's ``AgentTrainer`` passes its workflow and datasets).

    The run directory gets ``config.yaml`` (the resolved config) and ``run_files`` (``{relative
    path: text}``; the command line passes Hydra's ``.hydra/`` record) once training starts, and
    ``curves.png`` at the end; a run whose checkpoint already holds every step writes none of them.

    Raises:
        ConfigError (and subclasses), UnknownEstimatorError, DistributedSetupError: before
            training starts (every rank raises the same error); a key the schema does not know
            (:func:`~rllm_torch.cli.command_line.check_known_keys`) is a ConfigError too, and so are
            ``backend.name`` selecting no backend (UnknownBackendError) and a config whose ``backend``
            section is not typed by that backend's settings. BackendRegistrationError: ``backend.name``
            names a class that is not a backend.
        DistributedTimeoutError: under torchrun, a collective whose peer did not come within
            ``backend.dist_timeout_s`` or went away (gloo's error, named).
        TrainingStopped: a SIGTERM (or, once the steps began, a Ctrl-C) stopped the run, its trained weights
            checkpointed.
    """
    check_known_keys(config)
    import_user_modules(config.imports)
    backend_cls = backend_class(config.backend.name)  # a registered name, or package.module:Class
    settings = check_run_config(typed_backend_config(config, backend_cls), torchrun_world_size() or 1)
    # a backend whose settings declare no device or timeout runs with the torch backend's defaults
    device = OmegaConf.select(settings.config, "backend.device", default=BackendConfig.device)
    timeout_s = OmegaConf.select(settings.config, "backend.dist_timeout_s", default=BackendConfig.dist_timeout_s)
    ranks = init_run_ranks(device, timeout_s)
    clean = False
    try:
        with StopSignals((signal.SIGTERM, signal.SIGINT), announce=ranks.is_main) as stop:
            trainer = _train(settings, backend_cls, ranks, run_files or {}, stop, task)
        clean = True
        return trainer
    except RuntimeError as exc:
        if ranks.distributed and any(words in str(exc) for words in GLOO_PEER_ERRORS):
            raise collective_error(exc, ranks.rank, timeout_s) from exc
        raise
    finally:
        shutdown(ranks, clean=clean)


GLOO_PEER_ERRORS = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer")


def collective_error(exc: RuntimeError, rank: int, timeout_s: float) -> DistributedTimeoutError:
    """gloo's error of a collective whose peer never came (a timeout) or went away, as one that
    names this rank, what to look for and ``backend.dist_timeout_s``."""
    detail = str(exc).split("] ", 1)[-1].split(". This is typically")[0]
    if "Timed out" in detail:
        what = f"waited backend.dist_timeout_s={timeout_s:g} s for another rank at a collective ({detail})"
    else:
        what = f"lost another rank at a collective ({detail})"
    return DistributedTimeoutError(
        f"rank {rank} {what}: that rank stopped (see its error above), hangs (a reward, a tool call) or is slower by "
        f"more than the timeout (uneven steps). Fix what stopped it, or raise backend.dist_timeout_s; the same "
        "command resumes from the newest checkpoint."
    )


def _train(
    settings: RunSettings,
    backend_cls: type[BackendProtocol],
    ranks: RunRanks,
    run_files: dict[str, str],
    stop: StopSignals,
    task: Task | None,
) -> UnifiedTrainer:
    config = settings.config
    if not sys.stderr.isatty():  # a piped log: no progress bars (the console logger's follows tqdm's rule)
        transformers.utils.logging.disable_progress_bar()
    seed = config.seed
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    key = "rllm.trainer.default_local_dir"
    if config.rllm.trainer.default_local_dir is None:
        key = "hydra.run.dir" if HydraConfig.initialized() else key
        with open_dict(config):
            config.rllm.trainer.default_local_dir = (
                HydraConfig.get().runtime.output_dir
                if HydraConfig.initialized()
                else str(run_directory(config))  # outputs/<project>/<experiment>, as Hydra's
            )
    run_dir = Path(config.rllm.trainer.default_local_dir)
    check_run_directory(run_dir, key)  # before minutes of model and data start-up
    with claimed_run_directory(run_dir, ranks, key=key):  # one run per directory; a failed start leaves none
        return _train_in(run_dir, settings, backend_cls, ranks, run_files, stop, task)


def _train_in(
    run_dir: Path,
    settings: RunSettings,
    backend_cls: type[BackendProtocol],
    ranks: RunRanks,
    run_files: dict[str, str],
    stop: StopSignals,
    task: Task | None,
) -> UnifiedTrainer:
    config = settings.config
    task = build_task(config.task) if task is None else task
    if task.precomputed_advantage and not config.rllm.algorithm.use_precomputed_advantage:
        raise ConfigError(
            f"task.name={task.name!r} writes per-token advantages; set rllm.algorithm.use_precomputed_advantage=true (otherwise the estimator would overwrite them)."
        )
    check_reward_components(task, settings.plan)
    # one trajectory per episode (the single-turn workflow): a group is rllm.rollout.n of them
    check_groups_can_train(config, settings.plan, one_trajectory_per_episode=task.workflow is None)
    workflow_cls, workflow_args = (
        (task.workflow, task.workflow_args)
        if task.workflow is not None
        else (SingleTurnWorkflow, {"reward_fn": task.reward_fn, "reward_components": task.reward_components})
    )
    trainer = UnifiedTrainer(
        backend_cls,
        config,
        workflow_cls,
        train_dataset=task.train,
        val_dataset=task.val or None,
        workflow_args=workflow_args,
        backend_args={
            "alphabet": task.alphabet,
            "answer_in_response": task.answer_in_response,
            "max_new_tokens": task.max_new_tokens,
        },
        ranks=ranks,
        run_files={"config.yaml": OmegaConf.to_yaml(config, resolve=True), **run_files},
        stop_signals=stop,
        settings=settings,
    )
    devices = ranks.gather(str(getattr(trainer.backend, "device", "unknown")))
    if ranks.is_main:
        if ranks.distributed:
            print(
                f"world size {ranks.world_size}: torch.distributed {dist.get_backend(ranks.process_group)}, "
                f"devices {', '.join(f'rank {r}: {d}' for r, d in enumerate(devices))}",
                flush=True,
            )
    start = time.perf_counter()
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    if ranks.is_main:
        # the curves are the end of the run's last part: drawn again when a stop lost them
        drawn = trainer.already_complete and (run_dir / "curves.png").is_file()
        if not drawn and "jsonl" in trainer.logger.backends and (run_dir / "metrics.jsonl").is_file():
            from rllm_torch.cli.plot import plot_run

            plot_run(run_dir)
        summarize(trainer, time.perf_counter() - start, run_dir)
    return trainer


def summarize(trainer: UnifiedTrainer, seconds: float, run_dir: Path) -> None:
    """Print the first and last validation pass@1 of each data source and the wall time."""
    history = trainer.val_history
    if history:
        first, last = history[0], history[-1]
        for key in sorted(k for k in last[1] if k.endswith("/pass@1")):
            print(
                f"{key}: {first[1].get(key, float('nan')):.3f} (step {first[0]}) -> {last[1][key]:.3f} (step {last[0]})"
            )
    print(f"wall time {seconds:.1f} s; run directory {run_dir}")


register_configs()


def hydra_record(config: DictConfig) -> dict[str, str]:
    """What Hydra writes into ``.hydra/`` with its default ``hydra.output_subdir`` (the composed
    config, Hydra's own config and the overrides), for the trainer to write once the run starts
    to train. ``configs/train.yaml`` sets ``output_subdir: null``, so that a launch that fails at
    start-up or finds its run complete leaves the run directory as it was."""
    hydra_config = HydraConfig.instance().cfg
    return {
        ".hydra/config.yaml": OmegaConf.to_yaml(config),
        ".hydra/hydra.yaml": OmegaConf.to_yaml(hydra_config),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_config.hydra.overrides.task),
    }


@hydra.main(config_path="pkg://rllm_torch.configs", config_name="train", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    try:
        run(config, run_files=hydra_record(config))
    except TrainingStopped as stopped:  # SIGTERM or Ctrl-C: the trained weights' checkpoint is written
        ignore_stop_signals()  # a second signal while the process ends must not change its exit status
        if os.environ.get("RANK", "0") == "0":
            where = (
                f"after step {stopped.step}, checkpoint {stopped.checkpoint}; the same command continues from it"
                if stopped.checkpoint is not None
                else "before its first step; the same command starts it"
            )
            print(
                f"rllm-torch-train: stopped by {stopped.signal_name} {where} (exit {stopped.exit_status})",
                file=sys.stderr,
                flush=True,
            )
        end_rank_process(stopped.exit_status)  # stopped and written: no interpreter finalization to wait for
    except BaseException as exc:
        full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
        # Ctrl-C, also when a library turned the KeyboardInterrupt into an error of its own (transformers'
        # lazy imports raise ModuleNotFoundError): where the same command goes on, not a traceback
        if not full_error and (
            isinstance(exc, KeyboardInterrupt) or (ctrl_c_received() and isinstance(exc, Exception))
        ):
            interrupted(config, again=isinstance(exc, InterruptedAgain))
        if not full_error and package_error(exc) is None and user_frame(exc) is not None:
            report_user_error(exc)  # the user's reward, workflow, hook, estimator or loss: where, in one block
            sys.exit(USER_ERROR_EXIT_STATUS)
        if full_error or (error := package_error(exc)) is None:
            raise
        if os.environ.get("RANK", "0") == "0" and HydraConfig.initialized():  # the package's errors: one block
            remove_empty_run_dir(HydraConfig.get().runtime.output_dir)  # only .hydra/: a failed start-up
        report_error(error)
        sys.exit(ERROR_EXIT_STATUS)


def package_error(exc: BaseException) -> RLLMTorchError | None:
    """``exc`` when it is one of the package's errors, or the one an OmegaConf error wraps (a
    resolver of ours that raised while a setting was read: OmegaConf re-raises it as an
    ``InterpolationResolutionError``, the original as its context); else None."""
    seen = exc
    while seen is not None:
        if isinstance(seen, RLLMTorchError):
            return seen
        seen = (
            seen.__cause__ or seen.__context__
            if type(seen).__module__.startswith(("omegaconf", "rllm_torch"))
            else None
        )
    return None


#: The exit status of an exception raised in the user's own code (not a configuration error).
USER_ERROR_EXIT_STATUS = 1


def report_user_error(exc: BaseException) -> None:
    """One block on stderr for an exception of the user's code: its type, message and place
    (:func:`~rllm_torch.trainer.user_errors.describe_error`), no traceback."""
    print(f"rllm-torch-train: error in your code: {describe_error(exc)}", file=sys.stderr)
    print("  (set HYDRA_FULL_ERROR=1 to see the traceback)", file=sys.stderr, flush=True)


def main() -> None:
    """The console script: ``--version`` and ``--help`` are answered here
    (:mod:`~rllm_torch.cli.usage`); the command line is checked first (unknown keys, experiments,
    argparse-style flags), then Hydra composes the config and :func:`run` trains. Warnings print
    one line each (:mod:`~rllm_torch.cli.warning_lines`)."""
    one_line_warnings()
    if "--version" in sys.argv[1:]:
        print(version_text())
        return
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(help_text(experiment_names(), config_groups()))
        return
    try:
        check_command_line(sys.argv[1:])
    except RLLMTorchError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        report_error(exc)
        sys.exit(ERROR_EXIT_STATUS)
    _hydra_main()
    if torchrun_world_size() is not None:
        end_rank_process()


def end_rank_process(status: int = 0) -> None:
    """End a torchrun rank after a clean run, or any process stopped by a signal (``status`` 143 or 130),
    without interpreter finalization (``os._exit(status)``): every file is closed by now.

    The process group is destroyed and every file is closed by now, but the model's DDP reducer
    or FSDP device mesh still references gloo's backend; finalizing the interpreter can then
    destroy gloo's worker threads and tensors in an order that aborts the process
    ("terminate called without an active exception", SIGABRT; see pytorch/pytorch#179291),
    which torchrun reports as a failed run. Seen about once in a few dozen CPU runs under load.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    main()

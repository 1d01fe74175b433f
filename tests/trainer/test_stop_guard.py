"""The stop guard (trainer/runtime/stop.py, issue 43) without processes: a stop request inside a
guarded stage abandons it at its next safe place, puts back the run's counters and generators,
checkpoints the trained weights unless they are on disk, and raises TrainingStopped; stop points
sit between a transformer's blocks in a forward and in a checkpointed backward. The real-signal
tests are tests/cli/test_sigterm_stages.py."""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rllm_torch.trainer.runtime.stop import (
    InterruptedAgain,
    StopGuard,
    StopRequested,
    StopSignals,
    TrainingStopped,
    add_stop_points,
    no_stop_points,
    stop_point,
)
from rllm_torch.trainer.state import TrainerState


class Backend:
    """The backend's per-rank state the guard saves and puts back: a sampling generator."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def rank_state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_rank_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def guard(signals: StopSignals | None, saved: list, on_disk: int | None = None, distributed: bool = False):
    return StopGuard(
        signals,
        checkpoint=lambda state: saved.append((state.global_step, state.batch_in_epoch, random.random())),
        saved_step=lambda: on_disk,
        newest=lambda: "newest",
        backend=Backend(),
        distributed=distributed,
    )


def requested() -> StopSignals:
    signals = StopSignals(announce=False)
    signals.received = signal.SIGTERM
    return signals


def test_a_stop_inside_a_step_puts_the_state_back_and_checkpoints_the_step_before():
    saved, state = [], TrainerState(global_step=4, batch_in_epoch=4)
    stops = guard(requested(), saved)
    random.seed(7)
    expected_draw = random.Random(7).random()
    draws = torch.rand(3, generator=stops.backend.generator)
    with pytest.raises(TrainingStopped) as stopped:
        with stops.stage(state):
            state.global_step, state.batch_in_epoch = 5, 5
            random.random()
            torch.rand(3, generator=stops.backend.generator)  # the abandoned step's draws
            stop_point()
            raise AssertionError("not reached")
    assert (stopped.value.step, stopped.value.checkpoint) == (4, "newest")
    assert (state.global_step, state.batch_in_epoch) == (4, 4)
    assert saved == [(4, 4, expected_draw)]  # the checkpoint holds the generators as they were
    assert not torch.equal(torch.rand(3, generator=stops.backend.generator), draws)  # back at step 4's state


def test_a_step_already_on_disk_is_not_written_again_and_nothing_is_written_before_the_first():
    saved = []
    with pytest.raises(TrainingStopped):
        with guard(requested(), saved, on_disk=4).stage(TrainerState(global_step=4)):
            stop_point()
    with pytest.raises(TrainingStopped) as stopped:
        with guard(requested(), saved).stage(TrainerState(global_step=0)):
            stop_point()
    assert saved == [] and stopped.value.checkpoint is None


@pytest.mark.parametrize("signals", [None, StopSignals(announce=False)], ids=["no-signals", "not-requested"])
def test_stop_points_do_nothing_without_a_request_or_outside_a_stage(signals):
    with guard(signals, []).stage(TrainerState()):
        stop_point()
    stop_point()  # outside any stage, even with a request somewhere
    with guard(requested(), [], distributed=True).stage(TrainerState(global_step=3)):
        stop_point()  # several processes: stages are not abandoned


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=4, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=32
    )
    return LlamaForCausalLM(config)


def test_a_forward_stops_between_two_blocks():
    model = llama()
    assert add_stop_points(model) == 4
    ran = []
    for i, block in enumerate(model.model.layers):
        block.register_forward_hook(lambda module, args, out, i=i: ran.append(i))
    signals = StopSignals(announce=False)
    with pytest.raises(TrainingStopped):
        with guard(signals, []).stage(TrainerState(global_step=2)):
            model.model.layers[1].register_forward_hook(lambda *args: setattr(signals, "received", signal.SIGTERM))
            model(torch.tensor([[1, 2, 3]]))
    assert ran == [0, 1]  # the request arrived during block 1: block 2 never ran


def test_a_checkpointed_backward_stops_in_its_recomputation():
    model = llama().train()
    add_stop_points(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    signals = StopSignals(announce=False)
    with guard(signals, []).stage(TrainerState(global_step=2)):
        loss = model(torch.tensor([[1, 2, 3, 4]]), use_cache=False).logits.sum()
    with pytest.raises(TrainingStopped):
        with guard(signals, []).stage(TrainerState(global_step=2)):
            signals.received = signal.SIGTERM  # arrives after the forward
            with pytest.raises(StopRequested):
                loss.backward()
            raise StopRequested  # what the update does after zeroing the gradient


def test_past_the_point_of_no_return_the_blocks_stop_points_raise_nothing_and_the_stop_waits():
    """Issue 52: an update past its first optimizer step runs to its end; the request stays."""
    model = llama()
    add_stop_points(model)
    ran = []
    for i, block in enumerate(model.model.layers):
        block.register_forward_hook(lambda module, args, out, i=i: ran.append(i))
    stops = guard(requested(), [])
    with stops.stage(TrainerState(global_step=2)):
        with no_stop_points():
            model(torch.tensor([[1, 2, 3]]))
            stop_point()
    assert ran == [0, 1, 2, 3] and stops.signals.requested
    with pytest.raises(TrainingStopped):  # after it, the same stage's stop points abandon it again
        with stops.stage(TrainerState(global_step=2)):
            with no_stop_points():
                pass
            stop_point()


def test_ctrl_c_is_a_keyboard_interrupt_until_the_steps_begin_then_a_stop_and_a_second_one_ends_at_once():
    """Real SIGINTs to this process (issue 49): before take_ctrl_c, the handler found on entry."""
    with StopSignals((signal.SIGTERM, signal.SIGINT), announce=False) as signals:
        with pytest.raises(KeyboardInterrupt) as first:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between two bytecodes of the main thread
                pass
        assert type(first.value) is KeyboardInterrupt and not signals.requested
        signals.take_ctrl_c()
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.requested and signals.name == "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's signal meanwhile changes nothing
        assert signals.name == "SIGINT"
        with pytest.raises(InterruptedAgain):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back on exit
    assert TrainingStopped("SIGINT", 3, None).exit_status == 130
    assert TrainingStopped("SIGTERM", 3, None).exit_status == 143

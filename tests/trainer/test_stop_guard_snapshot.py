"""What a stop inside a stage puts back (issue 50): the rejection-sampling accumulation as it was
when the stage began, however the stage changed it (in place or by replacing it), so the
checkpoint the stop writes is the one taken before the stage. Behaviour only: a stage changes the
state, a stop point is hit, and the state is read afterwards and at the checkpoint."""

from __future__ import annotations

import copy
import signal

import pytest

from rllm_torch.rllm.types import Episode, Trajectory, TrajectoryGroup
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingState
from rllm_torch.trainer.runtime.stop import StopGuard, StopSignals, TrainingStopped, stop_point
from rllm_torch.trainer.state import TrainerState


class Backend:
    def rank_state_dict(self) -> dict:
        return {}

    def load_rank_state_dict(self, state: dict) -> None:
        pass


def _state() -> TrainerState:
    state = TrainerState(global_step=3, batch_in_epoch=3)
    state.rs_state.accumulated_groups.append(TrajectoryGroup([Trajectory(name="a", reward=1.0)], group_id="t0:all"))
    state.rs_state.accumulated_episodes.append(Episode(task_id="t0"))
    state.rs_state.counts.solve_partial = 1
    state.rs_state.counts.groups_before_filter = 2
    return state


def _picture(rs: RejectionSamplingState) -> tuple:
    return (
        [g.group_id for g in rs.accumulated_groups],
        [e.task_id for e in rs.accumulated_episodes],
        copy.copy(vars(rs.counts)),
    )


def _stopped_stage(state: TrainerState, change) -> list:
    """Run a stage that ``change``s the state and then meets a stop point; the pictures of the
    rejection-sampling state the checkpoint saw."""
    signals = StopSignals(announce=False)
    signals.received = signal.SIGTERM
    written = []
    guard = StopGuard(
        signals,
        checkpoint=lambda s: written.append(_picture(s.rs_state)),
        saved_step=lambda: None,
        newest=lambda: "newest",
        backend=Backend(),
        distributed=False,
    )
    with pytest.raises(TrainingStopped):
        with guard.stage(state):
            state.global_step += 1
            change(state.rs_state)
            stop_point()
    return written


def _in_place(rs: RejectionSamplingState) -> None:
    rs.accumulated_groups.append(TrajectoryGroup([Trajectory(name="b", reward=0.0)], group_id="t1:all"))
    rs.accumulated_episodes.clear()
    rs.counts.solve_partial += 5
    rs.counts.groups_after_filter = 9


def _reset(rs: RejectionSamplingState) -> None:
    rs.reset()  # what a released batch does: new lists, new counts


@pytest.mark.parametrize("change", [_in_place, _reset], ids=["changed in place", "reset"])
def test_a_stop_puts_back_the_rejection_sampling_state_of_the_stage_entry(change):
    state = _state()
    before = _picture(state.rs_state)
    written = _stopped_stage(state, change)
    assert _picture(state.rs_state) == before
    assert written == [before]  # the checkpoint holds the state before the stage
    assert state.global_step == 3


def test_the_state_put_back_is_not_the_object_the_abandoned_stage_kept():
    """The abandoned stage's objects may live on (a producer, a closure); changing them after the
    stop must not change the run's state."""
    state = _state()
    kept = state.rs_state
    groups = kept.accumulated_groups
    _stopped_stage(state, _in_place)
    before = _picture(state.rs_state)
    groups.append(TrajectoryGroup([Trajectory(name="c", reward=0.5)], group_id="t2:all"))
    kept.counts.solve_all += 7
    assert _picture(state.rs_state) == before

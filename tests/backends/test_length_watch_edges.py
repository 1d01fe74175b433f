"""The edges of the start-up length warning (issue 50): half the responses cut is enough to warn
("half or more", the watch's rule) and one fewer is not; an answer exactly
``rllm.rollout.max_new_tokens`` long fits, one token more does not; a negative reward is a score
(a task whose rewards are -1 and 0 is not "every reward 0"); and validation batches are not
training steps, in a real run."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.backends.torch_backend.task_defaults import ANSWER_MARGIN, LengthLimitWatch, response_length
from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer
from rllm_torch.cli.train_command import run
from rllm_torch.rllm.types import TerminationReason


def _episodes(count: int, *, cut: int, rewards: tuple[float, ...] = (0.0,)) -> list:
    """``count`` episodes, the first ``cut`` ended at the limit, none correct; rewards cycled."""
    return [
        SimpleNamespace(
            termination_reason=TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
            if i < cut
            else TerminationReason.ENV_DONE,
            is_correct=False,
            trajectories=[SimpleNamespace(reward=rewards[i % len(rewards)])],
        )
        for i in range(count)
    ]


def _said(watch: LengthLimitWatch, batches: list) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches:
            watch.observe(batch)
    return [str(w.message) for w in caught]


def _length_warnings(said: list[str]) -> list[str]:
    return [m for m in said if m.startswith("rllm.rollout.max_new_tokens=")]


@pytest.mark.parametrize(("cut", "warns"), [(32, True), (31, False), (33, True)])
def test_half_the_responses_cut_is_enough_to_warn_and_one_fewer_is_not(cut, warns):
    # 4 batches of 64: 4 * cut of 256 responses cut; 4 * 32 = 128 = exactly half
    said = _length_warnings(_said(LengthLimitWatch(2, ("dcba", 4)), [_episodes(64, cut=cut, rewards=(0.5,))] * 4))
    assert bool(said) == warns
    if warns:
        assert f"{4 * cut / 256:.0%} of the responses" in said[0]


@pytest.mark.parametrize(("answer_tokens", "warns"), [(2, False), (3, True)])
def test_an_answer_exactly_the_limit_long_fits_and_one_token_more_does_not(answer_tokens, warns):
    said = _said(LengthLimitWatch(2, ("x" * answer_tokens, answer_tokens)), [_episodes(8, cut=8, rewards=(0.5,))] * 4)
    assert bool(_length_warnings(said)) == warns


def test_the_length_taken_from_the_tasks_fits_the_longest_answer_with_its_margin():
    tokenizer = build_char_tokenizer("0123456789+=")
    length = response_length(
        tokenizer, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "9+9=", "answer": "18"}], given=None
    )
    assert (length.tokens, length.longest_answer) == (2 * 2, ("18", 2)) and ANSWER_MARGIN == 2
    # and a run with that length and that answer is not the length's fault
    assert (
        _length_warnings(_said(LengthLimitWatch(length.tokens, length.longest_answer), [_episodes(8, cut=8)] * 4)) == []
    )


@pytest.mark.parametrize("rewards", [(-1.0,), (-1.0, 0.0), (0.0, -0.25)])
def test_a_negative_reward_is_a_score_not_every_reward_zero(rewards):
    # answers that fit, few cut: only the no-reward warning could speak, and a negative reward is a score
    assert _said(LengthLimitWatch(6, ("eeb", 3)), [_episodes(16, cut=2, rewards=rewards)] * 4) == []
    # tasks without answers, every response cut: the length warning needs every reward 0
    assert _length_warnings(_said(LengthLimitWatch(4, None), [_episodes(16, cut=16, rewards=rewards)] * 4)) == []


def test_zero_rewards_only_do_warn_once_so_the_cases_above_are_not_silent_by_accident():
    assert len(_said(LengthLimitWatch(6, ("eeb", 3)), [_episodes(16, cut=2)] * 6)) == 1


def test_validation_batches_are_not_counted_as_training_steps(tmp_path):
    """2 training steps with validation before, between and after them: the watch saw 2 batches of
    8 prompts x 4 rollouts, and said nothing of "the first 4 training steps" (it has not seen 4)."""
    config = make_config(
        tmp_path,
        *TINY_STEPS,
        "task.val_size=4",
        "rllm.rollout.n_val=2",
        "rllm.trainer.test_freq=1",
        "backend.num_threads=1",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run(config)
    watch = trainer.backend.length_watch
    assert (watch.seen, watch.episodes) == (2, 2 * 8 * 4)
    assert not [w for w in caught if "first 4" in str(w.message)]

"""The longer task: reversing digit strings, partial credit per position, exact-match correctness."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from tiny_runs import TINY_VALIDATED
from trainer_fakes import make_config

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.catalog import build_task
from rllm_torch.rollouts.reverse import positional_match_reward, reverse_problems
from rllm_torch.trainer.config_checks import check_run_config


@pytest.mark.parametrize(
    "response, reward",
    [
        ("54321", 1.0),
        (" 54321\n", 1.0),  # surrounding whitespace is not scored
        ("54311", 0.8),
        ("12345", 0.2),  # only the middle digit is in place
        ("5432", 0.8),  # one position missing
        ("543210", 5 / 6),  # one position too many
        ("", 0.0),
        ("4321", 0.0),  # shifted by one: no position right
    ],
)
def test_the_reward_is_the_share_of_right_positions_over_the_longer_string(response, reward):
    assert positional_match_reward({"answer": "54321"}, response) == pytest.approx(reward, abs=0)


def test_problems_are_reversed_digit_strings_of_the_configured_lengths_and_the_same_for_a_seed():
    problems = reverse_problems(500, min_digits=3, max_digits=7, seed=4)
    assert problems == reverse_problems(500, min_digits=3, max_digits=7, seed=4)
    assert {len(p["answer"]) for p in problems} == {3, 4, 5, 6, 7}
    for p in problems:
        digits = p["prompt"][:-1]
        assert p["prompt"].endswith("=") and digits.isdigit() and p["answer"] == digits[::-1]
    assert any(p["answer"].startswith("0") for p in problems)  # leading zeros are kept as digits


@pytest.mark.parametrize("bad", [{"min_digits": 0}, {"min_digits": 5, "max_digits": 4}, {"train_size": -1}])
def test_bad_digit_counts_are_config_errors(bad):
    config = OmegaConf.merge(
        {"name": "reverse", "seed": 0, "train_size": 4, "val_size": 2, "min_digits": 2, "max_digits": 4}, bad
    )
    with pytest.raises(ConfigError, match="reverse task"):
        build_task(config)


def test_the_reverse_keys_are_refused_for_another_task(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.max_digits=9 is not used by task\.name='arithmetic'.*task=reverse"):
        check_run_config(make_config(tmp_path, "task.max_digits=9"))
    check_run_config(make_config(tmp_path, "task.name=reverse", "task.max_digits=9"))


def test_a_short_run_on_the_reverse_task_trains_on_long_responses_with_partial_credit(tmp_path):
    from rllm_torch.cli.train_command import run

    config = make_config(
        tmp_path,
        "task.name=reverse",
        *TINY_VALIDATED,
        "rllm.rollout.max_new_tokens=16",
    )
    run(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    # an untrained model rarely ends early: responses are long, and partial credit is a fraction
    assert all(r["batch/response_length"] > 4 for r in train_rows)
    assert all(0 < r["reward/solver/mean"] < 1 for r in train_rows)
    assert [r["step"] for r in rows if "val/reverse/pass@1" in r] == [0, 2]


def test_max_new_tokens_shorter_than_the_longest_answer_is_a_start_up_error(tmp_path):
    from rllm_torch.backends.torch_backend.backend import TorchBackend

    built = build_task(make_config(tmp_path, "task.name=reverse").task)

    def backend(max_new_tokens: int, answer_in_response: bool = True) -> TorchBackend:
        config = make_config(tmp_path, "task.name=reverse", f"rllm.rollout.max_new_tokens={max_new_tokens}")
        return TorchBackend(config, alphabet=built.alphabet, answer_in_response=answer_in_response)

    backend(6).validate_prompts(built.train)  # 6 digits fit in 6 tokens (a cut response is still scored)
    with pytest.raises(
        ConfigError, match=r"longest answer .* is 6 tokens: rllm\.rollout\.max_new_tokens=5 .* to 7 or more"
    ):
        backend(5).validate_prompts(built.train)
    backend(5, answer_in_response=False).validate_prompts(built.train)  # a reward that parses a part: no check


def test_task_reverse_takes_twice_its_longest_answer_unless_a_length_is_set_which_must_hold_the_answer(tmp_path):
    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.cli.train_command import run

    built = build_task(make_config(tmp_path, "task.name=reverse").task)
    config = make_config(tmp_path, "task.name=reverse")
    backend = TorchBackend(config, alphabet=built.alphabet, answer_in_response=True, tasks=built.train)
    assert config.rllm.rollout.max_new_tokens == backend.config.rllm.rollout.max_new_tokens == 12  # 2 x 6 digits
    assert dict(backend.summary_rows())["responses"].startswith("at most 12 tokens (twice the longest answer's tokens")
    with pytest.raises(ConfigError, match=r"task\.name='reverse' scores the whole answer.*max_new_tokens=2"):
        run(make_config(tmp_path, "task.name=reverse", "rllm.rollout.max_new_tokens=2"))

"""``task=guess``: the game's rules, rewards that add up, observations, both styles, the config
errors, and a real training step in every stepwise mode."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from rllm_torch.backends.torch_backend import build_char_tokenizer
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.stepwise import turn_rewards
from rllm_torch.rllm.types import TerminationReason
from rllm_torch.rollouts.guess import GuessNumberWorkflow, guess_problems, guess_task, parse_guess
from rllm_torch.trainer import ModelOutput, RolloutEngine

TOK = build_char_tokenizer("0123456789?<>ab")


class Scripted(RolloutEngine):
    """Answers the i-th call with ``answers[i]``."""

    def __init__(self, answers):
        self.answers, self.prompts = list(answers), []

    async def generate(self, prompt):
        self.prompts.append(prompt)
        text = self.answers[len(self.prompts) - 1]
        ids = TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
        prompt_ids = TOK(prompt[:40].replace(" ", "a"), add_special_tokens=False)["input_ids"]
        return ModelOutput(
            text=text, prompt_ids=prompt_ids, completion_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"
        )


def play(answers, secret=3, style="symbols", max_turns=4, cost=0.1):
    engine = Scripted(answers)
    workflow = GuessNumberWorkflow(engine, max_turns=max_turns, turn_cost=cost, style=style)
    prompt = guess_problems(1, max_number=9, style=style, seed=0)[0]["prompt"]
    episode = asyncio.run(workflow.run({"secret": secret, "prompt": prompt}, "t:0"))
    return episode, engine.prompts


def test_a_found_secret_ends_the_episode_and_each_wrong_guess_costs():
    episode, prompts = play(["5", "1", "3", "9"])
    traj = episode.trajectories[0]
    assert prompts == ["?", "?5<", "?5<1>"]  # "<": the secret is smaller; ">": larger
    assert [s.reward for s in traj.steps] == [-0.1, -0.1, 1.0]
    assert traj.reward == pytest.approx(0.8) and episode.is_correct
    assert episode.termination_reason == TerminationReason.ENV_DONE
    assert [s.observation for s in traj.steps] == prompts  # the conversation each guess answered
    assert turn_rewards(traj, "t", "turn_level") == pytest.approx([-0.1, -0.1, 1.0])


def test_running_out_of_turns_and_quitting_cost_the_same():
    lost, _ = play(["5", "1", "2", "4"])
    assert len(lost.trajectories[0].steps) == 4 and lost.trajectories[0].reward == pytest.approx(-0.3)
    assert lost.termination_reason == TerminationReason.MAX_TURNS_EXCEEDED and not lost.is_correct
    quit_early, _ = play(["5", "ab"])  # not a number: the episode ends and forfeits the turns left
    assert [s.reward for s in quit_early.trajectories[0].steps] == pytest.approx([-0.1, -0.2])
    assert quit_early.trajectories[0].reward == pytest.approx(-0.3)


def test_words_style_for_a_chat_model():
    episode, prompts = play(["My guess is 5.", "2", "3"], style="words")
    assert prompts[0].startswith("I am thinking of a whole number from 0 to 9.")
    assert prompts[1].endswith("5 is too high. Guess again: answer with the number only.")
    assert prompts[2].endswith("2 is too low. Guess again: answer with the number only.")
    assert episode.is_correct and len(episode.trajectories[0].steps) == 3
    words = ("7", " 7.", "it is 12", "seven", "", "³", "7²", "9" * 5000, "5, or 6")
    assert [parse_guess(t, "words") for t in words] == [7, 7, 12, None, None, None, 7, None, 5]
    assert [parse_guess(t) for t in ("7", " 7 ", "7.", "12", "³", "9" * 5000)] == [7, 7, None, 12, None, None]
    assert [parse_guess(t) for t in ("seven", "", "³", "7²", "9" * 5000)] == [None] * 5


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"max_number": 10}, r"max_number must be in \[1, 9\] for style='symbols'"),
        ({"style": "emoji"}, "task.style must be one of"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
        ({"turn_cost": -0.5}, "turn_cost >= 0"),
        ({"turn_cost": float("inf")}, "turn_cost >= 0"),
    ],
)
def test_bad_settings(overrides, match):
    config = OmegaConf.create(
        dict(name="guess", seed=0, train_size=4, val_size=2, max_number=7, max_turns=4, turn_cost=0.1, style="symbols")
        | {"env_latency_ms": [0, 0]}
        | overrides
    )
    with pytest.raises(ConfigError, match=match):
        guess_task(config)


@pytest.mark.parametrize("mode", ["turn_level", "mt_grpo", "gigpo"])
def test_real_training_steps_in_each_turn_mode_give_each_turn_its_own_advantage(tmp_path, monkeypatch, mode):
    import json

    import torch
    from tiny_runs import TINY_VALIDATED
    from trainer_fakes import make_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.cli.train_command import run

    batches = []  # every batch the real backend built, with the advantages it trained on
    update = TorchBackend.update_policy

    async def keep(self, state):
        batches.append(state.backend_batch)
        return await update(self, state)

    monkeypatch.setattr(TorchBackend, "update_policy", keep)
    config = make_config(
        tmp_path,
        "task.name=guess",
        *TINY_VALIDATED,
        "rllm.algorithm.adv_estimator=rloo",
        f"rllm.stepwise_advantage.mode={mode}",
    )
    run(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "actor/loss" in r]
    assert len(train_rows) == 2 and all("turns/guesser/mean" in r for r in train_rows)
    varied = False
    for batch in batches:
        assert batch.turn_rewards is not None and (batch.observation_index is not None) == (mode == "gigpo")
        row_adv_R = (batch.advantages * batch.response_mask).sum(-1) / batch.response_mask.sum(-1)
        for n in range(int(batch.row_index.max()) + 1):  # some trajectory's turns get different advantages
            values = row_adv_R[batch.row_index == n]
            varied |= bool(values.numel() > 1 and (values - values[0]).abs().max() > 1e-6)
        assert torch.isfinite(batch.advantages).all()
    assert varied

"""Multi-step trajectories: the arithmetic-chain workflow, one batch row per step, the trajectory
advantage broadcast to each step's own response tokens, and real training steps on ``task=chain``."""

from __future__ import annotations

import asyncio
import json

import torch
from tiny_runs import TINY_VALIDATED
from trainer_fakes import make_config

from rllm_torch import AlgorithmConfig
from rllm_torch.backends.torch_backend import build_char_tokenizer
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup
from rllm_torch.rollouts.chain import ArithmeticChainWorkflow, chain_problems
from rllm_torch.trainer import ModelOutput, RolloutEngine, build_token_batch, compute_token_advantages

TOK = build_char_tokenizer("0123456789+=!?")


class ScriptedEngine(RolloutEngine):
    """Answers each prompt from a table (``"*"`` for any other prompt), with real token ids."""

    def __init__(self, answers: dict[str, str]):
        self.answers, self.prompts = answers, []

    async def generate(self, prompt):
        self.prompts.append(prompt)
        text = self.answers.get(prompt, self.answers.get("*", "0"))
        ids = TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
        return ModelOutput(
            text=text,
            prompt_ids=TOK(prompt, add_special_tokens=False)["input_ids"],
            completion_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
        )


def _run(engine, terms):
    task = {"prompt": f"{terms[0]}+{terms[1]}=", "terms": terms, "data_source": "chain"}
    return asyncio.run(ArithmeticChainWorkflow(engine).run(task, "t:0"))


def test_each_turn_is_a_step_whose_prompt_is_the_conversation_so_far_with_feedback():
    engine = ScriptedEngine({"3+4=": "7", "3+4=7!7+2=": "9"})
    episode = _run(engine, [3, 4, 2])
    steps = episode.trajectories[0].steps
    assert engine.prompts == ["3+4=", "3+4=7!7+2="]
    # each step earns its share of the trajectory reward, so the turn rewards add up to it
    assert [s.reward for s in steps] == [0.5, 0.5] and episode.trajectories[0].reward == 1.0 and episode.is_correct
    assert steps[1].prompt_ids == TOK("3+4=7!7+2=", add_special_tokens=False)["input_ids"] and steps[1].done


def test_a_wrong_answer_is_carried_into_the_next_question_and_scored_against_it():
    # turn 1: 3+4 -> "6" (wrong, feedback "?"); turn 2 asks 6+2 and "8" is right: reward (0 + 1) / 2
    episode = _run(ScriptedEngine({"3+4=": "6", "3+4=6?6+2=": "8"}), [3, 4, 2])
    assert [s.reward for s in episode.trajectories[0].steps] == [0.0, 0.5]
    assert episode.trajectories[0].reward == 0.5 and not episode.is_correct


def test_an_answer_that_is_not_a_number_ends_the_episode_after_that_turn():
    episode = _run(ScriptedEngine({"*": "+"}), [3, 4, 2])
    assert len(episode.trajectories[0].steps) == 1 and episode.trajectories[0].reward == 0.0


def test_chain_problems_have_the_requested_turns_and_one_digit_answers():
    rows = chain_problems(50, turns=3, max_sum=9, seed=1)
    assert all(
        len(r["terms"]) == 4 and sum(r["terms"]) <= 9 and r["answer"] == str(r["terms"][0] + r["terms"][1])
        for r in rows
    )
    assert rows == chain_problems(50, turns=3, max_sum=9, seed=1)


def test_every_step_is_a_row_and_gets_its_trajectorys_advantage_at_its_own_response_tokens():
    # group of two: A has two steps (reward 1), B one step (reward 0). RLOO, n = 2: adv A = 1 - 0 = 1, B = 0 - 1 = -1.
    a0 = Step(prompt_ids=[1, 2], response_ids=[5, 6], response_mask=[1, 0])  # the second token is not trained
    a1 = Step(prompt_ids=[1, 2, 5, 3], response_ids=[7])
    b0 = Step(prompt_ids=[1, 2], response_ids=[8, 9])
    group = TrajectoryGroup([Trajectory("solver", [a0, a1], 1.0), Trajectory("solver", [b0], 0.0)], group_id="t:solver")
    batch = build_token_batch([group], pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 5, 6, 0], [1, 2, 5, 3, 7], [1, 2, 8, 9, 0]]
    assert batch.row_index.tolist() == [0, 0, 1] and batch.rewards.tolist() == [1.0, 0.0]
    compute_token_advantages(batch, AlgorithmConfig(estimator="rloo"))
    # row 0: A's step 0, mask [0 0 1 0 0] -> [0 0 1 0 0]; row 1: A's step 1 -> 1 at column 4; row 2: B -> -1, -1
    assert batch.advantages.tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, -1, -1, 0]]


def test_real_training_steps_on_the_chain_task_train_on_every_turn(tmp_path, monkeypatch):
    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.cli.train_command import run

    batches = []  # every backend batch the real backend builds (the method itself runs unchanged)
    build = TorchBackend.transform_to_backend_batch
    monkeypatch.setattr(
        TorchBackend, "transform_to_backend_batch", lambda self, s: batches.append(build(self, s)) or batches[-1]
    )

    config = make_config(
        tmp_path,
        "task.name=chain",
        *TINY_VALIDATED,
    )
    trainer = run(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "actor/loss" in r]
    assert len(train_rows) == 2 and all(r["actor/rollout_logprob_abs_diff"] < 1e-4 for r in train_rows)
    assert len(batches) == 2
    for row, batch in zip(train_rows, batches, strict=True):  # 8 prompts x 4 rollouts a step
        turns_per_trajectory = torch.bincount(batch.row_index, minlength=32)
        assert turns_per_trajectory.sum() == round(row["batch/turns"] * 32)  # every turn played is a row
        assert int(turns_per_trajectory.min()) >= 1 and int(turns_per_trajectory.max()) == 2
        assert bool((batch.response_mask.sum(-1) > 0).all())  # and every row has trained tokens
    assert "val/chain/pass@1" in trainer.val_history[-1][1]
    assert torch.isfinite(torch.tensor([r["actor/loss"] for r in train_rows])).all()

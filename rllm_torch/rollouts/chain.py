"""``task=chain``, the multi-turn task: an arithmetic chain in which each turn adds a number to
the policy's own previous answer, with feedback from the environment between turns
(:func:`chain_task` builds the data, :class:`ArithmeticChainWorkflow` runs an episode).

Turn 1 asks ``"a+b="``. The environment replies ``"!"`` (right) or ``"?"`` (wrong) and the next
question, built on the answer the policy gave: after ``"3+4="`` → ``"7"``, turn 2's prompt is the
conversation so far, ``"3+4=7!7+2="``. Each turn is one :class:`~rllm_torch.rllm.types.Step` with its
own prompt, response and response mask; the trajectory reward is the share of correct turns,
and the episode is correct when every turn is. An answer that is not a number ends the episode.
"""

from __future__ import annotations

import random
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.rollouts.task import EnvironmentLatency, Task, exact_match_reward, seeded_splits
from rllm_torch.trainer.workflow import RolloutEngine, Workflow

__all__ = ["chain_problems", "chain_task", "ArithmeticChainWorkflow", "FEEDBACK"]


def chain_problems(count: int, *, turns: int, max_sum: int, seed: int, data_source: str = "chain") -> list[dict]:
    """``count`` chains of ``turns + 1`` non-negative terms whose total is at most ``max_sum``, drawn
    uniformly (with replacement) from every such tuple by ``random.Random(seed)``.

    Raises:
        ConfigError: ``turns < 1``, ``max_sum`` not in ``[0, 9]`` (answers are one digit) or ``count < 0``.

    Examples:
        >>> chain_problems(1, turns=2, max_sum=9, seed=0)
        [{'prompt': '8+0=', 'answer': '8', 'terms': [8, 0, 0], 'data_source': 'chain'}]
    """
    if turns < 1 or not 0 <= max_sum <= 9 or count < 0:
        raise ConfigError(
            f"chain task: turns must be >= 1, max_sum in [0, 9] and size >= 0, got turns={turns}, max_sum={max_sum}, size={count}."
        )
    tuples: list[list[int]] = [[]]
    for _ in range(turns + 1):
        tuples = [t + [x] for t in tuples for x in range(max_sum + 1 - sum(t))]
    rng = random.Random(seed)
    chosen = (rng.choice(tuples) for _ in range(count))
    return [
        {"prompt": f"{t[0]}+{t[1]}=", "answer": str(t[0] + t[1]), "terms": t, "data_source": data_source}
        for t in chosen
    ]


def chain_task(task_config: Any) -> Task:
    """Train and validation chains from ``task_config.{train_size, val_size, max_sum, turns, seed}``
    (validation uses ``seed + 1``); ``env_latency_ms``: each environment reply's wait.

    Raises:
        ConfigError: see :func:`chain_problems` and :class:`~rllm_torch.rollouts.task.EnvironmentLatency`.
    """
    EnvironmentLatency(task_config.env_latency_ms)  # checked at start-up
    train, val = seeded_splits(chain_problems, task_config, turns=task_config.turns, max_sum=task_config.max_sum)
    return Task(
        name="chain",
        train=train,
        val=val,
        reward_fn=exact_match_reward,
        alphabet="0123456789+=!?",
        workflow=ArithmeticChainWorkflow,
        workflow_args={"env_latency_ms": list(task_config.env_latency_ms)},
        max_new_tokens=2,  # per turn; the answers are not what a turn writes
    )


FEEDBACK = {True: "!", False: "?"}
"""What the environment says after a turn: ``"!"`` for a right answer, ``"?"`` for a wrong one."""


class ArithmeticChainWorkflow(Workflow):
    """Several turns of ``previous answer + next term``.

    A task is a dict with ``"terms"``: ``[a, b, c, ...]`` (ints, at least two), ``"prompt"``
    (``"a+b="``) and ``"data_source"``. Turn ``k >= 2`` asks ``f"{answer_{k-1}}+{terms[k]}="``,
    whose right answer is ``int(answer_{k-1}) + terms[k]`` (a wrong earlier answer is carried,
    not corrected: the policy is scored on the question it was asked).

    Args:
        rollout_engine: where completions come from.
        role: the trajectory name (the group role).
        env_latency_ms: ``[low, high]``: the environment's reply after each turn but the last
            waits a uniform time in it (:class:`~rllm_torch.rollouts.task.EnvironmentLatency`).
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        role: str = "solver",
        env_latency_ms: tuple[float, float] = (0, 0),
        **kwargs: Any,
    ) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.role, self.latency = role, EnvironmentLatency(env_latency_ms)

    async def run(self, task: dict, uid: str) -> Episode:
        terms = [int(t) for t in task["terms"]]
        conversation, previous, steps, correct = "", terms[0], [], []
        reason = TerminationReason.ENV_DONE
        for term in terms[1:]:
            prompt = f"{conversation}{previous}+{term}=" if conversation else task["prompt"]
            output = await self.rollout_engine.generate(prompt)
            answer = output.text.strip()
            right = answer == str(previous + term)
            correct.append(right)
            steps.append(output.to_step(float(right) / (len(terms) - 1), observation=prompt))
            if output.finish_reason != "stop":
                reason = TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
            if not answer.isdigit():
                break
            if len(steps) < len(terms) - 1:
                await self.latency.wait()  # the environment's reply: a tool call's latency
            conversation, previous = f"{prompt}{answer}{FEEDBACK[right]}", int(answer)
        steps[-1].done = True
        reward = sum(correct) / (len(terms) - 1)
        return Episode(
            trajectories=[Trajectory(name=self.role, steps=steps, reward=reward)],
            is_correct=len(correct) == len(terms) - 1 and all(correct),
            termination_reason=reason,
            metrics={"reward": reward, "turns": float(len(steps)), "first_turn_correct": float(correct[0])},
            info={"data_source": task.get("data_source", "chain")},
        )

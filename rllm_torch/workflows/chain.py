"""A multi-turn workflow: an arithmetic chain in which each turn adds a number to the policy's
own previous answer, with feedback from the environment between turns.

Turn 1 asks ``"a+b="``. The environment replies ``"!"`` (right) or ``"?"`` (wrong) and the next
question, built on the answer the policy gave: after ``"3+4="`` → ``"7"``, turn 2's prompt is the
conversation so far, ``"3+4=7!7+2="``. Each turn is one :class:`~rllm_torch.rllm.types.Step` with its
own prompt, response and response mask; the trajectory reward is the share of correct turns,
and the episode is correct when every turn is. An answer that is not a number ends the episode.
"""

from __future__ import annotations

from typing import Any

from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.workflows.base import Workflow
from rllm_torch.workflows.rollout import RolloutEngine

__all__ = ["ArithmeticChainWorkflow", "FEEDBACK"]

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
    """

    def __init__(self, rollout_engine: RolloutEngine, role: str = "solver", **kwargs: Any) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.role = role

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
            steps.append(output.to_step(float(right), observation=prompt))
            if output.finish_reason != "stop":
                reason = TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
            if not answer.isdigit():
                break
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

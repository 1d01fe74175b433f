"""``task=distill``: a workflow that writes per-token advantages, on-policy distillation from a
fixed teacher (:class:`DistillationWorkflow`), on the arithmetic problems (:func:`distill_task`),
alone or mixed with an RL role. Needs ``rllm.algorithm.use_precomputed_advantage=true``.

The policy (student) samples a response; a fixed teacher scores every sampled token, and the
step's advantage at token ``t`` is the negative per-token reverse KL estimate

    A_t = log p_teacher(y_t | x, y_<t) - log p_student(y_t | x, y_<t)

(the student's log-probs are the sampling log-probs of the rollout). Trained with
``rllm.algorithm.use_precomputed_advantage=true`` these advantages reach the loss unchanged;
with ``importance_sampling`` or ``ppo`` the update lowers ``KL(student ‖ teacher)``.
Source: on-policy distillation, Agarwal et al. 2024 (GKD), arXiv:2306.13649; tinker-cookbook's
on-policy distillation recipe (per-token reverse-KL advantages).

With ``mix_rl`` each episode also samples an RL trajectory of another role (no advantage
written: the estimator computes it from the reward), so one batch mixes both modes.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.rollouts.arithmetic import arithmetic_problems
from rllm_torch.rollouts.single_turn import RewardFn
from rllm_torch.rollouts.task import Task, exact_match_reward, seeded_splits
from rllm_torch.trainer.workflow import RolloutEngine, Workflow

__all__ = ["distill_task", "AnswerTeacher", "DistillationWorkflow"]


def distill_task(task_config: Any) -> Task:
    """The arithmetic splits of ``task_config`` run by :class:`DistillationWorkflow` with an
    :class:`AnswerTeacher` of confidence 0.9; ``task_config.mix_rl`` adds the RL ``solver`` role."""
    train, val = seeded_splits(arithmetic_problems, task_config, max_sum=task_config.max_sum)
    args = {
        "teacher": AnswerTeacher(0.9),
        "reward_fn": exact_match_reward,
        "mix_rl": bool(task_config.mix_rl),
    }
    return Task(
        name="distill",
        train=train,
        val=val,
        reward_fn=exact_match_reward,
        alphabet="0123456789+=",
        workflow=DistillationWorkflow,
        workflow_args=args,
        precomputed_advantage=True,
        max_new_tokens=2,  # the answer and its end token, as the teacher's demonstrations
    )


class AnswerTeacher:
    """A fixed teacher that knows each task's answer: it gives the next token of
    ``answer + <eos>`` probability ``confidence`` and spreads the rest evenly over the other
    ``V - 1`` tokens of the vocabulary (a stand-in for a frozen reference model).

    Raises:
        ConfigError: ``confidence`` outside ``(0, 1)``.

    Examples:
        >>> from rllm_torch.backends.torch_backend import build_char_tokenizer
        >>> tok = build_char_tokenizer("0123456789+=")  # V = 14: "7" is id 9, <eos> id 0
        >>> [round(x, 4) for x in AnswerTeacher(0.9)({"answer": "7"}, [9, 0], tok)]  # log 0.9, log 0.9
        [-0.1054, -0.1054]
        >>> round(AnswerTeacher(0.9)({"answer": "7"}, [8], tok)[0], 4)  # log(0.1 / 13)
        -4.8675
    """

    def __init__(self, confidence: float = 0.9) -> None:
        if not 0.0 < confidence < 1.0:
            raise ConfigError(f"AnswerTeacher: confidence must be in (0, 1), got {confidence!r}.")
        self.confidence = confidence

    def __call__(self, task: dict, response_ids: list[int], tokenizer: Any) -> list[float]:
        target = tokenizer(str(task["answer"]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        other = math.log((1.0 - self.confidence) / (len(tokenizer) - 1))
        return [
            math.log(self.confidence) if t < len(target) and token == target[t] else other
            for t, token in enumerate(response_ids)
        ]


class DistillationWorkflow(Workflow):
    """Prompt → one completion, with per-token advantages from ``teacher`` (see the module).

    Args:
        rollout_engine: where completions come from; must have a ``tokenizer`` (the teacher's).
        teacher: ``teacher(task, response_ids, tokenizer) -> log-probs``, one per response token.
        reward_fn: scores the text (for metrics and correctness; the RL role trains on it).
        mix_rl: also sample one RL trajectory of role ``rl_role`` per episode.
        role, rl_role: the trajectory names (group roles) of the two kinds.
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        teacher: Any,
        reward_fn: RewardFn,
        mix_rl: bool = False,
        role: str = "distill",
        rl_role: str = "solver",
        **kwargs: Any,
    ) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.teacher, self.reward_fn, self.mix_rl, self.role, self.rl_role = teacher, reward_fn, mix_rl, role, rl_role

    async def run(self, task: dict, uid: str) -> Episode:
        outputs = await asyncio.gather(
            *(self.rollout_engine.generate(task["prompt"]) for _ in range(2 if self.mix_rl else 1))
        )
        rewards = [await self.call_reward(self.reward_fn, task, o.text, uid=uid) for o in outputs]
        distilled = outputs[0].to_step(float(rewards[0]), done=True)
        teacher_logp = self.teacher(task, outputs[0].response_ids, self.rollout_engine.tokenizer)
        distilled.advantage = [t - s for t, s in zip(teacher_logp, outputs[0].logprobs, strict=True)]
        trajectories = [Trajectory(name=self.role, steps=[distilled], reward=float(rewards[0]))]
        if self.mix_rl:
            trajectories.append(
                Trajectory(
                    name=self.rl_role,
                    steps=[outputs[1].to_step(float(rewards[1]), done=True)],
                    reward=float(rewards[1]),
                )
            )
        reason = (
            TerminationReason.ENV_DONE
            if outputs[0].finish_reason == "stop"
            else TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
        )
        return Episode(
            trajectories=trajectories,
            is_correct=rewards[0] >= 1.0,
            termination_reason=reason,
            metrics={"reward": float(rewards[0])},
            info={"data_source": task.get("data_source", "unknown")},
        )

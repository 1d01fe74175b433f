"""``task=guess``, the multi-turn task whose length the policy decides: guess a secret number
with higher/lower feedback; the episode ends at the right guess (or at ``max_turns``, or at an
answer that is not a number), so how many turns it takes is the policy's doing
(:func:`guess_task` builds the data, :class:`GuessNumberWorkflow` runs an episode).

Each wrong guess before the last turn costs ``turn_cost``; the last turn earns 1 when it is
right, and an answer that is not a number forfeits the turns left (it earns ``-turn_cost`` for
each, so quitting is never cheaper than guessing). The trajectory reward is their sum: ``1 -
turn_cost * (turns - 1)`` for a secret found at turn ``turns``, ``-turn_cost * (max_turns - 1)``
otherwise; every step's ``reward`` is its own turn's (so the turn modes of ``rllm.stepwise_advantage.mode`` see
the per-turn costs and broadcast sees their sum, the same objective). A step's
``observation`` is the conversation it answered: members of a group that asked the same
guesses share it (GiGPO's step groups).

Two styles: ``symbols`` for the tiny character model (``"?"``; after a guess, ``"<"`` means the
number is smaller, ``">"`` larger: ``"?5<2>"``), ``words`` for a pretrained chat model
(``"I am thinking of a whole number from 0 to 9. Guess it: answer with the number only."``,
then ``"5 is too high."`` ...).
"""

from __future__ import annotations

import functools
import math
import random
import re
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.rollouts.task import EnvironmentLatency, Task, seeded_splits
from rllm_torch.trainer.workflow import RolloutEngine, Workflow

__all__ = ["guess_problems", "guess_task", "guess_reward", "parse_guess", "GuessNumberWorkflow", "STYLES"]

STYLES = ("symbols", "words")
_NUMBER = re.compile(r"(?<![0-9])[0-9]{1,9}(?![0-9])", re.ASCII)


def _first_prompt(style: str, max_number: int) -> str:
    if style == "symbols":
        return "?"
    return f"I am thinking of a whole number from 0 to {max_number}. Guess it: answer with the number only."


def _feedback(style: str, guess: int, secret: int) -> str:
    if style == "symbols":
        return f"{guess}{'<' if secret < guess else '>'}"
    return f" {guess} is too {'high' if secret < guess else 'low'}. Guess again: answer with the number only."


def parse_guess(text: str, style: str = "symbols") -> int | None:
    """The number a response guesses, or None: ``symbols``, the whole response stripped when it
    is 1-9 ASCII digits (``"7"``); ``words``, the first whole number in it (``"My guess is 7."``;
    a response that lists numbers guesses the first).

    Examples:
        >>> parse_guess(" 7"), parse_guess("7."), parse_guess("I say 5, or 6", "words"), parse_guess("no", "words")
        (7, None, 5, None)
    """
    found = re.fullmatch(r"[0-9]{1,9}", text.strip()) if style == "symbols" else _NUMBER.search(text)
    return int(found.group(0)) if found else None


def guess_reward(task: dict, response: str, style: str = "symbols") -> float:
    """1.0 when ``response`` guesses ``task["secret"]`` (:func:`parse_guess`), else 0.0."""
    return 1.0 if parse_guess(response, style) == int(task["secret"]) else 0.0


def _alphabet(style: str, max_number: int) -> str:
    text = _first_prompt(style, max_number) + _feedback(style, 1, 0) + _feedback(style, 1, 2) + "0123456789"
    return "".join(sorted(set(text)))


def guess_problems(count: int, *, max_number: int, style: str, seed: int, data_source: str = "guess") -> list[dict]:
    """``count`` secrets drawn uniformly from ``0..max_number`` by ``random.Random(seed)``.

    Raises:
        ConfigError: ``style`` unknown, ``max_number`` outside ``[1, 9]`` (symbols: one-digit
            answers) or ``[1, 99]`` (words), or ``count < 0``.

    Examples:
        >>> guess_problems(2, max_number=9, style="symbols", seed=0)
        [{'prompt': '?', 'answer': '6', 'secret': 6, 'data_source': 'guess'}, {'prompt': '?', 'answer': '6', 'secret': 6, 'data_source': 'guess'}]
    """
    if style not in STYLES:
        raise ConfigError(f"task.style must be one of {STYLES}, got {style!r}.")
    top = 9 if style == "symbols" else 99
    if not 1 <= max_number <= top or count < 0:
        raise ConfigError(
            f"guess task: task.max_number must be in [1, {top}] for style={style!r} and size >= 0, got max_number={max_number}, size={count}."
        )
    rng = random.Random(seed)
    secrets = [rng.randint(0, max_number) for _ in range(count)]
    prompt = _first_prompt(style, max_number)
    return [{"prompt": prompt, "answer": str(s), "secret": s, "data_source": data_source} for s in secrets]


def guess_task(task_config: Any) -> Task:
    """Train and validation secrets from ``task_config.{train_size, val_size, max_number, max_turns,
    turn_cost, style, seed}`` (validation uses ``seed + 1``).

    Raises:
        ConfigError: see :func:`guess_problems`; ``max_turns < 1``, ``turn_cost`` negative.
    """
    EnvironmentLatency(task_config.env_latency_ms)  # checked at start-up
    if task_config.max_turns < 1 or not 0 <= task_config.turn_cost * task_config.max_turns < math.inf:
        raise ConfigError(
            f"guess task: task.max_turns must be >= 1 and task.turn_cost >= 0 (finite over max_turns turns), got {task_config.max_turns} and {task_config.turn_cost}."
        )
    train, val = seeded_splits(guess_problems, task_config, max_number=task_config.max_number, style=task_config.style)
    return Task(
        name="guess",
        train=train,
        val=val,
        reward_fn=functools.partial(guess_reward, style=task_config.style),
        alphabet=_alphabet(task_config.style, task_config.max_number),
        workflow=GuessNumberWorkflow,
        workflow_args={
            "env_latency_ms": list(task_config.env_latency_ms),
            "max_turns": task_config.max_turns,
            "turn_cost": task_config.turn_cost,
            "style": task_config.style,
        },
        max_new_tokens=2,  # per turn; the answers are not what a turn writes
    )


class GuessNumberWorkflow(Workflow):
    """Guesses until the right one, ``max_turns`` or an answer that is not a number.

    A task is a dict with ``"secret"`` (int), ``"prompt"`` (the first question) and
    ``"data_source"``.

    Args:
        rollout_engine: where completions come from.
        max_turns: the most guesses.
        turn_cost: the reward of each turn before the last (negated).
        style: ``"symbols"`` or ``"words"`` (the feedback's form).
        role: the trajectory name (the group role).
        env_latency_ms: ``[low, high]``: each feedback waits a uniform time in it
            (:class:`~rllm_torch.rollouts.task.EnvironmentLatency`).
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        max_turns: int = 4,
        turn_cost: float = 0.1,
        style: str = "symbols",
        role: str = "guesser",
        env_latency_ms: tuple[float, float] = (0, 0),
        **kwargs: Any,
    ) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.max_turns, self.turn_cost, self.style, self.role = max_turns, turn_cost, style, role
        self.latency = EnvironmentLatency(env_latency_ms)

    async def run(self, task: dict, uid: str) -> Episode:
        secret, conversation = int(task["secret"]), task["prompt"]
        steps, found, guess = [], False, None
        reason = TerminationReason.MAX_TURNS_EXCEEDED
        for turn in range(self.max_turns):
            output = await self.rollout_engine.generate(conversation)
            guess = parse_guess(output.text, self.style)
            found = guess == secret
            last = found or guess is None or turn == self.max_turns - 1
            # the last turn: 1 if right; an answer that is not a number forfeits the turns left
            final = 1.0 if found else -self.turn_cost * (self.max_turns - 1 - turn)
            steps.append(output.to_step(final if last else -self.turn_cost, observation=conversation))
            if output.finish_reason != "stop":
                reason = TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
            elif found or guess is None:
                reason = TerminationReason.ENV_DONE
            if last:
                break
            await self.latency.wait()  # the environment's reply: a tool call's latency
            conversation += _feedback(self.style, guess, secret)
        steps[-1].done = True
        reward = sum(step.reward for step in steps)
        return Episode(
            trajectories=[Trajectory(name=self.role, steps=steps, reward=reward)],
            is_correct=found,
            termination_reason=reason,
            metrics={"reward": reward, "turns": float(len(steps)), "found": float(found)},
            info={"data_source": task.get("data_source", "guess")},
        )

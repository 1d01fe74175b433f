"""``task=reasoning_gym``: procedurally generated problems of the ``reasoning-gym`` library
(https://github.com/open-thought/reasoning-gym) and their own scorers, through the task interface.

Optional: ``pip install 'rllm_torch[reasoning-gym]'``. Each row is a dataset entry (``question``,
``answer``, ``metadata``) plus ``prompt`` (the question) and ``data_source``
(``reasoning_gym/<name>``); the reward is the dataset's ``score_answer(response, entry)``, which
may give partial credit (e.g. ``len(answer) / len(response)`` when the answer is contained).
"""

from __future__ import annotations

from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.task import Task, alphabet_of

__all__ = ["reasoning_gym_rows", "ReasoningGymScorer", "reasoning_gym_task"]

_INSTALL = "pip install 'rllm_torch[reasoning-gym]'"


def _create(name: str, size: int, seed: int, config: dict) -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigError(f"task.name=reasoning_gym needs the reasoning-gym package: {_INSTALL}.") from exc
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except ValueError as exc:  # an unknown name, or a bad option of the dataset
        raise ConfigError(
            f"task.dataset={name!r}: reasoning_gym refused it ({exc}); see reasoning_gym.factory.DATASETS for the names."
        ) from exc


def reasoning_gym_rows(name: str, *, size: int, seed: int, **config: Any) -> list[dict]:
    """``size`` task dicts of the reasoning-gym dataset ``name`` (``seed`` fixes them; ``config``
    goes to the dataset, e.g. ``min_animals=2``).

    Raises:
        ConfigError: reasoning-gym is not installed, or refuses ``name`` or ``config``.
    """
    dataset = _create(name, size, seed, config)
    return [
        {**entry, "prompt": entry["question"], "answer": str(entry["answer"]), "data_source": f"reasoning_gym/{name}"}
        for entry in dataset
    ]


class ReasoningGymScorer:
    """``reward_fn(task, response)``: the named dataset's ``score_answer`` on the stripped response
    (a float in ``[0, 1]``; 1.0 counts as correct). Scoring reads only the entry, not the seed."""

    def __init__(self, name: str) -> None:
        self.name, self._dataset = name, _create(name, 1, 0, {})

    def __call__(self, task: dict, response: str) -> float:
        return float(self._dataset.score_answer(response.strip(), entry=task))


def reasoning_gym_task(task_config: Any) -> Task:
    """``task_config.dataset`` with ``train_size`` / ``val_size`` rows (seeds ``seed`` and ``seed + 1``).

    Prompts are the library's full questions (often hundreds of characters): give the model room
    (``model.max_positions``) or a pretrained model and tokenizer (``model.path``).
    """
    name = task_config.dataset
    train = reasoning_gym_rows(name, size=task_config.train_size, seed=task_config.seed)
    val = reasoning_gym_rows(name, size=task_config.val_size, seed=task_config.seed + 1)
    return Task(
        name=f"reasoning_gym/{name}",
        train=train,
        val=val,
        reward_fn=ReasoningGymScorer(name),
        alphabet=alphabet_of(train, val),
    )

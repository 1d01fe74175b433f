"""What a run takes from its tasks when it is not told: the response length
(``rllm.rollout.max_new_tokens``, :func:`response_length`) and the character tokenizer's alphabet
(:func:`task_alphabet`), each said in the start-up summary with where it came from; the check that
every character of the tasks is one the character tokenizer knows (:func:`check_alphabet`); and
the one warning of a run whose first steps end at the length limit and score nothing
(:class:`LengthLimitWatch`).

=============================  ==============================================================
setting left unset             taken from
=============================  ==============================================================
``rllm.rollout.max_new_tokens``  the task's own length (the multi-turn tasks: 2 per turn), else
                                 :data:`ANSWER_MARGIN` x the longest answer's tokens (the
                                 answer, its end token and as much room again), else 2
the alphabet (no ``model.path``  every character of the prompts and answers, sorted
tokenizer, no ``alphabet``)
=============================  ==============================================================

The default task's answers are one digit: twice one token is the 2 it always had. A custom reward
may give credit for part of an answer, so the length is not checked against the answers (the
exact-match reward's is, :func:`~rllm_torch.backends.torch_backend.setup_checks.check_prompts`);
the watch says it when the length is what keeps the reward at 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from rllm_torch.core.errors import ConfigError

__all__ = [
    "ANSWER_MARGIN",
    "DEFAULT_ALPHABET",
    "ResponseLength",
    "response_length",
    "task_alphabet",
    "choose_alphabet",
    "check_alphabet",
    "LengthLimitWatch",
]

#: The response length a run takes from its tasks: this many times the longest answer's tokens.
ANSWER_MARGIN = 2
#: The alphabet of a character tokenizer built with no tasks to read (the default arithmetic task's).
DEFAULT_ALPHABET = "0123456789+="
_NO_ANSWERS_LENGTH = 2  # tasks without answers, and no setting: the length runs always had


@dataclass(frozen=True)
class ResponseLength:
    """The response length of a run and where it came from.

    Attributes:
        tokens: the most tokens of a response.
        source: the start-up summary's words for where ``tokens`` came from.
        longest_answer: the longest answer and its tokens (None: no task has an answer).
    """

    tokens: int
    source: str
    longest_answer: tuple[str, int] | None


def _longest_answer(tokenizer: PreTrainedTokenizerBase, tasks: Sequence[dict]) -> tuple[str, int] | None:
    answers = [str(t["answer"]) for t in tasks if isinstance(t, dict) and t.get("answer") is not None]
    if not answers:
        return None
    lengths = [len(ids) for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]]
    longest = max(range(len(answers)), key=lengths.__getitem__)
    return answers[longest], lengths[longest]


def response_length(
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[dict],
    *,
    given: int | None,
    task_length: int | None = None,
    task_name: str = "",
) -> ResponseLength:
    """The run's ``rllm.rollout.max_new_tokens``: ``given`` when set, else ``task_length`` (a task's
    own), else :data:`ANSWER_MARGIN` x the longest answer's tokens (as ``tokenizer`` counts them),
    else 2.

    Examples:
        >>> from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer
        >>> tok = build_char_tokenizer("abcd=")
        >>> response_length(tok, [{"prompt": "abcd=", "answer": "dcba"}], given=None).source
        "twice the longest answer's tokens ('dcba': 4)"
    """
    longest = _longest_answer(tokenizer, tasks)
    if given is not None:
        return ResponseLength(given, f"rllm.rollout.max_new_tokens={given}", longest)
    if task_length is not None:
        return ResponseLength(task_length, f"task {task_name}'s own length", longest)
    if longest is None or longest[1] == 0:
        return ResponseLength(_NO_ANSWERS_LENGTH, "no answers to measure", longest)
    times = "twice" if ANSWER_MARGIN == 2 else f"{ANSWER_MARGIN} x"
    return ResponseLength(
        ANSWER_MARGIN * longest[1], f"{times} the longest answer's tokens ({longest[0]!r}: {longest[1]})", longest
    )


def task_alphabet(tasks: Sequence[dict]) -> str:
    """The sorted distinct characters of every task's ``prompt`` and ``answer`` ("" for none).

    Examples:
        >>> task_alphabet([{"prompt": "abc=", "answer": "cba"}, {"prompt": "b="}])
        '=abc'
    """
    text = (f"{t.get('prompt', '')}{t.get('answer', '')}" for t in tasks if isinstance(t, dict))
    return "".join(sorted({ch for row in text for ch in row}))


def choose_alphabet(alphabet: str | None, tasks: Sequence[dict]) -> tuple[str, str]:
    """``(alphabet, where it came from)``: ``alphabet`` when given, else :func:`task_alphabet` of
    ``tasks``, else :data:`DEFAULT_ALPHABET` (no task to read).

    Examples:
        >>> choose_alphabet(None, [{"prompt": "ab=", "answer": "ba"}])
        ('=ab', "every character of the tasks' prompts and answers")
    """
    own = task_alphabet(tasks)
    if alphabet is None and not own:
        return DEFAULT_ALPHABET, "no task text to read: the digits, + and ="
    if alphabet is None or set(alphabet) == set(own):
        return alphabet or own, "every character of the tasks' prompts and answers"
    return alphabet, "the alphabet given to the backend"


def check_alphabet(tasks: Sequence[dict], tokenizer: PreTrainedTokenizerBase, *, given: bool) -> None:
    """Every character of the tasks' prompts and answers is a token of the character tokenizer
    (one it does not know would be read and written as ``<unk>``: the policy could never answer).

    Args:
        tasks: the training and validation tasks.
        tokenizer: the character tokenizer.
        given: its alphabet was given (``backend_args={"alphabet": ...}``), not read from ``tasks``.

    Raises:
        ConfigError: naming the characters, a task that has them, and the setting.
    """
    vocabulary = tokenizer.get_vocab()
    missing: dict[str, str] = {}
    for task in tasks:
        if not isinstance(task, dict):
            continue
        for key in ("prompt", "answer"):
            for ch in str(task.get(key, "")):
                if ch not in vocabulary:
                    missing.setdefault(ch, f"the {key} {str(task[key])!r}")
    if not missing:
        return
    shown = ", ".join(repr(ch) for ch in sorted(missing)[:20]) + (", ..." if len(missing) > 20 else "")
    fix = (
        "add them to backend_args={'alphabet': ...}, or leave the alphabet out: it is then every character of the "
        "tasks' prompts and answers"
        if given
        else "give the trainer every task it will see (training and validation), so the alphabet holds their characters"
    )
    raise ConfigError(
        f"the character tokenizer has no token for {shown} (first in {next(iter(missing.values()))}); they would be "
        f"read and written as {tokenizer.unk_token!r}: {fix}."
    )


class LengthLimitWatch:
    """Watches the first :attr:`steps` training batches of episodes and warns once when half or more of
    their responses ended at ``rllm.rollout.max_new_tokens``, none of those was correct, and the
    length is what keeps them from it: the longest answer has more tokens than the limit, or (tasks
    without answers) every reward was 0. Otherwise, when no response of those batches scored at
    all, it warns once that nothing trains (the reward, not the length, is then the question).

    Args:
        max_new_tokens: the run's response length.
        longest_answer: the longest answer and its tokens, or None.
        steps: how many training batches to watch.
    """

    def __init__(self, max_new_tokens: int, longest_answer: tuple[str, int] | None, *, steps: int = 4) -> None:
        self.max_new_tokens, self.longest_answer, self.steps = max_new_tokens, longest_answer, steps
        self.seen = self.episodes = self.cut = self.cut_correct = self.rewarded = 0

    def observe(self, episodes: Sequence[Any]) -> str | None:
        """Count one training batch; after the last watched one, the warning (also given with
        :func:`warnings.warn`) when its case holds, else None."""
        if self.seen >= self.steps:
            return None
        self.seen += 1
        for episode in episodes:
            self.episodes += 1
            cut = getattr(episode.termination_reason, "value", None) == "max_response_length_exceeded"
            self.cut += cut
            self.cut_correct += cut and bool(episode.is_correct)
            self.rewarded += any((t.reward or 0) != 0 for t in episode.trajectories)
        if self.seen < self.steps or not self.episodes:
            return None
        share = self.cut / self.episodes
        too_long = self.longest_answer is not None and self.longest_answer[1] > self.max_new_tokens
        unknown = self.longest_answer is None and self.rewarded == 0  # no answers to measure, no reward at all
        if share < 0.5 or self.cut_correct or not (too_long or unknown):
            return self._no_reward()
        why = (
            f"the longest answer ({self.longest_answer[0]!r}) has {self.longest_answer[1]} tokens"
            if too_long
            else "every reward was 0"
        )
        message = (
            f"rllm.rollout.max_new_tokens={self.max_new_tokens}: {share:.0%} of the responses of the first {self.steps} "
            f"steps ended at this limit, none of them correct, and {why}; raise rllm.rollout.max_new_tokens (unset, it is "
            f"{'twice' if ANSWER_MARGIN == 2 else f'{ANSWER_MARGIN} x'} the longest answer's tokens)"
        )
        warnings.warn(message, UserWarning, stacklevel=2)
        return message

    def _no_reward(self) -> str | None:
        """The warning when no response of the watched batches scored, the length not being the cause."""
        if self.rewarded:
            return None
        message = (
            f"every reward of the first {self.steps} training steps was 0 ({self.episodes} responses): a group whose "
            "rewards are all equal has no advantage, so nothing trains until some response scores. Check "
            "task.reward_fn on a known answer; an exact-match reward on answers the policy cannot write yet gives "
            "no signal, a partial-credit one does (docs/training.md)."
        )
        warnings.warn(message, UserWarning, stacklevel=3)
        return message

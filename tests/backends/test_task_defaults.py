"""What a run takes from its tasks when it is not told (the response length, the character
tokenizer's alphabet), said in the start-up summary; a character the tokenizer does not know
stops the run at start-up; and the one warning of a run whose first steps end at the length limit
and score nothing."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.backends.torch_backend.task_defaults import LengthLimitWatch, check_alphabet, response_length
from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import TerminationReason

WORDS = [{"prompt": "abcd=", "answer": "dcba"}, {"prompt": "ab=", "answer": "ba"}]
TOKENIZER = build_char_tokenizer("=abcd")


def test_the_length_is_the_setting_else_the_tasks_own_else_twice_the_longest_answer_else_two():
    assert response_length(TOKENIZER, WORDS, given=3, task_length=5).tokens == 3
    assert (
        response_length(TOKENIZER, WORDS, given=None, task_length=5, task_name="chain").source
        == "task chain's own length"
    )
    derived = response_length(TOKENIZER, WORDS, given=None)
    assert (derived.tokens, derived.longest_answer) == (8, ("dcba", 4))
    assert response_length(TOKENIZER, [{"prompt": "ab="}], given=None).tokens == 2  # no answer to measure


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A BPE tokenizer whose merges make runs of 'a' cheap: 'aaaa' is one token, 'b' and 'c' one each."""
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "aa": 4, "aaaa": 5}
    merges = [("a", "a"), ("aa", "aa")]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab, merges, unk_token="<unk>")))


@pytest.mark.parametrize("answers", [["aaaaaaaa", "abc"], ["abc", "aaaaaaaa"]])
def test_the_longest_answer_is_the_one_with_the_most_tokens_not_the_most_characters(answers):
    tokenizer = bpe_tokenizer()
    # 'aaaaaaaa' is 8 characters but 2 tokens (aaaa aaaa); 'abc' is 3 characters and 3 tokens (a b c)
    assert [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in ("aaaaaaaa", "abc")] == [2, 3]
    derived = response_length(tokenizer, [{"prompt": "x", "answer": a} for a in answers], given=None)
    assert derived.longest_answer == ("abc", 3)
    assert derived.tokens == 6  # twice 3
    assert derived.source == "twice the longest answer's tokens ('abc': 3)"


def test_a_character_only_an_answer_has_is_refused_like_one_in_a_prompt():
    tokenizer = build_char_tokenizer("=ab")
    tasks = [{"prompt": "ab=", "answer": "ba"}, {"prompt": "ba=", "answer": "abz"}]  # 'z' only in an answer
    with pytest.raises(ConfigError, match=r"no token for 'z' \(first in the answer 'abz'\)"):
        check_alphabet(tasks, tokenizer, given=True)
    check_alphabet(tasks[:1], tokenizer, given=True)  # every character known: no error


def backend(tmp_path, tasks, **kwargs) -> tuple[TorchBackend, object]:
    config = OmegaConf.create({"model": {"hidden_size": 32}, "rllm": {"trainer": {"default_local_dir": str(tmp_path)}}})
    from rllm_torch.trainer.schema import typed_run_config

    config = typed_run_config(config)
    return TorchBackend(config, tasks=tasks, **kwargs), config


def test_the_backend_reads_its_alphabet_and_length_from_the_tasks_and_says_where_they_came_from(tmp_path):
    tasks = [{"prompt": "hello=", "answer": "olleh"}, {"prompt": "Zürich?", "answer": "yes"}]
    built, config = backend(tmp_path, tasks)
    assert built.tokenizer.unk_token_id not in built.tokenizer("Zürich?hello=")["input_ids"]
    assert set(built.alphabet) == set("hello=olehZürich?yes")
    assert built.alphabet_source == "every character of the tasks' prompts and answers"
    assert config.rllm.rollout.max_new_tokens == built.config.rllm.rollout.max_new_tokens == 10  # 2 x "olleh"
    rows = dict(built.summary_rows())
    assert rows["responses"] == (
        "at most 10 tokens (twice the longest answer's tokens ('olleh': 5); rllm.rollout.max_new_tokens sets another)"
    )
    built.validate_prompts(tasks)  # every character known


def test_an_explicit_length_and_alphabet_win(tmp_path):
    tasks = [{"prompt": "12=", "answer": "21"}]
    config = OmegaConf.create({"model": {"hidden_size": 32}, "rllm": {"rollout": {"max_new_tokens": 3}}})
    built = TorchBackend(config, alphabet="0123456789=", tasks=tasks)
    assert built.config.rllm.rollout.max_new_tokens == 3 and built.alphabet == "0123456789="
    assert dict(built.summary_rows())["responses"] == "at most 3 tokens (rllm.rollout.max_new_tokens=3)"


def test_a_prompt_with_characters_the_given_alphabet_lacks_stops_at_start_up_naming_them_and_the_setting(tmp_path):
    tasks = [{"prompt": "3+4=", "answer": "7"}, {"prompt": "ab=", "answer": "ba"}]
    built, _ = backend(tmp_path, tasks, alphabet="0123456789+=")  # the arithmetic alphabet: letters are <unk>
    with pytest.raises(ConfigError) as info:
        built.validate_prompts(tasks)
    message = str(info.value)
    assert "no token for 'a', 'b' (first in the prompt 'ab=')" in message and "'<unk>'" in message
    assert "backend_args={'alphabet': ...}" in message


def episodes(count: int, *, cut: int, correct_cut: int = 0, reward: float = 0.0) -> list:
    """``count`` fake episodes, ``cut`` of them ended at the length limit (``correct_cut`` of those correct)."""
    out = []
    for i in range(count):
        is_cut = i < cut
        reason = TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED if is_cut else TerminationReason.ENV_DONE
        out.append(
            SimpleNamespace(
                termination_reason=reason,
                is_correct=is_cut and i < correct_cut,
                trajectories=[SimpleNamespace(reward=reward)],
            )
        )
    return out


def watch_warnings(watch: LengthLimitWatch, batches: list) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches:
            watch.observe(batch)
    return [str(w.message) for w in caught]


def test_answers_longer_than_the_limit_with_most_responses_cut_and_none_correct_warn_once_naming_the_setting():
    said = watch_warnings(LengthLimitWatch(2, ("dcba", 4)), [episodes(64, cut=52, reward=0.25)] * 10)
    assert said == [
        "rllm.rollout.max_new_tokens=2: 81% of the responses of the first 4 steps ended at this limit, none of them "
        "correct, and the longest answer ('dcba') has 4 tokens; raise rllm.rollout.max_new_tokens (unset, it is twice "
        "the longest answer's tokens)"
    ]


@pytest.mark.parametrize(
    ("limit", "answer", "batch"),
    [
        (2, ("7", 1), episodes(64, cut=58, reward=0.25)),  # the default task: answers fit, some score
        (2, ("dcba", 4), episodes(64, cut=20)),  # most responses stopped
        (2, ("dcba", 4), episodes(64, cut=52, correct_cut=1, reward=1.0)),  # a cut response can be right
    ],
    ids=["answers fit", "few cut", "a cut one correct"],
)
def test_no_length_warning_when_the_length_is_not_what_keeps_the_reward_at_zero(limit, answer, batch):
    said = watch_warnings(LengthLimitWatch(limit, answer), [batch] * 4)
    assert [m for m in said if "max_new_tokens" in m] == []


def test_tasks_without_answers_warn_when_every_response_is_cut_and_every_reward_is_0():
    said = watch_warnings(LengthLimitWatch(4, None), [episodes(16, cut=16)] * 4)
    assert len(said) == 1 and "every reward was 0" in said[0]
    assert watch_warnings(LengthLimitWatch(4, None), [episodes(16, cut=16, reward=0.5)] * 4) == []


def test_no_reward_at_all_in_the_watched_steps_is_said_once_whatever_the_length():
    """Answers that fit, few responses cut, every reward 0 (an exact match the policy never hits):
    nothing trains, and the warning says so once instead of the run going on at reward 0."""
    said = watch_warnings(LengthLimitWatch(6, ("eeb", 3)), [episodes(64, cut=30)] * 10)
    assert said == [
        "every reward of the first 4 training steps was 0 (256 responses): a group whose rewards are all equal has "
        "no advantage, so nothing trains until some response scores. Check task.reward_fn on a known answer; an "
        "exact-match reward on answers the policy cannot write yet gives no signal, a partial-credit one does "
        "(docs/training.md)."
    ]
    assert watch_warnings(LengthLimitWatch(6, ("eeb", 3)), [episodes(64, cut=30, reward=1.0)] * 4) == []

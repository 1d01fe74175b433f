"""Real ``transformers`` tokenizers from ``model.path``: their special tokens, pad and eos, chat
templates, and the start-up errors for a tokenizer without a pad token, a missing chat
template and prompts too long for the model's context."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from trainer_fakes import make_config
from transformers import PreTrainedTokenizerFast

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts, load_tokenizer
from rllm_torch.core.errors import ConfigError

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<s>", "<|im_end|>", "<|im_start|>", "<pad>"]
TINY = ["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2", "model.max_positions=64"]


def save_tokenizer(path, *, pad: bool = True, chat_template: str | None = CHAT_TEMPLATE, bos: bool = False):
    """A character-level tokenizer (a ``tokenizers`` WordLevel model over single characters)
    for digits, '+', '=', newline and the letters of the role names, with chat special tokens; ``bos``: a post-processor that starts every text with ``<s>`` (as Llama's does)."""
    words = sorted(set("0123456789+=\nuserassistant"))
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one character each
    backend.decoder = decoders.Fuse()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    specials = {"eos_token": "<|im_end|>", "bos_token": "<s>", "unk_token": "<unk>"} | (
        {"pad_token": "<pad>"} if pad else {}
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **specials)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return tokenizer


def save_model_dir(path, **tokenizer_options):
    """``path`` with a tokenizer (:func:`save_tokenizer`) and a 1-layer GPT-2 of its vocabulary."""
    tokenizer = save_tokenizer(path, **tokenizer_options)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|im_end|>"  # only to build the model; the saved tokenizer has none
    model_config = OmegaConf.create(
        {"path": None, "arch": "gpt2", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "max_positions": 64}
    )
    build_policy(model_config, tokenizer).save_pretrained(path)
    return path


def test_a_saved_tokenizer_keeps_its_special_tokens_and_pad_and_eos(tmp_path):
    save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(str(tmp_path), "unused")
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        "<|im_end|>",
        "<pad>",
        1,
        3,
    )
    assert tokenizer("3+4=")["input_ids"] == [tokenizer.convert_tokens_to_ids(c) for c in "3+4="]


def test_a_tokenizer_without_a_pad_token_is_refused_unless_model_pad_token_names_one(tmp_path):
    save_tokenizer(tmp_path, pad=False)
    with pytest.raises(ConfigError, match=r"no pad token.*model\.pad_token='<\|im_end\|>'"):
        load_tokenizer(str(tmp_path), "unused")
    tokenizer = load_tokenizer(str(tmp_path), "unused", pad_token="<|im_end|>")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 1
    with pytest.raises(ConfigError, match=r"model\.pad_token='<nope>' is not a token"):
        load_tokenizer(str(tmp_path), "unused", pad_token="<nope>")


def test_the_chat_template_formats_each_prompt_as_a_user_message_with_the_generation_prompt(tmp_path):
    tokenizer = load_tokenizer(str(save_tokenizer(tmp_path) and tmp_path), "unused")
    ids = encode_prompts(tokenizer, ["3+4=", "12+0="], apply_chat_template=True)
    texts = [tokenizer.decode(row) for row in ids]
    assert texts == [f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n" for p in ("3+4=", "12+0=")]
    assert ids[0][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # a special token, not its characters


def test_plain_prompts_get_the_tokenizers_own_special_tokens_and_the_template_writes_them_once(tmp_path):
    tokenizer = load_tokenizer(str(save_tokenizer(tmp_path, bos=True) and tmp_path), "unused")
    (plain,) = encode_prompts(tokenizer, ["3+4="])
    assert plain[0] == tokenizer.bos_token_id and tokenizer.decode(plain[1:]) == "3+4="
    (chat,) = encode_prompts(tokenizer, ["3+4="], apply_chat_template=True)
    assert tokenizer.bos_token_id not in chat  # the template has no <s>, and none is added


def test_apply_chat_template_without_a_template_is_a_start_up_error(tmp_path):
    from rllm_torch.cli.train_command import run

    model_dir = save_model_dir(tmp_path / "model", chat_template=None)
    for model_path in ("null", str(model_dir)):  # the character tokenizer has no template either
        config = make_config(tmp_path / "run", *TINY, f"model.path={model_path}", "task.apply_chat_template=true")
        with pytest.raises(ConfigError, match=r"task\.apply_chat_template=true but the tokenizer has no chat template"):
            run(config)


def test_a_tokenizer_without_a_pad_token_is_a_start_up_error_naming_model_pad_token(tmp_path):
    from rllm_torch.cli.train_command import run

    model_dir = save_model_dir(tmp_path / "model", pad=False)
    with pytest.raises(ConfigError, match=r"model\.pad_token"):
        run(make_config(tmp_path / "run", *TINY, f"model.path={model_dir}"))


@pytest.mark.parametrize("max_new_tokens, fits", [(60, True), (61, False)])
def test_prompts_and_max_new_tokens_beyond_the_context_are_a_start_up_error(tmp_path, max_new_tokens, fits):
    """The arithmetic prompts have 4 tokens; the model 64 positions: 60 new tokens fit, 61 do not."""
    config = make_config(tmp_path, *TINY, f"rllm.rollout.max_new_tokens={max_new_tokens}")
    backend = TorchBackend(config)
    tasks = [{"prompt": "3+4="}, {"prompt": "1+2="}]
    if fits:
        backend.validate_prompts(tasks)
        return
    with pytest.raises(
        ConfigError, match=r"longest prompt has 4 tokens and rllm\.rollout\.max_new_tokens=61.*to 60 or less"
    ):
        backend.validate_prompts(tasks)
    backend.init_rollout_engine()  # the sampler refuses a prompt that grew too long at run time as well
    with pytest.raises(ConfigError, match="beyond the model's context of 64"):
        asyncio.run(backend.rollout_engine.generate("3+4="))


def test_a_run_samples_and_trains_with_a_saved_tokenizer_and_its_chat_template(tmp_path):
    from rllm_torch.cli.train_command import run

    model_dir = save_model_dir(tmp_path / "model", pad=False)
    config = make_config(
        tmp_path / "run",
        f"model.path={model_dir}",
        "model.pad_token=<|im_end|>",
        "task.apply_chat_template=true",
        "task.train_size=8",
        "task.val_size=2",
        "data.train_batch_size=4",
        "rllm.rollout.n=2",
        "rllm.rollout.n_val=1",
        "rllm.rollout.max_new_tokens=4",
        "rllm.trainer.total_batches=2",
    )
    trainer = run(config)
    engine, tokenizer = trainer.backend.rollout_engine, trainer.tokenizer
    output = asyncio.run(engine.generate("3+4="))
    assert tokenizer.decode(output.prompt_ids) == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert output.finish_reason == "length" or output.response_ids[-1] == tokenizer.eos_token_id
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["actor/loss"])) for r in train_rows)
    saved = load_tokenizer(str(tmp_path / "run" / "checkpoints" / "final"), "unused")
    assert saved.chat_template == CHAT_TEMPLATE and saved.pad_token == "<|im_end|>"  # the checkpoint loads as-is


def test_model_pad_token_is_refused_when_the_tokenizer_has_its_own(tmp_path):
    save_tokenizer(tmp_path)  # pad <pad>
    with pytest.raises(ConfigError, match=r"model\.pad_token='<\|im_end\|>' is set, but .* own pad token '<pad>'"):
        load_tokenizer(str(tmp_path), "unused", pad_token="<|im_end|>")
    assert load_tokenizer(str(tmp_path), "unused", pad_token="<pad>").pad_token == "<pad>"  # the same: fine
    with pytest.raises(ConfigError, match="the character tokenizer"):
        load_tokenizer(None, "0123", pad_token="<nope>")


def test_a_chat_template_that_fails_is_a_config_error_naming_the_setting(tmp_path):
    tokenizer = load_tokenizer(
        str(save_tokenizer(tmp_path, chat_template="{% for m in messages %}{{ m }") and tmp_path), "x"
    )
    with pytest.raises(ConfigError, match=r"chat template failed .*task\.apply_chat_template=false"):
        encode_prompts(tokenizer, ["3+4="], apply_chat_template=True)
    tokenizer.chat_template = "{{ raise_exception('only system messages') }}"
    with pytest.raises(ConfigError, match="only system messages"):
        encode_prompts(tokenizer, ["3+4="], apply_chat_template=True)


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path):
    save_model_dir(tmp_path)
    bigger = save_tokenizer(tmp_path / "big")
    bigger.add_tokens(["<extra_0>", "<extra_1>"])
    bigger.save_pretrained(tmp_path)  # the model keeps its smaller embedding
    config = OmegaConf.create({"path": str(tmp_path)})
    with pytest.raises(
        ConfigError, match=r"model\.path=.*has 2[0-9] tokens but the model's embedding .* has 2[0-9] rows"
    ):
        build_policy(config, load_tokenizer(str(tmp_path), "unused"))


def test_prompts_with_characters_a_saved_tokenizer_does_not_know_are_refused(tmp_path):
    config = make_config(tmp_path, *TINY, f"model.path={save_model_dir(tmp_path / 'model')}")
    backend = TorchBackend(config)
    backend.validate_prompts([{"prompt": "3+4="}])
    with pytest.raises(
        ConfigError, match=r"the prompt '3\*4=' has characters the tokenizer at model\.path=.* does not know \('\*'\)"
    ):
        backend.validate_prompts([{"prompt": "3+4="}, {"prompt": "3*4="}])


def test_the_context_error_does_not_suggest_a_max_new_tokens_that_cannot_work(tmp_path):
    from rllm_torch.backends.torch_backend.model import check_context

    with pytest.raises(ConfigError) as error:
        check_context(31, 2, 32)
    assert "lower rllm.rollout.max_new_tokens" not in str(error.value) and "shorten the prompts" in str(error.value)
    with pytest.raises(ConfigError, match="lower rllm.rollout.max_new_tokens to 2 or less"):
        check_context(30, 3, 32)

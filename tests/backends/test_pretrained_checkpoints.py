"""Pretrained checkpoints as users have them: a ``.gguf`` file (made here with the ``gguf``
package, no downloaded weights) converted once into a plain directory, trained through the real
command, exported as a plain ``transformers`` directory; the defaults a pretrained model gets,
and the clear errors of a file that cannot load."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import write_llama_gguf
from trainer_fakes import make_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_torch.backends.torch_backend import pretrained
from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import CheckpointError, ConfigError, ModelNotFoundError
from rllm_torch.trainer.model_defaults import FROM_SCRATCH, PRETRAINED
from rllm_torch.trainer.resolvers import package_file

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
    reason="the GGUF loader needs the gguf extra",
)

WORD_ADDITION = [
    "task.name=word_addition",
    "task.min_digits=1",
    "task.max_digits=1",
    "task.train_size=8",
    "task.val_size=4",
    "task.apply_chat_template=true",
    "data.train_batch_size=4",
    "rllm.rollout.n=2",
    "rllm.rollout.n_val=1",
    "rllm.rollout.max_new_tokens=3",
    "rllm.trainer.logger=[jsonl]",
]


def gguf_run(tmp_path: Path, path: Path, *overrides: str):
    """A word-addition run of the GGUF model at ``path`` in ``tmp_path/run``, converted under ``tmp_path/cache``."""
    config = make_config(
        tmp_path / "run", f"model.path={path}", f"model.gguf_cache_dir={tmp_path / 'cache'}", *overrides, *WORD_ADDITION
    )
    return run(config)


@pytest.fixture
def gguf_file(tmp_path) -> tuple[Path, dict]:
    path = tmp_path / "models" / "tiny-llama.gguf"
    path.parent.mkdir()
    return path, write_llama_gguf(path)


def test_a_gguf_file_converts_once_into_a_plain_directory_with_its_weights_and_tokenizer(gguf_file, tmp_path):
    path, tensors = gguf_file
    cache = tmp_path / "cache"
    directory = pretrained.pretrained_dir(path, cache_dir=cache)
    assert directory.parent == cache and directory.name.startswith("tiny-llama-")
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(directory)  # a plain directory: no gguf_file
    want = torch.from_numpy(tensors["token_embd.weight"])
    assert torch.equal(model.get_input_embeddings().weight, want)
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, torch.from_numpy(tensors["blk.1.ffn_down.weight"]))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template is not None
    assert tokenizer.decode(tokenizer("What is 2 + 3?")["input_ids"]) == "What is 2 + 3?"
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert pretrained.pretrained_dir(path, cache_dir=cache) == directory  # converted once
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in cache.iterdir()] == [directory.name]  # no scratch folder left
    assert pretrained.pretrained_dir(tmp_path, cache_dir=cache) == tmp_path  # a directory is itself


def test_the_conversion_draws_no_progress_bar_into_a_piped_log(gguf_file, tmp_path):
    path, _ = gguf_file
    code = (
        "import sys; from rllm_torch.backends.torch_backend.pretrained import pretrained_dir; "
        f"pretrained_dir({str(path)!r}, cache_dir={str(tmp_path / 'cache')!r}); print('converted', file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\r" not in done.stderr and "de-quantizing" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().endswith("converted")


def test_a_gguf_model_path_trains_and_exports_a_plain_transformers_directory(gguf_file, tmp_path, capsys):
    path, tensors = gguf_file
    # the entropy bonus: a gradient even when every reward of a group is equal
    gguf_run(tmp_path, path, "rllm.trainer.total_batches=2", "backend.entropy_coeff=0.01")
    out = capsys.readouterr().out
    assert "backend.lr=1e-05, backend.num_threads=" in out and "(defaults for a pretrained model.path)" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/lr"] for r in rows if "actor/loss" in r] == [PRETRAINED.lr, PRETRAINED.lr]
    final = tmp_path / "run" / "checkpoints" / "final"
    assert "quantization_config" not in json.loads((final / "config.json").read_text())
    exported = AutoModelForCausalLM.from_pretrained(final)
    start = torch.from_numpy(tensors["token_embd.weight"])
    assert exported.get_input_embeddings().weight.shape == start.shape
    assert not torch.equal(exported.get_input_embeddings().weight, start)  # it trained


def hand_converted(gguf: Path, directory: Path) -> Path:
    """What a user does by hand (issue 43): the GGUF loader's model, its weights in a plain model of its
    config, ``save_pretrained``: a loadable directory whose config.json keeps a gguf quantization_config."""
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    plain = type(loaded)(loaded.config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(directory)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text())["quantization_config"]["quant_method"] == "gguf"
    return directory


def test_a_hand_converted_directory_with_a_leftover_gguf_quantization_config_trains_and_exports_plainly(
    gguf_file, tmp_path
):
    path, tensors = gguf_file
    directory = hand_converted(path, tmp_path / "by-hand")
    run(make_config(tmp_path / "run", f"model.path={directory}", "rllm.trainer.total_batches=1", *WORD_ADDITION))
    final = tmp_path / "run" / "checkpoints" / "final"  # transformers refused to write it: "quantized with gguf"
    assert "quantization_config" not in json.loads((final / "config.json").read_text())
    exported = AutoModelForCausalLM.from_pretrained(final)
    assert not getattr(exported, "is_quantized", False)
    assert exported.get_input_embeddings().weight.shape == tensors["token_embd.weight"].shape


def test_an_export_that_fails_says_so_in_one_error_after_the_checkpoint_is_safe_and_the_rerun_exports(
    gguf_file, tmp_path, monkeypatch
):
    path, _ = gguf_file

    def refused(self, directory):
        raise ValueError("The model is quantized with gguf and is not serializable\n(more lines of transformers)")

    monkeypatch.setattr(Actor, "save_pretrained", refused)
    with pytest.raises(CheckpointError) as error:
        gguf_run(tmp_path, path, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=0")
    final = tmp_path / "run" / "checkpoints" / "final"
    assert str(error.value) == (
        f"exporting the model to {final} failed (ValueError: The model is quantized with gguf and is not "
        "serializable); the run's checkpoints are intact and the same command writes it again. Free disk space (or "
        "fix the path) first."
    )
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "manifest.json").is_file()  # every trained step kept
    assert not final.exists() and not list(final.parent.glob(".tmp-*"))
    monkeypatch.undo()
    gguf_run(tmp_path, path, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=0")
    assert (final / "model.safetensors").is_file()


def test_an_explicit_learning_rate_wins_over_the_pretrained_default(gguf_file, tmp_path, capsys):
    path, _ = gguf_file
    gguf_run(
        tmp_path,
        path,
        "backend.lr=0.0003",
        "backend.num_threads=1",
        "backend.share_prompts=true",
        "backend.gradient_checkpointing=true",
        "rllm.trainer.total_batches=1",
    )
    assert "defaults for a pretrained" not in capsys.readouterr().out  # nothing was left to a default
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/lr"] for r in rows if "actor/loss" in r] == [0.0003]
    assert torch.get_num_threads() == 1


def test_a_model_built_from_scratch_keeps_its_own_defaults(tmp_path, capsys):
    run(make_config(tmp_path, "rllm.trainer.total_batches=1", "task.train_size=8", "task.val_size=0"))
    assert (
        "backend.lr=0.001, backend.num_threads=1 (defaults for a model built from scratch)" in capsys.readouterr().out
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/lr"] for r in rows if "actor/loss" in r] == [FROM_SCRATCH.lr]


def test_a_gguf_of_an_architecture_transformers_cannot_load_names_the_setting(tmp_path):
    path = tmp_path / "odd.gguf"
    write_llama_gguf(path, architecture="notamodel")
    with pytest.raises(ConfigError, match=r"model.path='.*odd.gguf': transformers cannot load this GGUF file"):
        pretrained.pretrained_dir(path, cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())  # nothing half-converted left behind


def test_a_missing_gguf_package_names_the_extra(gguf_file, tmp_path, monkeypatch):
    path, _ = gguf_file
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"needs the gguf package\(s\): pip install 'rllm_torch\[gguf\]'"):
        pretrained.pretrained_dir(path, cache_dir=tmp_path / "cache")


def test_a_missing_gguf_file_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"model.ref_path='.*gone.gguf': no such file"):
        pretrained.pretrained_dir(tmp_path / "gone.gguf", cache_dir=tmp_path, key="model.ref_path")


def test_a_checkpoint_without_a_chat_template_asked_to_use_one_names_the_setting(tmp_path):
    path = tmp_path / "plain.gguf"
    write_llama_gguf(path, chat_template=False)
    with pytest.raises(ConfigError, match="task.apply_chat_template=true but the tokenizer has no chat template"):
        gguf_run(tmp_path, path, "rllm.trainer.total_batches=1")


def test_the_package_file_resolver_finds_a_shipped_file_without_importing_and_names_the_install():
    assert Path(package_file("numpy", "__init__.py", "numpy")) == Path(np.__file__)
    with pytest.raises(ConfigError, match="needs the package not_a_package_here.*pip install --no-deps it-now"):
        package_file("not_a_package_here", "x.gguf", "--no-deps it-now")
    with pytest.raises(ConfigError, match="has no file missing.gguf"):
        package_file("numpy", "missing.gguf", "numpy")

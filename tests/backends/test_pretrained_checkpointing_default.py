"""Activation checkpointing by model (issue 50): a pretrained ``model.path`` trains with it unless
told otherwise (``backend.gradient_checkpointing`` left null), a model built from scratch without
it, and an explicit setting wins either way. Checked by what runs, not by a flag: with
checkpointing each transformer block's forward runs again in the backward (its activations
recomputed), so a training forward and backward calls every block twice instead of once."""

from __future__ import annotations

import pytest
import torch
import trainer_rank_tasks as tasks

from rllm_torch.backends.torch_backend import TorchBackend


def block_calls_in_one_backward(backend: TorchBackend) -> list[int]:
    """How many times each transformer block's MLP ran in one training forward and backward of
    the actor's training module on two rows (``transformers`` checkpoints each block's ``forward``:
    what it calls runs again in the backward)."""
    base = backend.model.base_model
    blocks = base.layers if hasattr(base, "layers") else base.h
    calls = [0] * len(blocks)

    def counted(i, forward):
        def forward_counted(*args, **kwargs):
            calls[i] += 1
            return forward(*args, **kwargs)

        return forward_counted

    for i, block in enumerate(blocks):  # the instance's forward (module hooks are not run again by the recompute)
        block.mlp.forward = counted(i, block.mlp.forward)
    ids = torch.tensor([[1, 10, 9, 11, 7, 3], [1, 10, 4, 11, 5, 0]])
    mask = (ids != 0).long()
    positions = mask.bool() & (torch.arange(6) >= 4)
    try:
        scores = backend.actor.train_model(ids, mask, positions, True)
        scores.log_probs.sum().backward()
    finally:
        for block in blocks:
            del block.mlp.forward
    return calls


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained")
    TorchBackend(tasks.backend_config("model.num_layers=2"), alphabet=tasks.ALPHABET).model.save_pretrained(path)
    return path


def test_a_pretrained_model_path_recomputes_each_block_in_the_backward_by_default(saved_model):
    backend = TorchBackend(tasks.backend_config(f"model.path={saved_model}", "backend.num_threads=1"))
    assert backend.settings.gradient_checkpointing is True
    assert block_calls_in_one_backward(backend) == [2, 2]  # forward, then recomputed in the backward
    rows = dict(backend.summary_rows())
    assert "activation checkpointing on" in rows["memory"] and "backend.gradient_checkpointing=true" in rows["defaults"]


@pytest.mark.parametrize(
    "dotlist, calls",
    [
        ((), [1, 1]),  # from scratch: off by default
        (("backend.gradient_checkpointing=false",), [1, 1]),
        (("backend.gradient_checkpointing=true",), [2, 2]),
    ],
    ids=["scratch-default", "pretrained-off", "scratch-on"],
)
def test_an_explicit_setting_wins_and_a_model_from_scratch_is_not_checkpointed(saved_model, dotlist, calls):
    path = (f"model.path={saved_model}",) if "false" in "".join(dotlist) else ("model.num_layers=2",)
    backend = TorchBackend(tasks.backend_config(*path, *dotlist, "backend.num_threads=1"), alphabet=tasks.ALPHABET)
    assert block_calls_in_one_backward(backend) == calls

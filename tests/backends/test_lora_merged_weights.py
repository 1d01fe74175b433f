"""The weights the vLLM engine takes from a LoRA policy (``merged_lora_weights``): the base
model's names and every adapted weight with its adapter merged, equal to ``peft``'s own
``merge_and_unload`` state dict, for GPT-2's transposed ``Conv1D`` and Llama's ``Linear``; the
policy keeps its adapters. Runs without vLLM (the vLLM suite trains with them)."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from rllm_torch.backends.torch_backend import build_char_tokenizer
from rllm_torch.backends.torch_backend.lora import apply_lora
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.vllm_setup import full_weights

pytest.importorskip("peft")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_merged_weights_are_peft_merge_and_unload_under_the_base_names(arch):
    tok = build_char_tokenizer("0123456789+=")
    config = OmegaConf.create(dict(path=None, arch=arch, num_layers=2, hidden_size=64, num_heads=2, max_positions=32))
    lora = OmegaConf.create(dict(r=4, alpha=8, dropout=0.0, target_modules=["all-linear"]))
    model = apply_lora(build_policy(config, tok, seed=0), lora, seed=0)
    with torch.no_grad():  # adapters that change the weights (peft starts B at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    got = dict(full_weights(model))
    assert set(got) == set(expected)
    base = {
        n.replace(".base_layer", ""): p
        for n, p in model.get_base_model().named_parameters(remove_duplicate=False)
        if "lora_" not in n
    }
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=1e-6, msg=name)
    changed = sum(not torch.equal(got[name], base[name]) for name in got)
    assert changed > 0  # the adapted weights are merged, not the base's
    assert any("lora_" in name for name, _ in model.named_parameters())  # the policy keeps its adapters

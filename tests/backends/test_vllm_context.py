"""The vLLM engine's default context from its KV-cache budget, and vLLM's refusal named in our
settings; neither needs vLLM installed."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, LlamaConfig

from rllm_torch.backends.torch_backend.vllm_setup import kv_cache_context, kv_cache_errors_named
from rllm_torch.core.errors import ConfigError


def test_the_context_is_what_seven_eighths_of_the_budget_hold_in_whole_blocks():
    # SmolLM2-135M: 2 (K, V) x 30 layers x 3 KV heads x 64 x 4 bytes = 46,080 bytes a position;
    # 7/8 of 256 MiB = 234,881,024 bytes -> 5,097 positions -> 5,088 in blocks of 16
    smollm2 = LlamaConfig(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
    assert kv_cache_context(smollm2, 256 * 2**20, 4) == 5088
    assert kv_cache_context(smollm2, 256 * 2**20, 2) == 10192  # bf16: twice the positions (10,194 -> 10,192)
    # GPT-2 names: n_layer, n_head, n_embd; no GQA: 2 x 2 x 4 x 16 x 4 = 1,024 bytes a position
    tiny = GPT2Config(n_layer=2, n_head=4, n_embd=64)
    assert kv_cache_context(tiny, 2**20, 4) == 896
    assert kv_cache_context(tiny, 1, 4) == 16  # at least one block


def test_vllms_kv_cache_refusal_becomes_one_error_naming_our_settings():
    message = "To serve at least one request with the model's max seq len (5824), (0.25 GiB KV cache is needed. More"
    with pytest.raises(ConfigError, match=r"cannot hold its context of 5824 positions .*backend.rollout.max_model_len"):
        with kv_cache_errors_named(5824):
            raise ValueError(message)
    with pytest.raises(ValueError, match="something else"), kv_cache_errors_named(8):
        raise ValueError("something else")

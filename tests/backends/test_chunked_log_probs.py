"""Log-probs without ``[N, T, V]`` logits: the chunked head equals the full log-softmax (values and
gradients, float32 and bf16), never holds more than one chunk of logits, and the sampler records
each sampled token's log-prob from the step's logits as it goes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, CohereConfig, Qwen2Config

from rllm_torch.backends.torch_backend import build_char_tokenizer, sample_completions, token_log_probs
from rllm_torch.backends.torch_backend.forward import check_linear_head, token_scores
from rllm_torch.backends.torch_backend.logprobs import chunked_token_log_probs, default_chunk_tokens
from rllm_torch.core.errors import ConfigError


def _full(hidden, weight, targets, bias=None, temperature=1.0):
    """The plain computation: every logit at once, ``log_softmax``, and the entropy."""
    z = hidden @ weight.T + (0 if bias is None else bias)
    logp_MV = (z.float() / temperature).log_softmax(-1)
    return logp_MV.gather(1, targets[:, None]).squeeze(1), -(logp_MV.exp() * logp_MV).sum(-1)


def _qwen2(vocab_size: int = 1000, layers: int = 2) -> torch.nn.Module:
    """A Qwen2-shaped model (GQA, RMSNorm, tied head) with random weights, small enough for a test."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def test_a_hand_worked_token_log_prob_and_entropy():
    # logits (2, 0, 0) over 3 tokens: logsumexp = log(e² + 2) = 2.2395; log π(0) = 2 - 2.2395
    # p = (0.7870, 0.1065, 0.1065): entropy = 2.2395 - 2 · 0.7870 = 0.6655
    hidden, weight = torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    logp, entropy = chunked_token_log_probs(hidden, weight, torch.tensor([0]), with_entropy=True)
    assert logp.item() == pytest.approx(2 - 2.2395447, abs=1e-6)
    assert entropy.item() == pytest.approx(2.2395447 - 2 * 0.7869860, abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    num_tokens=st.integers(0, 13),
    chunk=st.integers(1, 16),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_log_probs_and_entropy_equal_the_full_log_softmax_in_float32(
    num_tokens, chunk, temperature, bias, seed
):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(num_tokens, 8, generator=g) * 3, torch.randn(50, 8, generator=g)
    b = torch.randn(50, generator=g) if bias else None
    targets = torch.randint(0, 50, (num_tokens,), generator=g)
    logp, entropy = chunked_token_log_probs(
        hidden, weight, targets, bias=b, temperature=temperature, chunk_tokens=chunk, with_entropy=True
    )
    want_logp, want_entropy = _full(hidden, weight, targets, b, temperature)
    assert logp.dtype == torch.float32 and logp.shape == (num_tokens,)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=2e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_backward_is_autograd_of_the_full_formula_in_float64(temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    coef = torch.arange(7, dtype=torch.float64)

    def loss(h, w, b):  # uses both outputs, with different weights per token
        logp, entropy = chunked_token_log_probs(
            h, w, targets, bias=b, temperature=temperature, chunk_tokens=3, with_entropy=True
        )
        return (coef * logp).sum() + (entropy.square() * 0.5).sum()

    assert torch.autograd.gradcheck(loss, (hidden, weight, bias))
    z = (hidden @ weight.T + bias) / temperature
    logp_MV = z.log_softmax(-1)
    full = (coef * logp_MV.gather(1, targets[:, None]).squeeze(1)).sum()
    full = full + (-(logp_MV.exp() * logp_MV).sum(-1)).square().sum() * 0.5
    want = torch.autograd.grad(full, (hidden, weight, bias))
    got = torch.autograd.grad(loss(hidden, weight, bias), (hidden, weight, bias))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", [3, 64], ids=["four-chunks", "one-chunk"])
def test_the_bf16_backward_over_several_chunks_is_autograd_of_the_bf16_head(chunk):
    """Under bf16 autocast every chunk's weight and bias gradient is added to the others' (a chunk
    that overwrote them would keep a quarter of the gradient here), to bf16's rounding of the
    matmuls; the reference is autograd through the same bf16 head with float32 log-softmax."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(10, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (10,), generator=g)
    coef = torch.linspace(-1.0, 2.0, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, entropy = chunked_token_log_probs(
            hidden, weight, targets, bias=bias, temperature=0.8, chunk_tokens=chunk, with_entropy=True
        )
        got = torch.autograd.grad((coef * logp).sum() + entropy.sum(), (hidden, weight, bias))
        z = torch.nn.functional.linear(hidden, weight) + bias  # the head in bf16, as the model's lm_head
    logp_MV = (z.float() / 0.8).log_softmax(-1)
    full = (coef * logp_MV.gather(1, targets[:, None]).squeeze(1)).sum() - (logp_MV.exp() * logp_MV).sum()
    want = torch.autograd.grad(full, (hidden, weight, bias))
    for name, a, b in zip(("hidden", "weight", "bias"), got, want, strict=True):
        assert a.dtype == torch.float32, name
        torch.testing.assert_close(a, b, rtol=0, atol=0.03 * b.abs().max().item(), msg=name)


def test_bad_arguments_name_what_is_wrong():
    h, w, y = torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="share H"):
        chunked_token_log_probs(h, torch.zeros(5, 3), y)
    with pytest.raises(ValueError, match="targets must be"):
        chunked_token_log_probs(h, w, y[:1])
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_log_probs(h, w, y, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_log_probs(h, w, y, chunk_tokens=0)


class _LargestTensor(TorchDispatchMode):
    """Records the number of elements of the largest tensor any op creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_more_than_one_chunk_of_logits_exists_in_the_forward_and_the_backward():
    vocab, tokens, chunk, width = 4000, 64, 8, 4
    hidden = torch.randn(tokens, width, requires_grad=True)
    weight = torch.randn(vocab, width, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    with _LargestTensor() as mode:
        logp, entropy = chunked_token_log_probs(hidden, weight, targets, chunk_tokens=chunk, with_entropy=True)
        (logp.sum() + entropy.sum()).backward()
    # the weight and its gradient are [V, 4], half a chunk of logits [8, V]: the largest tensor
    # is exactly one chunk's logits (two chunks, [16, V], or all of them, [64, V], would show)
    assert weight.numel() < chunk * vocab
    assert mode.largest == chunk * vocab


def test_the_default_chunk_holds_128_mib_of_float32_logits():
    assert default_chunk_tokens(151_936) == 220 and default_chunk_tokens(2**30) == 1


@pytest.mark.parametrize("chunk", [None, 5])
def test_model_log_probs_equal_the_models_own_logits_at_every_real_token(chunk):
    model = _qwen2().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[2, 2:] = 0, 0  # right padding
    with torch.no_grad():
        got = token_log_probs(model, ids, mask, temperature=0.8, chunk_tokens=chunk)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    want = (logits[:, :-1].float() / 0.8).log_softmax(-1).gather(2, ids[:, 1:, None]).squeeze(2)
    real = mask[:, 1:].bool()
    torch.testing.assert_close(got[:, 1:][real], want[real], rtol=0, atol=2e-5)
    assert not got[:, 0].any() and not got[:, 1:][~real].any()  # no context, padding: 0


def test_only_the_positions_asked_for_are_scored():
    model = _qwen2().eval()
    ids = torch.randint(0, 1000, (2, 6))
    mask, positions = torch.ones_like(ids), torch.zeros_like(ids)
    positions[:, 4:] = 1
    with torch.no_grad():
        all_tokens = token_scores(model, ids, mask, with_entropy=True)
        some = token_scores(model, ids, mask, positions=positions, with_entropy=True)
    torch.testing.assert_close(some.log_probs[:, 4:], all_tokens.log_probs[:, 4:])
    torch.testing.assert_close(some.entropy[:, 4:], all_tokens.entropy[:, 4:])
    assert not some.log_probs[:, :4].any() and not some.entropy[:, :4].any()


def test_bf16_log_probs_equal_the_models_bf16_logits_within_bf16_rounding():
    model = _qwen2().eval()
    ids = torch.randint(0, 1000, (4, 12))
    mask = torch.ones_like(ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = token_log_probs(model, ids, mask)
        logits = model(input_ids=ids, attention_mask=mask).logits
    with torch.no_grad():
        fp32 = token_log_probs(model, ids, mask)
    want = logits[:, :-1].float().log_softmax(-1).gather(2, ids[:, 1:, None]).squeeze(2)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[:, 1:], want, rtol=0, atol=2e-2)  # both from bf16 logits
    assert (got - fp32).abs().max() > 0  # bf16 did run


def test_a_model_whose_logits_are_not_its_linear_head_is_refused():
    config = CohereConfig(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        logit_scale=0.5,
    )
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match="CohereForCausalLM.*not its linear head"):
        check_linear_head(model)
    check_linear_head(_qwen2())  # a plain head passes


def test_sampled_log_probs_ignore_a_checkpoints_generation_config():
    """A checkpoint's generation_config.json (repetition_penalty, top_k, ...) would change the
    sampling distribution behind the log-probs; the sampler uses its own settings only."""
    tok = build_char_tokenizer("0123456789+=")
    model = _qwen2(vocab_size=len(tok), layers=1).eval()
    model.generation_config.repetition_penalty, model.generation_config.top_k = 3.0, 2
    prompts = [tok("3+4=")["input_ids"], tok("12+3=")["input_ids"]]
    responses, logprobs, _ = sample_completions(
        model,
        prompts,
        max_new_tokens=6,
        eos_token_id=len(tok),  # never sampled: every row runs 6 steps
        pad_token_id=tok.pad_token_id,
        temperature=0.9,
        generator=torch.Generator().manual_seed(3),
    )
    for prompt, response, logp in zip(prompts, responses, logprobs, strict=True):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            recomputed = token_log_probs(model, ids, torch.ones_like(ids), temperature=0.9)[0, len(prompt) :]
        torch.testing.assert_close(recomputed, torch.tensor(logp), atol=1e-5, rtol=1e-5)
    assert model.generation_config.repetition_penalty == 3.0  # restored

"""The sampler (``transformers``' ``generate`` with a KV cache): its settings are pinned. Log-probs
at a temperature and top-p against the trainer's recomputation at the same temperature, the
top-p set, greedy decoding, positions of padded and unpadded rows, and the per-rank generator."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rllm_torch.backends.torch_backend import build_char_tokenizer, sample_completions, token_log_probs
from rllm_torch.backends.torch_backend.model import build_policy

TINY = OmegaConf.create(
    {"path": None, "arch": "gpt2", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "max_positions": 64}
)
TOK = build_char_tokenizer("0123456789+=")


def _model(arch: str, seed: int = 0):
    return build_policy(OmegaConf.merge(TINY, {"arch": arch}), TOK, seed=seed).eval()


def _sample(model, prompts, seed=0, **kwargs):
    kwargs = {"max_new_tokens": 6, **kwargs}
    return sample_completions(
        model,
        prompts,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


PROMPTS = [TOK("3+4=")["input_ids"], TOK("12+3=")["input_ids"], TOK("7=")["input_ids"]]  # left padding


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("temperature, top_p", [(0.5, 0.9), (1.0, 1.0), (1.7, 0.5)])
def test_log_probs_are_those_of_the_trainers_forward_at_the_same_temperature(arch, temperature, top_p):
    model = _model(arch)
    responses, logprobs, reasons = _sample(model, PROMPTS, temperature=temperature, top_p=top_p)
    for prompt, response, logp, reason in zip(PROMPTS, responses, logprobs, reasons, strict=True):
        assert 1 <= len(response) <= 6 and len(logp) == len(response)
        assert (reason == "stop") == (response[-1] == TOK.eos_token_id) and TOK.eos_token_id not in response[:-1]
        ids = torch.tensor([prompt + response])  # unpadded: the model's own default positions
        recomputed = token_log_probs(model, ids, torch.ones_like(ids), temperature=temperature)[0, len(prompt) :]
        torch.testing.assert_close(torch.tensor(logp), recomputed, atol=2e-5, rtol=2e-5)
        default_positions = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / temperature, -1)
        own = default_positions[len(prompt) - 1 :].gather(1, torch.tensor(response)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(logp), own, atol=2e-5, rtol=2e-5)


def test_top_p_samples_only_from_the_smallest_set_reaching_top_p_and_never_from_none():
    model = _model("gpt2", seed=3)
    prompt = TOK("5+")["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    order = probs.argsort(descending=True)
    cumulative = probs[order].cumsum(0)
    top_p = float((cumulative[1] + cumulative[2]) / 2)  # between the 2nd and 3rd token's cumulative mass
    allowed = set(order[:3].tolist())  # the smallest set reaching top_p holds the crossing (3rd) token
    firsts = [r[0] for r in _sample(model, [prompt] * 400, top_p=top_p, max_new_tokens=1)[0]]
    assert set(firsts) == allowed
    tiny = [r[0] for r in _sample(model, [prompt] * 50, top_p=1e-6, max_new_tokens=1)[0]]
    assert set(tiny) == {int(order[0])}  # the top token alone, never an empty set


def test_temperature_zero_is_greedy_with_log_probs_at_temperature_one():
    model = _model("llama")
    responses, logprobs, _ = _sample(model, PROMPTS, temperature=0.0)
    for prompt, response, logp in zip(PROMPTS, responses, logprobs, strict=True):
        ids = prompt[:]
        for token in response:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            assert token == int(logits.argmax())
            ids.append(token)
        recomputed = token_log_probs(model, torch.tensor([ids]), torch.ones(1, len(ids)), temperature=1.0)[
            0, len(prompt) :
        ]
        torch.testing.assert_close(torch.tensor(logp), recomputed, atol=2e-5, rtol=2e-5)


def test_the_generator_decides_the_samples_and_the_global_rng_is_untouched():
    model = _model("gpt2")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = _sample(model, PROMPTS * 4, seed=7)[0]
    assert torch.equal(torch.random.get_rng_state(), before)
    assert _sample(model, PROMPTS * 4, seed=7)[0] == first
    assert _sample(model, PROMPTS * 4, seed=8)[0] != first
    gen = torch.Generator().manual_seed(7)
    kw = dict(eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id, max_new_tokens=6, generator=gen)
    one, two = sample_completions(model, PROMPTS, **kw)[0], sample_completions(model, PROMPTS, **kw)[0]
    state = gen.get_state()  # a resumed generator continues the same stream
    three = sample_completions(model, PROMPTS, **kw)[0]
    gen.set_state(state)
    assert sample_completions(model, PROMPTS, **kw)[0] == three and (one, two) != (three, three)


def test_a_row_ends_at_eos_or_at_max_new_tokens():
    model = _model("gpt2", seed=1)
    responses, _, reasons = _sample(model, PROMPTS * 20, max_new_tokens=3)
    for response, reason in zip(responses, reasons, strict=True):
        assert len(response) <= 3
        assert reason == ("stop" if response[-1] == TOK.eos_token_id else "length")
        assert reason == "stop" or len(response) == 3


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
@pytest.mark.parametrize("row_chunk", [None, 12])  # the sampler's rows in one chunk, or 2 rows (V = 6) a chunk
def test_next_tokens_follow_the_tempered_nucleus_distribution(monkeypatch, temperature, top_p, row_chunk):
    from rllm_torch.backends.torch_backend import sampling

    if row_chunk is not None:
        monkeypatch.setattr(sampling, "_ROW_CHUNK_ELEMENTS", row_chunk)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -30.0])
    probs = torch.softmax(logits.double() / temperature, -1)
    # the nucleus: the smallest set of most likely tokens whose mass reaches top_p, renormalised
    mass_before = probs.cumsum(0) - probs
    nucleus = torch.where(mass_before < top_p, probs, torch.zeros_like(probs))
    want = nucleus / nucleus.sum()
    rows = 6000
    tokens, logp = sampling.sample_next_tokens(
        logits.expand(rows, -1), temperature=temperature, top_p=top_p, generator=torch.Generator().manual_seed(0)
    )
    counts = torch.bincount(tokens, minlength=6).double()
    # each count within 4.5 binomial standard deviations (a false alarm about once in 10^5 runs)
    assert ((counts - rows * want).abs() <= 4.5 * (rows * want * (1 - want)).sqrt() + 1e-9).all(), (counts, rows * want)
    assert counts[want == 0].sum() == 0
    torch.testing.assert_close(logp, probs.log().float()[tokens])  # before the top-p cut


def test_greedy_next_tokens_take_the_first_maximum_with_its_log_prob_at_temperature_one():
    from rllm_torch.backends.torch_backend.sampling import sample_next_tokens

    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    tokens, logp = sample_next_tokens(logits, temperature=0.0)
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logp, logits.log_softmax(-1)[[0, 1], [1, 0]])


def test_each_sampling_setting_of_the_run_reaches_its_own_phase_of_the_engine():
    """rllm.rollout's training and validation settings, each given a value of its own, are the
    engine's settings in each phase (validation, training, and remax's greedy rollouts)."""
    from trainer_rank_tasks import backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.backends.torch_backend.rollout import SamplingParams

    config = backend_config(
        "rllm.rollout.temperature=0.7",
        "rllm.rollout.top_p=0.9",
        "rllm.rollout.val_temperature=0.3",
        "rllm.rollout.val_top_p=0.8",
        "rllm.rollout.max_new_tokens=3",
    )
    engine = TorchBackend(config, alphabet="0123456789+=").init_rollout_engine()
    assert engine.params == SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3)
    engine.validation = True
    assert engine.params == SamplingParams(temperature=0.3, top_p=0.8, max_new_tokens=3)
    engine.validation, engine.greedy = False, True
    assert engine.params == SamplingParams(temperature=0.0, top_p=0.9, max_new_tokens=3)

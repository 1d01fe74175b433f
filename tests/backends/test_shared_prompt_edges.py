"""Shared prompts at their edges (issue 50): the start-up layout check of a model with dropout in
train mode, a row exactly as long as ``backend.micro_batch_tokens``, one-token prompts in
sampling's shared prefill, and a model the check turns down (it must then score, plan and sample
rows one by one). Expected values come from a plain full forward of each row (``logits``'
``log_softmax``), sharing no code with the packed route."""

from __future__ import annotations

import pytest
import torch
import trainer_rank_tasks as tasks
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

from rllm_torch.backends.torch_backend import TorchBackend, sample_completions
from rllm_torch.backends.torch_backend.forward import check_shared_prompts, token_scores
from rllm_torch.backends.torch_backend.micro_batches import plan_micro_batches
from rllm_torch.backends.torch_backend.shared_prompts import plan_shared_micro_batches
from rllm_torch.core.errors import ConfigError


def full_forward_log_probs(model, ids_RT: torch.Tensor, mask_RT: torch.Tensor) -> torch.Tensor:
    """Each row alone, unpadded, through the whole model (head included), float64 log-softmax:
    ``[R, T]``, column t the log-prob of token t (0 at column 0 and on padding)."""
    out = torch.zeros(ids_RT.shape, dtype=torch.float64)
    with torch.no_grad():
        for r in range(ids_RT.shape[0]):
            n = int(mask_RT[r].sum())
            logits = model(input_ids=ids_RT[r : r + 1, :n]).logits[0].double()
            out[r, 1:n] = logits[:-1].log_softmax(-1).gather(1, ids_RT[r, 1:n, None]).squeeze(1)
    return out


def dropout_gpt2(vocab_size: int = 50) -> GPT2LMHeadModel:
    """GPT-2 as a real checkpoint is configured: dropout 0.1 everywhere, in train mode."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab_size, n_positions=64)).train()


def test_the_layout_check_of_a_model_with_dropout_in_train_mode_passes_and_leaves_it_training():
    model = dropout_gpt2()
    assert model.config.attn_pdrop == model.config.resid_pdrop == 0.1
    # in train mode the two layouts differ by dropout alone; the check compares them in eval mode
    assert check_shared_prompts(model) is None
    assert model.training and all(m.training for m in model.modules())  # given back as it came


def test_a_pretrained_model_with_dropout_is_trained_with_shared_prompts(tmp_path):
    vocab = TorchBackend(tasks.backend_config()).model.config.vocab_size
    dropout_gpt2(vocab).save_pretrained(tmp_path)
    backend = TorchBackend(tasks.backend_config(f"model.path={tmp_path}", "backend.num_threads=1"))
    assert backend.model.config.resid_pdrop == 0.1 and backend.model.training
    assert backend.actor.unshared_reason is None and backend.actor.share_prompts
    assert backend.actor.scorer.share_prompts and backend.passes.micro.share_prompts


# --- the token budget: a row (or a packed row) exactly as long as backend.micro_batch_tokens fits


def test_a_row_exactly_as_long_as_the_budget_fits_and_one_token_longer_is_refused():
    # prompt (1, 2) + 4 response tokens = 6 = the budget: one packed row of 6 tokens alone
    assert plan_shared_micro_batches([(1, 2), None], [6, 3], 6) == [[0], [1]]
    with pytest.raises(ConfigError, match=r"micro_batch_tokens=5 is smaller than a row of 6 tokens"):
        plan_shared_micro_batches([(1, 2), None], [6, 3], 5)
    assert plan_micro_batches([6, 3], 6) == [[0], [1]]  # the unshared plan: the same bound
    with pytest.raises(ConfigError, match=r"micro_batch_tokens=5 is smaller than a row of 6 tokens"):
        plan_micro_batches([6, 3], 5)


def test_a_prompt_whose_rollouts_pack_into_exactly_the_budget_stays_one_packed_row():
    # 2 shared tokens + 4 + 4 continuation tokens = 10 = the budget: one packed row, not two
    assert plan_shared_micro_batches([(1, 2), (1, 2)], [6, 6], 10) == [[0, 1]]
    assert plan_shared_micro_batches([(1, 2), (1, 2)], [6, 6], 9) == [[0], [1]]  # 10 > 9: the prompt repeated


def test_packed_rows_filling_the_budget_exactly_share_one_micro_batch():
    # two prompts of 1 token, each with two rollouts of 3 tokens: packed rows of 1 + 2 + 2 = 5; 2 x 5 = 10
    prefixes, lengths = [(1,), (1,), (2,), (2,)], [3, 3, 3, 3]
    assert plan_shared_micro_batches(prefixes, lengths, 10) == [[0, 1, 2, 3]]
    assert plan_shared_micro_batches(prefixes, lengths, 9) == [[0, 1], [2, 3]]
    assert plan_micro_batches([5, 5], 10) == [[0, 1]] and plan_micro_batches([5, 5], 9) == [[0], [1]]


def _units(group, prefixes, lengths):
    """The packed rows of one micro-batch: one per prompt (rows with nothing scored: one each), and
    their packed lengths (the prompt once, then each row's continuation)."""
    units: dict[object, int] = {}
    for r in group:
        key = prefixes[r] if prefixes[r] is not None else ("row", r)
        shared = len(prefixes[r]) if prefixes[r] is not None else 0
        units[key] = units.get(key, shared) + lengths[r] - shared
    return units


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(-1, 2), st.integers(1, 4)), min_size=1, max_size=12),
    budget=st.integers(4, 16),
)
def test_the_plan_only_cuts_where_the_next_packed_row_would_not_fit(data, budget):
    """Small lengths and budgets, so that exact fits are common: a cut between two micro-batches is
    made only when adding the next packed row would go over the budget, and a prompt is split
    over packed rows only when all of its rows do not fit in one."""
    prefixes = [None if p < 0 else tuple(range(p + 1)) for p, _ in data]
    lengths = [(len(prefix) if prefix else 1) + extra for prefix, (_, extra) in zip(prefixes, data, strict=True)]
    if max(lengths) > budget:
        with pytest.raises(ConfigError):
            plan_shared_micro_batches(prefixes, lengths, budget)
        return
    plan = plan_shared_micro_batches(prefixes, lengths, budget)
    assert sorted(r for group in plan for r in group) == list(range(len(data)))
    units = [_units(group, prefixes, lengths) for group in plan]
    for here, following in zip(units, units[1:], strict=False):
        assert len(here) * max(here.values()) <= budget or len(here) == 1
        longest = max(max(here.values()), max(following.values()))
        assert (len(here) + 1) * longest > budget, (plan, budget)  # the next packed row did not fit
    for prefix in {p for p in prefixes if p is not None}:
        rows = [r for r, p in enumerate(prefixes) if p == prefix]
        if len(prefix) + sum(lengths[r] - len(prefix) for r in rows) <= budget:  # all of them fit in one
            assert any(set(rows) <= set(group) for group in plan), (prefix, plan, budget)


# --- sampling's shared prefill: one-token prompts (nothing to prefill) beside longer ones


def _first_forward_shapes(model, prompts, share):
    shapes = []

    def record(module, args, kwargs):
        if not shapes:
            shapes.append(tuple(kwargs["input_ids"].shape))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = sample_completions(
            model,
            prompts,
            max_new_tokens=4,
            eos_token_id=0,
            pad_token_id=1,
            generator=torch.Generator().manual_seed(2),
            share_prompts=share,
        )
    finally:
        handle.remove()
    return out, shapes[0]


@pytest.mark.parametrize(
    "prompts, shared_prefill",
    [
        ([[5], [5], [6], [5]], None),  # every prompt one token: nothing before the last, no prefill
        ([[5, 6], [7], [5, 6], [7]], (2, 1)),  # the longest has 2: one column prefilled, once per prompt
        ([[5, 6], [5, 6], [7, 8, 9]], (2, 2)),
    ],
    ids=["all-one-token", "one-and-two-tokens", "two-and-three-tokens"],
)
def test_sampling_short_prompts_draws_what_unshared_sampling_draws(prompts, shared_prefill):
    model = dropout_gpt2().eval()
    (ids, logps, reasons), unshared_first = _first_forward_shapes(model, prompts, share=False)
    (s_ids, s_logps, s_reasons), shared_first = _first_forward_shapes(model, prompts, share=True)
    assert unshared_first[0] == len(prompts)  # generate's own first forward: every row
    # the shared prefill's forward runs first: the distinct prompts, every column but the last
    assert shared_first == (shared_prefill or unshared_first)
    assert s_ids == ids and s_reasons == reasons
    for row, shared_row in zip(logps, s_logps, strict=True):
        assert shared_row == pytest.approx(row, abs=1e-5)


# --- a model the check turns down: rows one by one everywhere


def sliding_window_model(vocab_size: int) -> MistralForCausalLM:
    """A model whose attention adds its own rule to the mask (a 2-token sliding window, as
    Mistral's): handed the packed block mask it would see past the window, so the check says no."""
    torch.manual_seed(0)
    config = MistralConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
        max_position_embeddings=64,
        sliding_window=2,
        attn_implementation="sdpa",
    )
    return MistralForCausalLM(config)


def test_a_model_the_check_turns_down_is_scored_planned_and_sampled_row_by_row(tmp_path):
    vocab = TorchBackend(tasks.backend_config()).model.config.vocab_size
    model = sliding_window_model(vocab)
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 0], [2, 3, 4, 5, 8, 9, 9], [2, 3, 4, 5, 9, 0, 0]])
    mask = (torch.arange(7) < torch.tensor([[6], [7], [5]])).long()
    scored = mask * (torch.arange(7) >= 4)
    # what packing this model would give: not its rows' log-probs (the premise of the test)
    packed = token_scores(model, ids, mask, positions=scored, share_prompts=True).log_probs
    want = full_forward_log_probs(model, ids, mask) * scored
    assert (packed.double() - want).abs().max() > 1e-3
    assert check_shared_prompts(model) is not None

    model.save_pretrained(tmp_path)
    backend = TorchBackend(
        tasks.backend_config(
            f"model.path={tmp_path}",
            "backend.share_prompts=true",
            "backend.num_threads=1",
            "backend.micro_batch_tokens=14",
            "backend.dtype=float32",  # the scorer in float32, as the reference forward
        )
    )
    actor = backend.actor
    assert actor.unshared_reason == "MistralForCausalLM scores rows packed by prompt differently from rows one by one"
    assert not actor.share_prompts
    assert "prompts not shared (MistralForCausalLM" in dict(backend.summary_rows())["memory"]
    with torch.no_grad():
        scores = actor.scorer(ids, mask, scored > 0).log_probs
    torch.testing.assert_close(scores.double(), want, rtol=0, atol=2e-5)  # each row as it is

    class Batch:  # the fields MicroBatcher.split reads
        input_ids, attention_mask, response_mask = ids, mask, scored.float()

    # 14 padded tokens: rows of 7 and 6 (2 x 7), then the row of 5; packed by prompt they would be one
    parts = backend.passes.micro.split(Batch, torch.arange(3), collective=False)
    assert [p.tolist() for p in parts] == [[1, 0], [2]]
    backend.init_rollout_engine()
    assert backend.rollout_engine.share_prompts is False  # the sampler prefills each row itself

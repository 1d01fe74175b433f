"""Shared prompts (issue 43): a step's rollouts of one prompt computed once, in sampling (one
prefill per distinct prompt) and in the scoring forwards (one packed row per prompt under a block
mask). The values and gradients are those of separate rows, to float32 rounding; the plan keeps
a prompt's rows together within the token budget."""

from __future__ import annotations

import math

import pytest
import torch
import trainer_rank_tasks as tasks
from hypothesis import given, settings
from hypothesis import strategies as st
from test_micro_batches import MODES
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from rllm_torch.backends.torch_backend import TorchBackend, sample_completions
from rllm_torch.backends.torch_backend.forward import check_shared_prompts, token_scores
from rllm_torch.backends.torch_backend.shared_prompts import pack_rows, plan_shared_micro_batches, prompt_prefixes
from rllm_torch.core.errors import ConfigError


def llama(attention: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=50,
        max_position_embeddings=64,
        attn_implementation=attention,
    )
    return LlamaForCausalLM(config)


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    zero = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=64, **zero))


def rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three prompts of 3, 4 and 6 tokens with 3-5 rollouts each of 2-6 tokens, a row whose scored
    tokens have a gap (a second turn after an environment's reply) and a row with nothing scored."""
    g = torch.Generator().manual_seed(3)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17]]
    ids, scored = [], []
    for i, prompt in enumerate(prompts):
        for k in range(3 + i):
            response = torch.randint(20, 40, (2 + (3 * k + i) % 5,), generator=g).tolist()
            ids.append(prompt + response)
            scored.append([0] * len(prompt) + [1] * len(response))
    ids.append([5, 6, 7, 8, 30, 31, 32, 33, 34])
    scored.append([0, 0, 0, 0, 1, 1, 0, 1, 1])
    ids.append([5, 6, 7, 8, 21])
    scored.append([0] * 5)
    width = max(map(len, ids))
    ids_RT = torch.zeros(len(ids), width, dtype=torch.int64)
    mask_RT, scored_RT = torch.zeros_like(ids_RT), torch.zeros_like(ids_RT)
    for r, (row, want) in enumerate(zip(ids, scored, strict=True)):
        ids_RT[r, : len(row)], mask_RT[r, : len(row)], scored_RT[r, : len(want)] = (
            torch.tensor(row),
            1,
            torch.tensor(want),
        )
    return ids_RT, mask_RT, scored_RT


@pytest.mark.parametrize("model", [llama, lambda: llama("eager"), gpt2], ids=["llama-sdpa", "llama-eager", "gpt2"])
def test_packed_rows_score_and_backpropagate_as_separate_rows(model):
    model = model()
    ids, mask, scored = rows()
    packed = pack_rows(ids, mask, scored)
    assert packed is not None and packed.input_ids.numel() < 0.6 * ids.numel()  # the prompts once
    results = []
    for share in (False, True):
        model.zero_grad()
        scores = token_scores(model, ids, mask, positions=scored, with_entropy=True, share_prompts=share)
        (scores.log_probs.sum() + 0.1 * scores.entropy.sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((scores.log_probs.detach(), scores.entropy.detach(), grads))
    (rows_logp, rows_entropy, rows_grads), (packed_logp, packed_entropy, packed_grads) = results
    assert (rows_logp != 0).sum() == scored[:, 1:].sum()  # every scored token, nothing else
    torch.testing.assert_close(packed_logp, rows_logp, rtol=0, atol=2e-6)
    torch.testing.assert_close(packed_entropy, rows_entropy, rtol=0, atol=2e-6)
    assert packed_grads.keys() == rows_grads.keys()
    for name, grad in rows_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=2e-6, msg=name)


def test_rows_that_share_nothing_are_not_packed():
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    mask, scored = torch.ones_like(ids), torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    assert prompt_prefixes(ids, mask, scored) == [(1,), (5,)]
    assert pack_rows(ids, mask, scored) is None


def test_a_model_that_builds_its_own_mask_scores_rows_one_by_one_and_says_why():
    model = llama()
    assert check_shared_prompts(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert (
        check_shared_prompts(model)
        == "LlamaForCausalLM runs flash_attention_2 attention, which takes no block mask as given"
    )


def test_a_hand_worked_plan_keeps_a_prompt_with_its_rollouts():
    # prompt (1, 2): rows 0, 1 of 6 and 5 tokens pack into 2 + 4 + 3 = 9 tokens; prompt (3,): rows 2, 3
    # into 1 + 3 + 3 = 7; a budget of 12 holds one packed row at a time (2 x 9 = 18)
    assert plan_shared_micro_batches([(1, 2), (1, 2), (3,), (3,)], [6, 5, 4, 4], 12) == [[0, 1], [2, 3]]
    assert plan_shared_micro_batches([(1, 2), (1, 2), (3,), (3,)], [6, 5, 4, 4], 18) == [[0, 1, 2, 3]]
    # a prompt whose rollouts do not fit in one packed row of 8 tokens is repeated: 2 + 4 (row 0),
    # then 2 + 3 + 3 (rows 1 and 2); the longer packed row first
    assert plan_shared_micro_batches([(1, 2)] * 3, [6, 5, 5], 8) == [[1, 2], [0]]
    with pytest.raises(ConfigError, match=r"backend.micro_batch_tokens=5 is smaller than a row of 6 tokens"):
        plan_shared_micro_batches([(1, 2), None], [6, 3], 5)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=30),
    budget=st.integers(20, 120),
)
def test_every_row_is_planned_once_within_the_budget_of_packed_tokens(data, budget):
    prefixes = [tuple(range(p + 1)) for p, _ in data]  # 1-4 shared tokens
    lengths = [len(prefix) + extra for prefix, (_, extra) in zip(prefixes, data, strict=True)]
    plan = plan_shared_micro_batches(prefixes, lengths, budget)
    assert sorted(r for group in plan for r in group) == list(range(len(data)))
    for group in plan:
        units: dict[tuple, int] = {}
        for r in group:  # the packed length of each prompt's rows here (one unit per prompt at most here)
            units[prefixes[r]] = units.get(prefixes[r], len(prefixes[r])) + lengths[r] - len(prefixes[r])
        assert len(units) * max(units.values()) <= budget or len(group) == 1


@pytest.mark.parametrize("dotlist", MODES, ids=["token-mean", "seq-sum", "seq-mean", "sum-norm", "kl+minis", "gae"])
def test_micro_batches_of_shared_prompts_give_the_one_batch_gradient_of_separate_rows(dotlist):
    """16 rows of 5-7 tokens, 4 prompts of 4 tokens: micro-batches of 14 packed tokens, prompts shared,
    against one forward of the 16 rows as they are."""
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    torch.manual_seed(0)
    shared_w, shared_m = tasks.one_update(
        groups, [*dotlist, "backend.micro_batch_tokens=14", "backend.share_prompts=true"], False
    )
    torch.manual_seed(0)
    want_w, want_m = tasks.one_update(groups, [*dotlist, "backend.micro_batch_tokens=null"], False)
    shared_g, want_g = shared_m.pop("grads"), want_m.pop("grads")
    one_step = not any(d.startswith("backend.mini_batch_size") for d in dotlist)
    for key, want in want_g.items():
        if one_step:
            torch.testing.assert_close(shared_g[key], want, rtol=1e-5, atol=1e-6, msg=key)
        else:
            assert (shared_g[key] - want).norm() <= 1e-5 * want.norm(), key
    for key, want in shared_m.items():
        assert math.isclose(want, want_m[key], rel_tol=1e-5, abs_tol=1e-6), (key, want, want_m[key])


def test_the_backend_shares_prompts_for_a_pretrained_model_path_and_says_so(tmp_path):
    scratch = TorchBackend(tasks.backend_config())
    assert not scratch.actor.share_prompts and "prompts not shared" in dict(scratch.summary_rows())["memory"]
    scratch.model.save_pretrained(tmp_path)
    pretrained = TorchBackend(tasks.backend_config(f"model.path={tmp_path}", "backend.num_threads=1"))
    assert pretrained.actor.share_prompts and pretrained.rollout_batch_size > 0
    assert "prompts shared by their rollouts (computed once)" in dict(pretrained.summary_rows())["memory"]
    assert "backend.share_prompts=true" in dict(pretrained.summary_rows())["defaults"]


@pytest.mark.parametrize("model", [llama, gpt2], ids=["llama", "gpt2"])
def test_sampling_prefills_each_prompt_once_and_draws_what_separate_prefills_draw(model):
    model = model().eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14], [5, 6, 7]]
    outputs = []
    for share in (False, True):
        generator = torch.Generator().manual_seed(1)
        outputs.append(
            sample_completions(
                model,
                prompts,
                max_new_tokens=6,
                eos_token_id=0,
                pad_token_id=1,
                generator=generator,
                share_prompts=share,
            )
        )
    (ids, logps, reasons), (shared_ids, shared_logps, shared_reasons) = outputs
    assert shared_ids == ids and shared_reasons == reasons
    for row, shared_row in zip(logps, shared_logps, strict=True):
        assert shared_row == pytest.approx(row, abs=1e-5)

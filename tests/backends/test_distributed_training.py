"""The torch backend on 2 real gloo ranks: one update from fixed episodes (the same prompts,
completions and rewards, fed in, not sampled) gives the weights and metrics of one process
training on the whole batch."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import trainer_rank_tasks as tasks
from rank_pool import RankPool


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


# rank 0 holds 3 groups, rank 1 one group, with responses of 1-3 tokens: the ranks hold
# different token counts, so a mean of per-rank token means would differ from the global one
SPLITS = {"uneven": (3, 1), "rank 1 empty": (4, 0)}


@pytest.mark.parametrize("split", SPLITS, ids=list(SPLITS))
@pytest.mark.parametrize(
    "dotlist",
    [
        ["rllm.algorithm.loss_agg_mode=token-mean"],
        ["rllm.algorithm.loss_agg_mode=seq-mean-token-mean"],
        [
            "rllm.algorithm.loss_agg_mode=seq-mean-token-sum-norm",
            "rllm.algorithm.adv_estimator=reinforce_plus_plus_baseline",
        ],
        ["rllm.algorithm.loss_agg_mode=token-mean", "backend.ppo_epochs=2", "rllm.algorithm.loss_fn=cispo"],
        ["rllm.algorithm.loss_agg_mode=token-mean", "backend.parallelism=fsdp"],
        ["rllm.algorithm.loss_agg_mode=seq-mean-token-mean", "backend.parallelism=fsdp", "model.arch=llama"],
        ["rllm.algorithm.adv_estimator=gae", "backend.critic.enable=true", "rllm.algorithm.lam=0.9"],
        # micro-batches of at most 14 padded tokens (2 rows of 5-7): 6 on the rank with 3 groups, 2 on
        # the other (or 0: it runs zero-loss forwards to match the count); compared with one
        # process training the whole batch in one forward
        ["rllm.algorithm.loss_agg_mode=seq-mean-token-sum", "backend.micro_batch_tokens=14"],
        ["rllm.algorithm.loss_agg_mode=seq-mean-token-sum-norm", "backend.micro_batch_tokens=14"],
        ["rllm.algorithm.loss_agg_mode=token-mean", "backend.parallelism=fsdp", "backend.micro_batch_tokens=14"],
        [
            "rllm.algorithm.adv_estimator=gae",
            "backend.critic.enable=true",
            "backend.micro_batch_tokens=14",
            "rllm.algorithm.loss_agg_mode=seq-mean-token-mean",
        ],
        # rollout correction: the weights' mean and ESS are sums over the ranks, their max a max
        ["rllm.algorithm.rollout_correction.tis_mode=token", "rllm.algorithm.rollout_correction.tis_cap=1.01"],
    ],
    ids=[
        "token-mean",
        "seq-mean-token-mean",
        "sum-norm+reinforce++",
        "2 epochs+cispo",
        "fsdp",
        "fsdp+llama",
        "gae+critic",
        "micro-batches",
        "sum-norm+micro-batches",
        "fsdp+micro-batches",
        "gae+critic+micro-batches",
        "tis",
    ],
)
def test_one_update_on_two_ranks_gives_the_weights_of_one_process(pool, split, dotlist):
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    first, _ = SPLITS[split]
    shares = [groups[:first], groups[first:]]
    (w0, m0), (w1, m1) = pool.run_ok(tasks.one_update, [(share, dotlist, True) for share in shares])
    want_w, want_m = tasks.one_update(
        groups, [d for d in dotlist if "parallelism" not in d and "micro" not in d], False
    )
    initial = tasks.initial_weights(*[d for d in dotlist if d.startswith(("model.", "backend.critic"))])
    g0, g1, want_g = m0.pop("grads"), m1.pop("grads"), want_m.pop("grads")
    assert want_g.keys() == g0.keys() and want_g  # lm_head is tied to wte: one parameter
    for key, want in want_g.items():  # DDP's all-reduced gradient is the global loss's gradient
        assert torch.equal(g0[key], g1[key]), f"{key}: the ranks' gradients differ"
        # measured: 2.5e-7 of the norm after one step, 2.5e-6 after two (the weights of the second
        # pass carry the first step's float differences)
        assert (g0[key] - want).norm() <= 1e-5 * want.norm(), f"{key}: the gradient differs from one process's"
    for key, want in want_w.items():
        assert torch.equal(w0[key], w1[key]), f"{key}: the ranks' weights differ"
        # Adam's first step is lr * g / (|g| + eps): a gradient component near 0 (float-order noise
        # of ~1e-9 is then O(1) of it) can move by ~1e-5 in a step of lr = 1e-3, so the update is
        # compared as a whole: its difference from one process's is under 0.1% of its norm
        step = (want - initial[key]).norm()
        assert step > 0, f"{key}: the update changed nothing"
        assert (w0[key] - want).norm() <= 1e-3 * step, f"{key} differs from one process"
    assert m0 == m1, "metrics differ across ranks"
    for key, want in want_m.items():  # actor/grad_norm pins the gradient's scale, which Adam's step hides
        assert math.isclose(m0[key], want, rel_tol=1e-5, abs_tol=1e-6), (key, m0[key], want)
    assert m0.keys() == want_m.keys()


def test_a_mean_of_per_rank_token_means_would_have_been_caught(pool):
    """The check above can fail: normalising each rank by its own token count (the bug global
    aggregation avoids) moves the weights away from one process's."""
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    (_, m0), _ = pool.run_ok(tasks.local_normaliser_update, [(groups[:3],), (groups[3:],)])
    _, want_m = tasks.one_update(groups, ["rllm.algorithm.loss_agg_mode=token-mean"], False)
    assert not math.isclose(m0["actor/grad_norm"], want_m["actor/grad_norm"], rel_tol=1e-3)
    want = want_m["grads"]["transformer.wte.weight"]
    assert (m0["grads"]["transformer.wte.weight"] - want).norm() > 1e-2 * want.norm()


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft (the lora extra)")
def test_lora_adapters_on_two_ranks_train_as_on_one_process_and_the_base_stays_frozen(pool):
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    dotlist = ["model.arch=llama", "model.lora.r=4", "backend.lr=0.01", "backend.micro_batch_tokens=14"]
    (w0, m0), (w1, m1) = pool.run_ok(tasks.one_update, [(groups[:3], dotlist, True), (groups[3:], dotlist, True)])
    want_w, want_m = tasks.one_update(groups, dotlist[:-1], False)
    initial = tasks.initial_weights(*dotlist[:3])
    g0, g1, want_g = m0.pop("grads"), m1.pop("grads"), want_m.pop("grads")
    assert m0 == m1 and g0.keys() == g1.keys() == want_g.keys() and all("lora_" in k for k in g0)
    for key, want in want_g.items():
        assert torch.equal(g0[key], g1[key]) and (g0[key] - want).norm() <= 1e-5 * want.norm() + 1e-9, key
    for key, want in want_w.items():
        assert torch.equal(w0[key], w1[key]), key
        step = (want - initial[key]).norm()
        if "lora_" in key and "lora_A" not in key:  # lora_B starts at 0 and moves; A moves once B is not 0
            assert step > 0, key
        if "lora_" not in key:
            assert torch.equal(w0[key], initial[key]), f"{key}: a frozen base weight changed"
        assert (w0[key] - want).norm() <= 1e-3 * max(step, 1e-12) or torch.equal(w0[key], want), key


def test_fsdp_with_bf16_compute_trains_the_same_step_to_bf16_rounding(pool):
    """FSDP2's MixedPrecisionPolicy (bf16 parameters in the forwards, float32 gradient reduction)
    against one process in float32: the same step to bf16's rounding, identical on both ranks."""
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    dotlist = ["model.arch=llama", "backend.parallelism=fsdp", "backend.dtype=bfloat16"]
    (w0, m0), (w1, m1) = pool.run_ok(tasks.one_update, [(groups[:2], dotlist, True), (groups[2:], dotlist, True)])
    _, want_m = tasks.one_update(groups, ["model.arch=llama"], False)
    g0, g1 = m0.pop("grads"), m1.pop("grads")
    assert all(torch.equal(g0[k], g1[k]) for k in g0)
    assert m0 == m1 and all(torch.equal(w0[k], w1[k]) and w0[k].dtype == torch.float32 for k in w0)
    assert m0["actor/grad_norm"] == pytest.approx(want_m["actor/grad_norm"], rel=0.03)
    assert m0["actor/entropy"] == pytest.approx(want_m["actor/entropy"], rel=0.01)
    assert m0["actor/entropy"] != want_m["actor/entropy"]  # bf16 did run

"""Micro-batches: the plan (every row once, within the token budget, similar lengths together),
and one optimizer step over micro-batches giving the one-batch gradient for every loss
aggregation (one process here; 2 gloo ranks in test_distributed_training.py)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trainer_rank_tasks as tasks
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_torch.backends.torch_backend import micro_batches
from rllm_torch.backends.torch_backend.micro_batches import plan_micro_batches, split_rows, stage_memory
from rllm_torch.core.errors import ConfigError, OutOfMemoryError


def test_a_hand_worked_plan():
    # sorted longest first: 9, 8, 4, 3, 2 (positions 1, 3, 2, 0, 4); budget 16 padded tokens:
    # [9] (9 + 8 would pad to 18), [8, 4] (2 x 8 = 16), [3, 2] (the 3 rows 8, 4, 3 would be 24)
    assert plan_micro_batches([3, 9, 4, 8, 2], 16) == [[1], [3, 2], [0, 4]]
    assert plan_micro_batches([3, 9, 4], None) == [[0, 1, 2]]  # no budget: one micro-batch
    assert plan_micro_batches([], 16) == []


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), max_size=30), budget=st.integers(40, 200))
def test_every_row_is_in_exactly_one_micro_batch_within_the_budget(lengths, budget):
    plan = plan_micro_batches(lengths, budget)
    assert sorted(i for group in plan for i in group) == list(range(len(lengths)))
    for group in plan:
        assert group and len(group) * max(lengths[i] for i in group) <= budget
    # greedy packing by length: a micro-batch could not have taken the next one's first row
    for group, following in zip(plan, plan[1:], strict=False):
        assert (len(group) + 1) * lengths[group[0]] > budget or lengths[following[0]] > lengths[group[0]]


def test_a_row_longer_than_the_budget_names_the_setting():
    with pytest.raises(ConfigError, match=r"backend.micro_batch_tokens=8 is smaller than a row of 9 tokens.*9 or more"):
        plan_micro_batches([3, 9], 8)


def test_split_rows_indexes_the_mini_batchs_rows():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    micro = split_rows(torch.tensor([3, 1, 2]), mask, 4)  # lengths 2, 4, 1
    assert [m.tolist() for m in micro] == [[1], [3, 2]]


def test_an_allocation_failure_becomes_one_error_naming_the_stage_and_the_setting():
    with pytest.raises(
        OutOfMemoryError, match=r"out of memory while updating the policy \(.*\); lower backend.micro"
    ) as info:
        with stage_memory("updating the policy", "lower backend.micro_batch_tokens"):
            torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator's real failure
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match="other"), stage_memory("sampling", "-"):  # other errors pass through
        raise ValueError("other")


MODES = [
    ["rllm.algorithm.loss_agg_mode=token-mean"],
    ["rllm.algorithm.loss_agg_mode=seq-mean-token-sum"],
    ["rllm.algorithm.loss_agg_mode=seq-mean-token-mean"],
    ["rllm.algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
    ["rllm.algorithm.loss_agg_mode=token-mean", "rllm.algorithm.use_kl_loss=true", "backend.mini_batch_size=8"],
    ["rllm.algorithm.adv_estimator=gae", "backend.critic.enable=true", "rllm.algorithm.lam=0.9"],
]


@pytest.mark.parametrize("dotlist", MODES, ids=["token-mean", "seq-sum", "seq-mean", "sum-norm", "kl+minis", "gae"])
def test_micro_batches_give_the_one_batch_gradient(dotlist):
    """16 rows of 5-7 tokens: a budget of 14 tokens makes 8 micro-batches of 2 rows."""
    groups = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
    torch.manual_seed(0)  # the same mini-batch shuffle on both sides
    micro_w, micro_m = tasks.one_update(groups, [*dotlist, "backend.micro_batch_tokens=14"], False)
    torch.manual_seed(0)
    want_w, want_m = tasks.one_update(groups, [*dotlist, "backend.micro_batch_tokens=null"], False)
    micro_g, want_g = micro_m.pop("grads"), want_m.pop("grads")
    assert micro_g.keys() == want_g.keys() and want_g
    one_step = not any(d.startswith("backend.mini_batch_size") for d in dotlist)
    for key, want in want_g.items():
        if one_step:  # the gradient of the step, from the same weights
            torch.testing.assert_close(micro_g[key], want, rtol=0, atol=1e-6, msg=key)
        else:  # the second mini-batch's, after a first Adam step that carries float-order noise
            assert (micro_g[key] - want).norm() <= 1e-5 * want.norm(), key
    initial = tasks.initial_weights(*[d for d in dotlist if d.startswith(("model.", "backend.critic"))])
    for key, want in want_w.items():  # Adam's first step magnifies float-order noise of near-0 gradients:
        step = (want - initial[key]).norm()  # the update is compared as a whole (as across ranks)
        assert step > 0 and (micro_w[key] - want).norm() <= 1e-3 * step, key
    assert micro_m.keys() == want_m.keys()
    for key, want in want_m.items():
        assert math.isclose(micro_m[key], want, rel_tol=1e-5, abs_tol=1e-6), (key, micro_m[key], want)


@pytest.mark.skipif(micro_batches._glibc() is None, reason="glibc's mallinfo2 and malloc_trim only")
def test_release_host_memory_returns_the_freed_heap_to_the_operating_system_above_its_threshold():
    """400 freed 1 MiB tensors between live ones: the heap keeps their pages until released."""

    micro_batches.map_host_tensors(32 * 2**20)  # glibc's own largest threshold: 1 MiB blocks come from the heap
    tensors = [torch.ones(2**18) for _ in range(800)]
    kept = tensors[1::2]  # every other block stays: the freed ones are holes, not the heap's top
    del tensors
    before = resident_mib()
    assert not micro_batches.release_host_memory(min_free_bytes=2**50)  # below the threshold: kept
    assert resident_mib() > before - 50
    assert micro_batches.release_host_memory(min_free_bytes=300 * 2**20)
    assert before - resident_mib() > 300
    assert len(kept) == 400
    micro_batches.map_host_tensors()


def resident_mib() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


STEP_FAULTS = """
import resource, sys
import torch
from rllm_torch.backends.torch_backend import micro_batches

if sys.argv[1] != "default":
    micro_batches.map_host_tensors(int(sys.argv[1]))
else:
    micro_batches.map_host_tensors()
kept = []
for _ in range(50):  # a step's pattern: temporaries of a few MiB freed between blocks that stay
    temporaries = [torch.ones(2**20), torch.ones(3 * 2**20)]  # 4 and 12 MiB
    kept.append(torch.ones(2**18))  # 1 MiB that stays (a gradient)
    del temporaries
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # the next steps' temporaries, and one of 20 MiB that only the heap's top holds
    temporaries = [torch.ones(2**20), torch.ones(3 * 2**20), torch.ones(5 * 2**20)]
    del temporaries
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50, len(kept))
"""


@pytest.mark.skipif(micro_batches._glibc() is None, reason="glibc's mallopt only")
@pytest.mark.parametrize("threshold", ["default", str(2**20)], ids=["default", "mapped-1MiB"])
def test_a_steps_temporaries_reuse_kept_pages_instead_of_faulting_fresh_ones(threshold):
    """The torch backend's heap setting serves a step's temporaries (4, 12 and 20 MiB: 9,216 pages
    a round) from pages the heap kept, the top's included (glibc's default trim threshold would give
    those back at every free): almost no page faults. Mapped each on its own (the 1 MiB threshold
    issue 43 set, which made the recipe's update 1.6x slower) every round faults them all in again.
    In a process of its own, so that no earlier test's heap serves them."""
    done = subprocess.run(
        [sys.executable, "-c", STEP_FAULTS, threshold], capture_output=True, text=True, timeout=120, check=True
    )
    faults, kept = done.stdout.split()
    assert kept == "50"
    if threshold == "default":
        assert float(faults) < 900, faults  # under a tenth of the 9,216 pages a round touches
    else:
        assert float(faults) > 8000, faults


def test_the_torch_backend_sets_the_host_heap_on_a_cpu_device(monkeypatch):
    """The heap setting is the backend's to make, once, at start-up on a CPU device (its real call
    runs; the wrapper only records it)."""
    from rllm_torch.backends.torch_backend import backend as backend_module

    calls = []

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return micro_batches.map_host_tensors(*args, **kwargs)

    monkeypatch.setattr(backend_module, "map_host_tensors", recorded)
    backend_module.TorchBackend(tasks.backend_config())
    assert calls == [((), {})]  # the default: HOST_MMAP_THRESHOLD_BYTES


@pytest.mark.skipif(micro_batches._glibc() is None, reason="glibc's mallopt only")
def test_the_heap_setting_is_glibcs_mmap_threshold_at_32_mib_and_its_trim_threshold_at_twice_that(monkeypatch):
    """glibc has no getter for either threshold, and whether a freed block sits at the heap's top
    (where the trim threshold acts) varies from process to process, so the calls themselves are
    checked, against malloc.h's parameter numbers (M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3); the
    real mallopt still runs."""
    mallinfo2, malloc_trim, mallopt = micro_batches._glibc()
    calls = []

    def recorded(parameter, value):
        calls.append((parameter, value))
        return mallopt(parameter, value)

    monkeypatch.setattr(micro_batches, "_glibc", lambda: (mallinfo2, malloc_trim, recorded))
    assert micro_batches.map_host_tensors()
    assert sorted(calls) == [(-3, 32 * 2**20), (-1, 64 * 2**20)]

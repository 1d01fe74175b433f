"""The worked cases of shared/cases/estimators.json, through every entry point."""

import json

import numpy as np
import pytest
import torch
from conftest import DATA, SHARED_CASES, load_cases

from rllm_torch import GroupedRewards, compute_advantages, get_rllm_adv_estimator

CASES = load_cases()
RTOL, ATOL = 1e-5, 1e-6


def _tensor_groups(case):
    dtype = getattr(torch, case["reward_dtype"])
    return [torch.tensor(g, dtype=dtype) for g in case["groups"]]


def _expected(case):
    return np.concatenate([np.asarray(e, dtype=np.float64) for e in case["expected"]])


def test_the_vendored_copy_of_the_cases_matches_shared_when_shared_exists():
    if not SHARED_CASES.exists():
        pytest.skip("no ../shared checkout beside this repository")
    assert json.loads(SHARED_CASES.read_text()) == json.loads((DATA / "estimators.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_through_the_tensor_api_from_groups(case):
    adv, ret = compute_advantages(GroupedRewards.from_groups(_tensor_groups(case)), case["estimator"], **case["params"])
    np.testing.assert_allclose(adv.numpy(), _expected(case), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ret.numpy(), _expected(case), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_through_the_tensor_api_shuffled_flat(case):
    groups = _tensor_groups(case)
    flat = torch.cat(groups)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    perm = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))
    adv, _ = compute_advantages(
        GroupedRewards.from_flat(flat[perm], index[perm], num_groups=len(groups)), case["estimator"], **case["params"]
    )
    np.testing.assert_allclose(adv.numpy(), _expected(case)[perm.numpy()], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_through_the_rllm_list_api(case):
    params = dict(case["params"])
    dtype = np.dtype(case["reward_dtype"])
    fn = get_rllm_adv_estimator(case["estimator"])
    advantages, returns = fn(rewards=[np.asarray(g, dtype=dtype) for g in case["groups"]], **params)
    assert len(advantages) == len(returns) == len(case["groups"])
    for got, want in zip(advantages, case["expected"], strict=True):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)

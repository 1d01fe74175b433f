"""verl's ``k3+`` (k3's value, k2's gradient) and TRL's bias-corrected k3, against their formulas."""

from __future__ import annotations

import pytest
import torch

from rllm_torch.core.losses import KL_ESTIMATORS, bias_corrected_kl, kl_penalty


@pytest.mark.parametrize("base", ["kl", "abs", "low_var_kl", "k3", "k1"])
def test_a_plus_estimator_has_the_estimators_value_and_k2s_gradient(base):
    ref = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    logp = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(logp, ref, base + "+")
    torch.testing.assert_close(value, kl_penalty(logp, ref, base), rtol=0, atol=0)
    value.sum().backward()
    torch.testing.assert_close(logp.grad, (logp - ref).detach())  # d/dlogp of 0.5 (logp - ref)^2


def test_the_plus_names_are_estimators_the_config_accepts():
    assert {"k3+", "low_var_kl+", "k2+"} <= set(KL_ESTIMATORS)


def test_the_bias_corrected_k3_is_k3_times_the_ratio_with_gradient_through_both():
    ref, old = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[-1.2]], dtype=torch.float64)
    logp = torch.tensor([[-1.1]], dtype=torch.float64, requires_grad=True)
    corrected = bias_corrected_kl(kl_penalty(logp, ref, "k3"), logp, old)
    d = ref - logp.detach()
    k3, ratio = d.exp() - d - 1, (logp.detach() - old).exp()
    torch.testing.assert_close(corrected.detach(), k3 * ratio)
    corrected.sum().backward()
    torch.testing.assert_close(logp.grad, ratio * (1 - d.exp()) + k3 * ratio)  # product rule

"""A built-in loss is declared once, beside its function (``BuiltinLoss``): every option of the
function is read from a named run setting or fixed by the declaration, which is refused, naming
the loss, the option and where to declare it, when it is not; a setting the run's schema lacks is
refused by ``check_loss_settings``; a name declared on another loss's function (``gspo`` on PPO's)
overrides what it fixes. Expected values are worked by hand in the comments."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from rllm_torch.core.errors import ConfigError, LossDeclarationError
from rllm_torch.core.losses import (
    POLICY_LOSSES,
    Aggregation,
    BuiltinLoss,
    LossContext,
    check_loss_settings,
    gspo_loss,
    register_loss,
    resolve_loss,
)
from rllm_torch.core.losses.declaration import builtin_loss


def _gate(ctx: LossContext, *, tau: float = 1.0, beta: float = 0.5):
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr * tau * beta, ctx.action_mask), {}


def test_a_loss_option_without_a_setting_is_refused_when_the_loss_is_declared():
    with pytest.raises(LossDeclarationError) as caught:
        BuiltinLoss("my_gate", _gate, {"tau": "backend.tau_pos"})
    message = str(caught.value)
    assert "loss 'my_gate': option 'beta'" in message and "has no setting" in message
    assert "settings={..., 'beta': 'backend.beta'}" in message and "trainer/backend_schema.py" in message
    assert isinstance(caught.value, ConfigError)  # a typed error, a ValueError for callers who know no better
    with pytest.raises(LossDeclarationError, match=r"loss 'my_gate': option 'beta'"):  # the decorator alike
        builtin_loss("my_gate", {"tau": "backend.tau_pos"})(_gate)


def test_a_loss_option_is_declared_by_a_setting_or_by_a_fixed_value():
    read = BuiltinLoss("my_gate", _gate, {"tau": "backend.tau_pos", "beta": "backend.dro_beta"})
    fixed = BuiltinLoss("my_gate", _gate, {"tau": "backend.tau_pos"}, fixed={"beta": 2.0})
    assert read.options == {"tau", "beta"} and fixed.options == {"tau"}
    logp, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[3.0]]), torch.ones(1, 1)
    # -A log pi tau beta = -3 * -1 * 0.5 * 2 = 3
    assert fixed(logp, logp, adv, mask, tau=0.5)[0].item() == pytest.approx(3.0)


def test_a_declared_option_the_function_does_not_take_is_refused():
    with pytest.raises(LossDeclarationError, match=r"loss 'my_gate' declares options \['gamma'\] that .*_gate"):
        BuiltinLoss("my_gate", _gate, {"tau": "backend.tau_pos", "beta": "backend.dro_beta", "gamma": "backend.x"})


def test_every_built_in_loss_declares_each_option_of_its_function():
    for name, loss in POLICY_LOSSES.items():
        parameters = inspect.signature(loss.fn).parameters.values()
        keyword = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert keyword == set(loss.settings) | set(loss.fixed), name


def test_a_setting_the_runs_schema_lacks_is_refused_naming_the_loss_the_option_and_where():
    with pytest.raises(LossDeclarationError) as caught:
        check_loss_settings(lambda key: key != "backend.tau_neg")
    message = str(caught.value)
    assert "loss 'sapo': option 'tau_neg' is read from the setting 'backend.tau_neg'" in message
    assert "trainer/backend_schema.py" in message and "rllm_torch.core.losses.soft_gate" in message
    check_loss_settings(lambda key: True)  # every declared setting present: nothing to refuse
    seen = []
    check_loss_settings(lambda key: seen.append(key) or True)
    # dro's beta is read from backend.dro_beta, the ratio level from the algorithm's setting; a
    # registered loss's eps_clip from the clip range; clip_cov's random_keys from none
    assert {"backend.dro_beta", "rllm.algorithm.importance_sampling_level", "backend.clip_ratio_low"} <= set(seen)
    assert None not in seen and "backend.beta" not in seen


# GSPO's hand table (tests/backends/test_sequence_ratio_and_dual_clip.py): s_0 = e^0.2 = 1.2214 is
# clipped at 1.2 with A = 1, l = -1.2; s_1 = e^-0.3 with A = -2, l = -min(0.7408 * -2, 0.8 * -2) = 1.6;
# seq-mean-token-mean (-1.2 + 1.6) / 2 = 0.2. Per token the ratios differ: it would be another number.
LOG_RATIO = torch.tensor([[0.3, -0.1, 0.4], [-0.5, -0.1, 2.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=torch.float64)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_fixed_option_overrides_the_one_given(level):
    loss, _ = gspo_loss(LOGP, LOGP - LOG_RATIO, ADV, MASK, importance_sampling_level=level)
    assert loss.item() == pytest.approx(0.2, abs=1e-12)


def test_a_declaration_refuses_an_option_its_loss_does_not_take_and_a_wrong_number_of_tensors():
    with pytest.raises(TypeError, match=r"loss 'gspo' takes no option \['clip_ratio_c'\]"):
        gspo_loss(LOGP, LOGP, ADV, MASK, clip_ratio_c=3.0)
    with pytest.raises(TypeError, match=r"loss 'cross_entropy' takes 3 tensors, got 4"):
        POLICY_LOSSES["cross_entropy"](LOGP, LOGP, ADV, MASK)


@register_loss("test_declared_nll")
def _registered_nll(ctx: LossContext):
    """cross_entropy's -A log pi, written as a user writes it."""
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {"nll": torch.tensor(0.0)}


def test_a_built_in_and_a_registered_loss_of_the_same_math_are_called_alike_on_one_context():
    """The update's one call, ``loss.compute(ctx)``, on the same context; -A log pi by hand:
    row 0 -(1 * -1 + 1 * -0.5 + 1 * -2) = 3.5, row 1 -(-2 * -0.3 + -2 * -1.2) = -3.0;
    seq-mean-token-sum over 4 sequences of the global mini-batch: (3.5 - 3.0) / 4 = 0.125."""
    ctx = LossContext(
        logp_curr=LOGP,
        logp_old=LOGP - LOG_RATIO,
        advantages=ADV,
        action_mask=MASK,
        obs_mask=torch.zeros_like(MASK),
        aggregate=Aggregation("seq-mean-token-sum", normaliser=torch.tensor(4.0)),
    )
    built_in, stats = resolve_loss("cross_entropy").compute(ctx)
    registered, metrics = resolve_loss("test_declared_nll").compute(ctx)
    assert built_in.item() == pytest.approx(0.125) and torch.equal(built_in, registered)
    assert set(stats) == {"nll"} and set(metrics) == {"test_declared_nll/nll"}  # a user's under its name
    assert math.isclose(stats["nll"].item(), (1 + 0.5 + 2 + 0.3 + 1.2) / 5)  # token mean of -log pi


def test_an_unknown_loss_name_is_refused_listing_the_losses():
    with pytest.raises(ConfigError, match=r"policy loss 'nonsense' is neither built in nor registered; .*'ppo'"):
        resolve_loss("nonsense")

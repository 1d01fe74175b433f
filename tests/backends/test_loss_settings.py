"""Where the torch backend's update reads each loss's options: the run settings the loss's
declaration names (``loss_params``), each checked against the run's schema when the backend is
imported, so a loss option without a setting stops the import naming the loss, the option and
where to declare it, not the first update with a ``KeyError``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from trainer_rank_tasks import backend_config

from rllm_torch.backends.torch_backend.loss_settings import is_run_setting, loss_params
from rllm_torch.core.losses import LossContext, register_loss
from rllm_torch.rllm.plan import RoleLoss


@pytest.mark.parametrize(
    "key, setting",
    [
        ("backend.tau_pos", True),
        ("backend.dro_beta", True),
        ("rllm.algorithm.importance_sampling_level", True),
        ("backend.critic.cliprange_value", True),
        ("backend.beta", False),  # dro's option is named beta; its setting is backend.dro_beta
        ("backend.tau_pos.x", False),
        ("backend", False),  # a section, not a setting
        ("backend.critic", False),
        ("rllm.algorithm.nonsense", False),
    ],
)
def test_a_setting_of_the_runs_schema_is_a_field_of_its_sections(key, setting):
    assert is_run_setting(key) is setting


@register_loss("test_settings_pg")
def _pg(ctx: LossContext):
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


def test_each_loss_reads_its_options_from_the_settings_its_declaration_names():
    config = backend_config(
        "backend.tau_pos=0.7",
        "backend.tau_neg=1.3",
        "backend.dro_beta=0.25",
        "backend.clip_ratio_low=0.1",
        "backend.clip_ratio_high=0.3",
        "backend.clip_ratio_c=2.5",
        "backend.delta=1.7",
        "rllm.algorithm.importance_sampling_level=sequence",
        "rllm.algorithm.loss_params={my_scale: 4}",
    )
    assert loss_params(RoleLoss.of("sapo"), config) == {
        "tau_pos": 0.7,
        "tau_neg": 1.3,
        "importance_sampling_level": "sequence",
    }
    assert loss_params(RoleLoss.of("dro"), config) == {"beta": 0.25}
    assert loss_params(RoleLoss.of("cross_entropy"), config) == {}
    assert loss_params(RoleLoss.of("vanilla"), config) == {
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.3,
        "clip_ratio_c": 2.5,
    }
    assert loss_params(RoleLoss.of("luspo"), config) == {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "delta": 1.7}
    assert loss_params(RoleLoss.of("clip_cov"), config) == {  # random_keys: a direct call's, never a run's
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.3,
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
    }
    # a registered loss: rLLM's parameters, then the user's own
    assert loss_params(RoleLoss.of("test_settings_pg"), config) == {
        "eps_clip": 0.1,
        "eps_clip_high": 0.3,
        "kl_beta": 0.0,
        "my_scale": 4,
    }


def test_importing_the_backend_refuses_a_loss_option_whose_setting_the_schema_lacks():
    """A loss declared with an option read from ``backend.tau_gate``, which no schema declares:
    importing the torch backend stops, naming the loss, the option and where to declare it."""
    code = textwrap.dedent(
        """
        from rllm_torch.core.losses import policy
        from rllm_torch.core.losses.declaration import BuiltinLoss

        def gate(ctx, *, tau=1.0):
            return ctx.aggregate(ctx.logp_curr, ctx.action_mask), {}

        policy.POLICY_LOSSES["my_gate"] = BuiltinLoss("my_gate", gate, {"tau": "backend.tau_gate"})
        import rllm_torch.backends.torch_backend
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rllm_torch.core.errors.LossDeclarationError: loss 'my_gate': option 'tau'")
    assert "'backend.tau_gate'" in last and "trainer/backend_schema.py" in last

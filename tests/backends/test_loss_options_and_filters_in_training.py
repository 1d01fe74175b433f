"""The 2026 loss options and off-policy filters in a real training step of the torch backend
(top-entropy quantile, OPSM, rollout rejection sampling, IcePop, k3+ and the bias-corrected KL,
TRL's delta), their metrics, and the start-up errors of settings that cannot go together."""

from __future__ import annotations

import json

import pytest
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.config_checks import check_run_config

TINY = (
    *TINY_STEPS,
    "rllm.algorithm.adv_estimator=reinforce",
)
#: Where every option has something to act on: rewards that are not all 0 (one-token answers), negative
#: advantages (grpo), a second PPO epoch that moves the policy (lr 0.05), and a step 2 whose batch was
#: sampled one policy version back (async, staleness 1: the sampler's log-probs are not the trainer's).
OFF_POLICY = (
    *TINY_STEPS,
    "rllm.algorithm.adv_estimator=grpo",
    "rllm.rollout.max_new_tokens=1",
    "backend.ppo_epochs=2",
    "backend.lr=0.05",
    "task.train_size=16",
    "rllm.async_training.enable=true",
    "rllm.async_training.staleness_threshold=1",
)


def train_rows(tmp_path, *overrides):
    run(make_config(tmp_path, *overrides))
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "actor/loss" in line]


@pytest.fixture(scope="module")
def option_off(tmp_path_factory):
    return train_rows(tmp_path_factory.mktemp("off"), *OFF_POLICY)


def _step(row: dict) -> tuple[float, float]:
    return row["actor/loss"], row["actor/grad_norm"]


@pytest.mark.parametrize(
    "overrides, check",
    [
        (("backend.top_entropy_quantile=0.2",), lambda r: all(0.6 <= x["actor/entropy_masked"] <= 0.8 for x in r)),
        (
            ("rllm.algorithm.rollout_correction.off_policy_mask_threshold=0.0",),
            lambda r: r[1]["actor/off_policy_masked"] > 0,
        ),
        (
            (
                "rllm.algorithm.rollout_correction.rollout_rs=token_k2,seq_mean_k1",
                "rllm.algorithm.rollout_correction.rollout_rs_threshold=1e-9,0.999_1.001",
            ),
            # on-policy (step 1) the sampler's and the trainer's log-probs agree: nothing is rejected
            lambda r: (
                r[0]["rollout_corr/rollout_rs_masked_fraction"] == 0
                and r[1]["rollout_corr/rollout_rs_masked_fraction"] > 0
            ),
        ),
        (
            (
                "rllm.algorithm.rollout_correction.tis_mode=token_mask",
                "rllm.algorithm.rollout_correction.tis_cap=5",
                "rllm.algorithm.rollout_correction.tis_cap_lower=0.5",
            ),
            lambda r: (
                r[0]["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-6)
                and r[1]["rollout_corr/weight_mean"] != pytest.approx(1.0, abs=1e-3)
                and r[1]["rollout_corr/clip_fraction"] > 0
            ),
        ),
        (
            (
                "rllm.algorithm.use_kl_loss=true",
                "rllm.algorithm.kl_loss_type=k3+",
                "rllm.algorithm.use_bias_correction_kl=true",
            ),
            lambda r: all(x["actor/kl_loss"] > 0 for x in r),
        ),
        (("backend.delta=1.01",), lambda r: True),
    ],
    ids=["top_entropy_quantile", "opsm", "rollout_rs", "tis_token_mask", "k3+_bias_corrected_kl", "delta"],
)
def test_each_option_changes_the_step_it_acts_on(tmp_path, option_off, overrides, check):
    """Each option against the same run with it off: its metric says it acted, and the step's loss
    or gradient differs (a setting dropped on the way to the loss would leave them equal)."""
    rows = train_rows(tmp_path, *OFF_POLICY, *overrides)
    assert len(rows) == 2 and [r["async/staleness_max"] for r in rows] == [0, 1]
    assert check(rows), rows
    assert any(
        _step(on) != pytest.approx(_step(off), rel=1e-4, abs=1e-6) for on, off in zip(rows, option_off, strict=True)
    )


def test_the_entropy_quantile_leaves_out_about_four_fifths_of_the_tokens(tmp_path):
    (first, _) = train_rows(tmp_path, *TINY, "backend.top_entropy_quantile=0.2")
    assert 0.6 <= first["actor/entropy_masked"] <= 0.8  # ties of a random tiny model keep a few more


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ("backend.delta=2", "rllm.algorithm.loss_fn=cispo"),
            r"backend.delta=2.0 is TRL's two-sided clip.*use one of rllm.algorithm.loss_fn=ppo, luspo",
        ),
        (
            ("rllm.algorithm.loss_fn=luspo",),
            r"luspo: luspo weights each sequence.s loss by its length .* needs loss_agg_mode=seq-mean-token-sum",
        ),
        (("rllm.algorithm.use_bias_correction_kl=true",), r"set rllm.algorithm.use_kl_loss=true too"),
        (
            ("rllm.algorithm.rollout_correction.tis_cap_lower=0.5",),
            r"tis_cap_lower=0.5 is the lower cap of a mask mode",
        ),
        (
            ("rllm.algorithm.rollout_correction.rollout_rs=token_k1",),
            r"rollout_rs='token_k1': rollout_rs='token_k1' needs rollout_rs_threshold",
        ),
        (
            (
                "rllm.algorithm.rollout_correction.rollout_rs=token_k3",
                "rllm.algorithm.rollout_correction.rollout_rs_threshold=0.1_0.2",
            ),
            r"token_k3 takes one upper bound",
        ),
        (("rllm.algorithm.rollout_correction.rollout_rs_threshold=0.1",), r"rollout_rs_threshold is set but"),
        (
            ("backend.tau_pos=0", "rllm.algorithm.loss_fn=sapo"),
            r"backend.tau_pos=0.0 is out of range; it must be in \[0.0001, 10000.0\]",
        ),
        (("backend.top_entropy_quantile=1.5",), r"backend.top_entropy_quantile=1.5 is out of range"),
        (("rllm.algorithm.kl_loss_type=k4+", "rllm.algorithm.use_kl_loss=true"), r"kl_loss_type='k4\+' is not one of"),
        (("rllm.algorithm.loss_fn=gmpo",), r"loss_fn: 'gmpo' is not one of"),
        # values whose loss overflows float32 (all passed the start-up checks before, and made every weight NaN)
        (("rllm.algorithm.loss_fn=dro", "backend.dro_beta=inf"), r"backend.dro_beta=inf is out of range"),
        (("rllm.algorithm.loss_fn=sapo", "backend.tau_pos=1e-40"), r"backend.tau_pos=1e-40 is out of range"),
        (("rllm.algorithm.loss_fn=vespo", "backend.vespo_k_pos=nan"), r"backend.vespo_k_pos=nan is out of range"),
        (("rllm.algorithm.loss_fn=geo_mean", "backend.clip_ratio_high=1e300"), r"clip_ratio_high=1e\+300 is out of"),
        (("backend.top_entropy_quantile=0",), r"top_entropy_quantile=0.0 is out of range; it must be in \(0, 1\]"),
        (
            ("rllm.algorithm.loss_fn=clip_cov", "backend.clip_cov_lb=5", "backend.clip_cov_ub=1"),
            r"clip_cov_lb=5.0 must be below clip_cov_ub=1.0",
        ),
    ],
)
def test_settings_that_cannot_work_stop_the_run_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(make_config(tmp_path, *TINY, *overrides))

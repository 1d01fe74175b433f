"""What an estimator declares it needs reaches the backend, whichever way the estimator is named:
the run's ``adv_estimator``, a role of ``estimator_map``, or an ``(estimator, loss)`` pair; a
user's estimator that declares ``needs=("old_log_probs",)`` gets the old policy's log-probs."""

from __future__ import annotations

import json

import torch
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch import register_rllm_adv_estimator
from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.cli.train_command import run

# one-token answers: rewards are not all 0 under a random policy
STEPS = (*TINY_STEPS, "rllm.rollout.max_new_tokens=1")


def _rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/", "perf/"))} for r in rows]


def test_optimal_token_baseline_in_a_role_pair_trains_as_the_runs_estimator(tmp_path):
    """``estimator_map={solver:[optimal_token_baseline,ppo]}`` (the arithmetic task's one role is
    ``solver``) needs ``sum_pi_squared`` as much as ``adv_estimator=optimal_token_baseline``: the
    two runs are the same run, step for step."""
    by_role, by_run = tmp_path / "role", tmp_path / "run"
    run(make_config(by_role, *STEPS, "rllm.algorithm.estimator_map={solver:[optimal_token_baseline,ppo]}"))
    run(make_config(by_run, *STEPS, "rllm.algorithm.adv_estimator=optimal_token_baseline"))
    role_rows, run_rows = _rows(by_role), _rows(by_run)
    assert len(role_rows) == 2 and role_rows == run_rows
    assert any(r["batch/reward"] > 0 for r in role_rows)  # advantages that are not all 0 were compared


class RecordingTorchBackend(TorchBackend):
    """The torch backend that keeps each step's sampler log-probs (the episodes' own)."""

    sampled: list[tuple[torch.Tensor, torch.Tensor]] = []

    async def update_policy(self, trainer_state):
        batch = trainer_state.backend_batch
        RecordingTorchBackend.sampled.append((batch.rollout_log_probs.clone(), batch.response_mask.clone()))
        await super().update_policy(trainer_state)


SEEN: list[torch.Tensor | None] = []


def surprisal_advantage(batch):
    """A token-level estimator that reads the old policy's log-probs: each token's advantage is
    its reward minus its surprisal under the old policy."""
    SEEN.append(None if batch.old_log_probs is None else batch.old_log_probs.clone())
    adv = (batch.token_level_rewards + batch.old_log_probs) * batch.response_mask
    return adv, adv


def test_a_users_estimator_that_needs_old_log_probs_gets_the_old_policys(tmp_path, monkeypatch):
    """With one update per step the backend computes no old log-probs unless asked (the update's
    own forward has them); the estimator's declaration asks. On-policy they are the sampler's
    log-probs of the same tokens (to float32 rounding)."""
    from rllm_torch.cli import train_command

    monkeypatch.setattr(train_command, "backend_class", lambda name: RecordingTorchBackend)
    # registered here, not at import: the registry's every-estimator tests are collected without it
    register_rllm_adv_estimator("test_surprisal_advantage", form="tokens", needs=("old_log_probs",))(
        surprisal_advantage
    )
    SEEN.clear()
    RecordingTorchBackend.sampled = []
    run(make_config(tmp_path, *STEPS, "rllm.algorithm.adv_estimator=test_surprisal_advantage"))
    check, *steps = SEEN  # the start-up check calls it once on a synthetic group
    assert len(steps) == 2 and all(old is not None for old in steps)
    for old, (sampled, mask) in zip(steps, RecordingTorchBackend.sampled, strict=True):
        trained = mask > 0
        assert trained.any() and (old[~trained] == 0).all()
        torch.testing.assert_close(old[trained], sampled[trained], atol=1e-5, rtol=0)
    rows = [r for r in _rows(tmp_path) if "actor/loss" in r]
    assert len(rows) == 2 and all(r["actor/grad_norm"] > 0 for r in rows)  # the advantages trained the policy


def test_an_outcome_estimator_cannot_declare_a_per_token_input():
    import pytest

    from rllm_torch.core.errors import EstimatorRegistrationError

    with pytest.raises(EstimatorRegistrationError, match=r"needs \['old_log_probs'\], which are per response token"):
        register_rllm_adv_estimator("test_outcome_with_log_probs", form="tensors", needs=("old_log_probs",))(
            lambda batch: (batch.rewards, batch.rewards)
        )

"""The plan is what runs: every estimator and loss a run names is resolved and bound when the
trainer starts (:class:`~rllm_torch.rllm.plan.AdvantagePlan`), and a training step consults no
registry after that. Counted on a real run of the torch backend with two roles, each with its own
estimator and loss, one of them ``remax`` (greedy baselines) and one a registered loss."""

from __future__ import annotations

import json

import pytest
from trainer_fakes import TwoRoleWorkflow, make_config

import rllm_torch.core.losses.registry as loss_registry
import rllm_torch.rllm.dispatch as dispatch
import rllm_torch.rllm.registry as estimator_registry
from rllm_torch import UnifiedTrainer, register_loss
from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.rllm.plan import AdvantagePlan

TRAIN = [{"prompt": f"abcdefghij{i}"} for i in range(4)]  # a vocabulary past the workflow's token ids 5-9


class CountingDict(dict):
    """A registry's dict that counts every read."""

    reads = 0

    def _read(self):
        CountingDict.reads += 1

    def __getitem__(self, key):
        self._read()
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._read()
        return super().get(key, default)

    def __contains__(self, key):
        self._read()
        return super().__contains__(key)

    def __iter__(self):
        self._read()
        return super().__iter__()


@register_loss("plan_test_pg")
def _registered_pg(ctx):
    """A plain policy gradient through the registered-loss path (a context), so the update's
    registered branch runs."""
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


@pytest.fixture
def counted(monkeypatch):
    """Count from here on: registry reads, estimator bindings and plans built."""
    calls = {"bind": 0, "plan": 0}
    bind, plan_init = dispatch.bind_estimator, AdvantagePlan.__init__

    def counting_bind(*args, **kwargs):
        calls["bind"] += 1
        return bind(*args, **kwargs)

    def counting_plan(self, *args, **kwargs):
        calls["plan"] += 1
        plan_init(self, *args, **kwargs)

    def start() -> dict:
        CountingDict.reads = 0
        monkeypatch.setattr(estimator_registry, "_REGISTRY", CountingDict(estimator_registry._REGISTRY))
        monkeypatch.setattr(loss_registry, "_LOSSES", CountingDict(loss_registry._LOSSES))
        monkeypatch.setattr(dispatch, "bind_estimator", counting_bind)
        monkeypatch.setattr(AdvantagePlan, "__init__", counting_plan)
        return calls

    return start


def two_role_trainer(tmp_path, pairs):
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=2",
        "rllm.trainer.val_before_train=false",
        "rllm.trainer.test_freq=0",
        "backend.device=cpu",
    )
    return UnifiedTrainer(TorchBackend, config, TwoRoleWorkflow, TRAIN, None, traj_group_adv_estimator_map=pairs)


def test_a_two_role_run_with_remax_and_per_role_losses_looks_nothing_up_after_start_up(tmp_path, counted):
    pairs = {"solver": ("remax", "plan_test_pg"), "judge": ("rloo", "cispo")}
    trainer = two_role_trainer(tmp_path, pairs)
    plan = trainer.settings.plan
    assert (plan.role("solver").estimator.name, plan.role("solver").loss.name) == ("remax", "plan_test_pg")
    assert (plan.role("judge").estimator.name, plan.role("judge").loss.name) == ("rloo", "cispo")
    calls = counted()
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "advantage/solver/mean" in r and "advantage/judge/mean" in r]
    assert len(trained) == 2 and all("batch/remax_greedy_reward" in r for r in trained)  # both roles, remax's baselines
    assert (CountingDict.reads, calls["bind"], calls["plan"]) == (0, 0, 0)


def test_the_count_sees_a_lookup_when_a_step_resolves_an_estimator_by_name(tmp_path, counted):
    # the counter itself: a name resolved during the run is seen (the test above cannot pass vacuously)
    calls = counted()
    estimator_registry.registration("grpo")
    dispatch.bind_estimator("grpo")
    assert CountingDict.reads > 0 and calls["bind"] == 1

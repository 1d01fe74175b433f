"""UnifiedTrainer's keyword arguments: a misspelt one or one of rLLM's agent-flow arguments stops
the start with the name and the fix (never silently ignored); rLLM's ``store`` reaches the workflows."""

from __future__ import annotations

import pytest
from trainer_fakes import RecordingBackend, TwoRoleWorkflow, make_config

from rllm_torch.core.errors import UnknownArgumentError
from rllm_torch.trainer.unified_trainer import UnifiedTrainer

TRAIN = [{"prompt": "a"}, {"prompt": "b"}]


def config(tmp_path):
    return make_config(tmp_path, "data.train_batch_size=2", "rllm.rollout.n=2", "rllm.trainer.total_batches=1")


@pytest.mark.parametrize(
    ("given", "suggested"),
    [
        ("traj_grouping_hok", "traj_grouping_hook"),
        ("traj_group_adv_estimator", "traj_group_adv_estimator_map"),
        ("stop_signal", "stop_signals"),
        ("run_file", "run_files"),
    ],
)
def test_a_misspelt_keyword_argument_is_refused_naming_the_closest_one(tmp_path, given, suggested):
    with pytest.raises(UnknownArgumentError, match=rf"unknown keyword argument {given}=; did you mean {suggested}=\?"):
        UnifiedTrainer(RecordingBackend, config(tmp_path), TwoRoleWorkflow, TRAIN, **{given: None})


def test_a_keyword_argument_like_no_other_lists_what_the_trainer_takes(tmp_path):
    with pytest.raises(UnknownArgumentError, match=r"unknown keyword argument zzz=; it takes: backend_cls, config, "):
        UnifiedTrainer(RecordingBackend, config(tmp_path), TwoRoleWorkflow, TRAIN, zzz=1)


@pytest.mark.parametrize("name", ["agent_flow", "evaluator", "hooks", "backend_name"])
def test_rllms_agent_flow_arguments_are_refused_as_not_implemented(tmp_path, name):
    with pytest.raises(UnknownArgumentError, match=rf"UnifiedTrainer\({name}=\.\.\.\) is rLLM's .* not implement"):
        UnifiedTrainer(RecordingBackend, config(tmp_path), TwoRoleWorkflow, TRAIN, **{name: object()})


def test_the_error_is_a_type_error_as_pythons_own_for_an_unexpected_argument(tmp_path):
    with pytest.raises(TypeError):
        UnifiedTrainer(RecordingBackend, config(tmp_path), TwoRoleWorkflow, TRAIN, backend_arg={})


class StoreWorkflow(TwoRoleWorkflow):
    seen: list = []

    def __init__(self, rollout_engine, store=None, **kwargs):
        super().__init__(rollout_engine, **kwargs)
        StoreWorkflow.seen.append(store)


def test_rllms_store_reaches_every_workflow_as_its_store_argument(tmp_path):
    store = {"shared": []}
    StoreWorkflow.seen.clear()
    trainer = UnifiedTrainer(RecordingBackend, config(tmp_path), StoreWorkflow, TRAIN, workflow_args={}, store=store)
    trainer.fit()
    trainer.shutdown()
    assert StoreWorkflow.seen and all(seen is store for seen in StoreWorkflow.seen)

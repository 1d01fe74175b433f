# rLLM's tests/unified_trainer/test_termination_metrics.py (https://github.com/rllm-org/rllm, main 9beb6e0f), Apache License 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Changed: the import prefix only (rllm. -> rllm_torch.compat.rllm.);
# tests/rllm/test_rllm_upstream_tests.py checks that undoing it gives rLLM's file, by its SHA-256.

from rllm_torch.compat.rllm.agents.agent import Episode
from rllm_torch.compat.rllm.trainer.unified_trainer import UnifiedTrainer
from rllm_torch.compat.rllm.workflows.workflow import TerminationReason


def test_collect_workflow_metrics_counts_unknown_termination_reason():
    episodes = [
        Episode(id="task:0", termination_reason=None, metrics={"custom": 1.0}),
        Episode(id="task:1", termination_reason=TerminationReason.ERROR, metrics={"custom": 3.0}),
    ]

    workflow_metrics, termination_counts = UnifiedTrainer._collect_workflow_metrics_from_episodes(episodes)

    assert workflow_metrics["custom"] == 2.0
    assert termination_counts[TerminationReason.UNKNOWN.value] == 1
    assert termination_counts[TerminationReason.ERROR.value] == 1

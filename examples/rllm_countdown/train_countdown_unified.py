"""rLLM's examples/countdown/unified_trainer/train_countdown_unified_tinker.py, ported: only the
imports (``rllm.`` -> ``rllm_torch.compat.rllm.``), the Hydra config package and the backend name
changed; the data is what prepare_countdown_data.py registered. docs/porting.md shows the two side
by side.

    python examples/rllm_countdown/prepare_countdown_data.py
    python examples/rllm_countdown/train_countdown_unified.py model.max_positions=512 \\
        rllm.trainer.total_batches=3 rllm.rollout.max_new_tokens=16 data.train_batch_size=8 rllm.rollout.n=4
"""

import hydra

from rllm_torch.compat.rllm.data.dataset import DatasetRegistry
from rllm_torch.compat.rllm.rewards.countdown_reward import countdown_reward_fn
from rllm_torch.compat.rllm.trainer import AgentTrainer
from rllm_torch.compat.rllm.workflows.simple_workflow import SimpleWorkflow


@hydra.main(config_path="pkg://rllm_torch.compat.rllm.trainer.config", config_name="unified", version_base=None)
def main(config):
    train_dataset = DatasetRegistry.load_dataset("countdown", "train")
    test_dataset = DatasetRegistry.load_dataset("countdown", "test")

    trainer = AgentTrainer(
        workflow_class=SimpleWorkflow,
        workflow_args={
            "reward_function": countdown_reward_fn,
        },
        config=config,
        train_dataset=train_dataset,
        val_dataset=test_dataset,
        backend="torch",
    )
    trainer.train()


if __name__ == "__main__":
    main()

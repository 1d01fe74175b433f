"""rLLM's examples/countdown/unified_trainer/train_countdown_unified_tinker.py, ported: only the
imports (``rllm.`` -> ``rllm_torch.compat.rllm.``), the Hydra config package, the backend name and
the datasets (rows generated in rLLM's format instead of the HuggingFace download) changed.
docs/porting.md shows the two side by side.

    python examples/rllm_countdown/train_countdown_unified.py rllm.trainer.total_batches=3 \\
        rllm.rollout.max_new_tokens=16 data.train_batch_size=8 rllm.rollout.n=4
"""

import hydra

from rllm_torch.compat.rllm.rewards.countdown_reward import countdown_reward_fn
from rllm_torch.compat.rllm.trainer import AgentTrainer
from rllm_torch.compat.rllm.workflows.simple_workflow import SimpleWorkflow
from rllm_torch.rollouts.countdown import countdown_rows


@hydra.main(config_path="pkg://rllm_torch.compat.rllm.trainer.config", config_name="unified", version_base=None)
def main(config):
    train_dataset = countdown_rows(256, seed=0)
    test_dataset = countdown_rows(32, seed=1)

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

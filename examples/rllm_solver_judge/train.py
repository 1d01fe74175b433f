"""rLLM's cookbooks/workflow/solver_judge/train.py (rLLM main 9beb6e0f, Apache-2.0), ported: only
the imports (``rllm.`` -> ``rllm_torch.compat.rllm.``), the Hydra config package and the backend
name (``"tinker"`` -> ``"torch"``) changed; the data is what
examples/rllm_countdown/prepare_countdown_data.py registered.

    python examples/rllm_countdown/prepare_countdown_data.py
    cd examples/rllm_solver_judge && python train.py model.max_positions=1536 rllm.trainer.total_batches=3 \
        rllm.rollout.max_new_tokens=16 data.train_batch_size=4 rllm.rollout.n=2
"""

import hydra
from omegaconf import DictConfig
from solver_judge_flow import SolverJudgeWorkflow

from rllm_torch.compat.rllm.data.dataset import DatasetRegistry
from rllm_torch.compat.rllm.rewards.countdown_reward import countdown_reward_fn
from rllm_torch.compat.rllm.trainer import AgentTrainer


@hydra.main(config_path="pkg://rllm_torch.compat.rllm.trainer.config", config_name="unified", version_base=None)
def main(config: DictConfig):
    train_dataset = DatasetRegistry.load_dataset("countdown", "train")
    val_dataset = DatasetRegistry.load_dataset("countdown", "test")

    if train_dataset is None:
        raise RuntimeError("countdown train split not found. Run: rllm dataset pull countdown")

    trainer = AgentTrainer(
        backend=config.rllm.get("backend", "torch"),
        workflow_class=SolverJudgeWorkflow,
        workflow_args={
            "n_solutions": 2,
            "reward_function": countdown_reward_fn,
        },
        config=config,
        train_dataset=train_dataset,
        val_dataset=val_dataset,
    )
    trainer.train()


if __name__ == "__main__":
    main()

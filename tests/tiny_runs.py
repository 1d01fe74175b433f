"""Command-line overrides of tiny training runs, shared by the tests that train for real."""

TINY = [
    "task.train_size=16",
    "task.val_size=4",
    "data.train_batch_size=8",
    "rllm.rollout.n=2",
    "rllm.rollout.n_val=1",
    "model.hidden_size=32",
    "rllm.trainer.total_epochs=1",
    "rllm.trainer.logger=[console,jsonl]",
    "rllm.trainer.log_table_every=1",
]

#: One-layer model, 8 prompts of 4 rollouts, 2 steps, no validation: a real training step in about
#: a second (the loss, filter and estimator tests that train).
TINY_STEPS = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=8",
    "task.val_size=0",
    "data.train_batch_size=8",
    "rllm.rollout.n=4",
    "rllm.trainer.total_batches=2",
)

#: One-layer model, 16 prompts of 4 rollouts in batches of 8, 2 steps, validation on 4 prompts of 2
#: rollouts: a real run with validation in a few seconds (the backend's and the multi-turn tasks' tests).
TINY_VALIDATED = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=16",
    "task.val_size=4",
    "data.train_batch_size=8",
    "rllm.rollout.n=4",
    "rllm.rollout.n_val=2",
    "rllm.trainer.total_batches=2",
)

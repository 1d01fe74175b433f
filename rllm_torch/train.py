"""``python -m rllm_torch.train``: the training program, :mod:`rllm_torch.cli.train_command` (kept at this
path so ``python -m rllm_torch.train`` and ``torchrun -m rllm_torch.train`` work)."""

from rllm_torch.cli.train_command import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    main()

"""``python -m rllm_torch.train``: the training program, :mod:`rllm_torch.cli.train_command` (kept at
this path so ``python -m rllm_torch.train`` and ``torchrun -m rllm_torch.train`` work; without the
``train`` extra it says which install is missing, :func:`rllm_torch.cli.train_main`)."""

from rllm_torch.cli import train_main as main

__all__ = ["main"]

if __name__ == "__main__":
    main()

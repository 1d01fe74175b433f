"""``rllm-torch-torchrun``: ``torchrun`` (the same arguments, ``torch.distributed.run``'s parser
and launcher) that ends a run whose ranks stopped on one of this package's errors with that error.

Under plain ``torchrun`` a rank that stops on a bad setting (say ``data.train_batch_size=7`` on 2
processes) prints the package's one-block error and exits with status 2, and then torchrun adds
its own ``ChildFailedError`` traceback and a failure table, which bury the message. Here, when
the first rank to fail exited with status 2 (:data:`~rllm_torch.cli.error_lines.ERROR_EXIT_STATUS`:
what ``rllm-torch-train`` returns after printing one of the package's errors), the launcher
adds one line saying so and exits with status 2; any other failure (a crash, a signal) keeps
torchrun's full report.

    rllm-torch-torchrun --standalone --nproc_per_node=2 -m rllm_torch.train rllm.rollout.n=4
"""

from __future__ import annotations

import sys

from rllm_torch.cli.error_lines import ERROR_EXIT_STATUS

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Launch as ``torchrun`` would (``argv`` default: the command line)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode != ERROR_EXIT_STATUS:
            raise
        print(
            f"rllm-torch-torchrun: rank {rank} stopped on the error above (exit status {ERROR_EXIT_STATUS}); "
            "the other ranks were stopped with it.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(ERROR_EXIT_STATUS)


if __name__ == "__main__":
    main()

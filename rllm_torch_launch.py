"""The console scripts' first code, outside the ``rllm_torch`` package: ``import rllm_torch`` loads
torch (seconds on a small machine), and a Ctrl-C in those seconds would end in a traceback of the
import machinery. Here it ends in one line and exit status 130, like a Ctrl-C at any later moment
(:mod:`rllm_torch.cli`, :mod:`rllm_torch.cli.train_command`)."""

from __future__ import annotations

import signal
import sys

__all__ = ["train_main", "torchrun_main", "plot_main"]

INTERRUPTED_EXIT_STATUS = 130  # 128 + SIGINT
_CTRL_C = {"received": False}


def _on_ctrl_c(signum, frame) -> None:
    _CTRL_C["received"] = True
    raise KeyboardInterrupt


def _interrupted_while_starting(program: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this ends changes nothing
    print(f"{program}: interrupted while starting, before the run began; nothing was written", file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT_STATUS)


def _entry(program: str, name: str):
    def main() -> None:
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):  # ignored: a background job's
            signal.signal(signal.SIGINT, _on_ctrl_c)
        try:
            import rllm_torch.cli  # torch, numpy; then the program installs its own Ctrl-C handling
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or (_CTRL_C["received"] and isinstance(exc, Exception)):
                _interrupted_while_starting(program)
            raise
        if _CTRL_C["received"]:  # a library's import caught the KeyboardInterrupt and went on: still a Ctrl-C
            _interrupted_while_starting(program)
        getattr(rllm_torch.cli, name)()

    main.__doc__ = f"The ``{program}`` console script (:func:`rllm_torch.cli.{name}`), Ctrl-C included."
    return main


train_main = _entry("rllm-torch-train", "train_main")
torchrun_main = _entry("rllm-torch-torchrun", "torchrun_main")
plot_main = _entry("rllm-torch-plot", "plot_main")

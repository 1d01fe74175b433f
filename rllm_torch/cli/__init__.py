"""The programs: ``rllm-torch-train`` (:mod:`~rllm_torch.cli.train_command`, its Hydra command line
:mod:`~rllm_torch.cli.command_line` over the trainer's schema :mod:`~rllm_torch.trainer.schema`,
checked by :mod:`~rllm_torch.trainer.config_checks`), ``rllm-torch-torchrun``
(:mod:`~rllm_torch.cli.launch`), ``rllm-torch-plot`` (:mod:`~rllm_torch.cli.plot`) and
``rllm-torch-demo`` (:mod:`~rllm_torch.cli.demo`). Nothing else in the package imports them (the
top of the layers: core, rLLM surface, trainer, then backends and rollouts, then the programs).

The training programs need the ``train`` extra (``pip install 'rllm_torch[train]'``); without it
their entry points (:func:`train_main`, :func:`torchrun_main`, :func:`plot_main`) say so in one
line and exit with status 2, instead of a traceback ending in ``ModuleNotFoundError``. A Ctrl-C
while a program starts (its libraries load, Hydra composes the config) is one line and exit status
130 too; the console scripts start in :mod:`rllm_torch_launch`, outside the package, so that this
holds from their first line (``import rllm_torch`` loads torch).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from rllm_torch.cli.interrupts import ctrl_c_received, interrupted_while_starting, watch_ctrl_c

__all__ = ["TRAIN_EXTRA_MODULES", "train_main", "torchrun_main", "plot_main"]

#: The top-level modules of the ``train`` extra's libraries (pyproject.toml).
TRAIN_EXTRA_MODULES = ("transformers", "tokenizers", "pyarrow", "tqdm", "rich", "matplotlib", "tensorboard")


def _needs_train_extra(program: str, module: str) -> Callable[[], None]:
    def main() -> None:
        watch_ctrl_c()
        try:
            importlib.import_module(f"rllm_torch.cli.{module}").main()
        except KeyboardInterrupt:
            interrupted_while_starting(program)
        except ModuleNotFoundError as exc:
            if ctrl_c_received():
                interrupted_while_starting(program)
            if (exc.name or "").split(".")[0] not in TRAIN_EXTRA_MODULES:
                raise
            print(
                f"{program}: {exc.name} is not installed; the training programs need the train extra: "
                "pip install 'rllm_torch[train]' (a checkout: pip install -e '.[train]').",
                file=sys.stderr,
            )
            sys.exit(2)
        except Exception:
            if ctrl_c_received():
                interrupted_while_starting(program)
            raise

    main.__doc__ = f"The ``{program}`` entry point (:func:`rllm_torch.cli.{module}.main`)."
    return main


train_main = _needs_train_extra("rllm-torch-train", "train_command")
torchrun_main = _needs_train_extra("rllm-torch-torchrun", "launch")
plot_main = _needs_train_extra("rllm-torch-plot", "plot")

"""``Tracking``: where metrics go.

* ``jsonl``: ``{run_dir}/metrics.jsonl``, one JSON object per log call with its ``step`` (always
  on in the default config; the plots read it);
* ``console``: a progress bar over training steps and a compact metrics table every
  ``table_every`` steps (:mod:`~rllm_torch.trainer.logs.console_sink`);
* ``tensorboard``: event files in ``{run_dir}/tensorboard``;
* ``wandb``: an offline wandb run in ``{run_dir}/wandb`` when wandb is installed (else a warning).

Sinks open at :meth:`Tracking.open` (or the first :meth:`Tracking.log`); a resumed run opens them
with the checkpoint's step, so ``metrics.jsonl`` and TensorBoard drop what was logged after it.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from pathlib import Path
from typing import Any

from rllm_torch.core.errors import ConfigError

__all__ = ["Tracking", "JsonlSink", "LOGGER_BACKENDS"]

LOGGER_BACKENDS = ("console", "jsonl", "tensorboard", "wandb")


class JsonlSink:
    """Appends rows to ``path``.

    Opened with ``resume_step`` >= 0 it first drops the rows of later steps, and the validation row
    of ``resume_step`` itself unless ``validated`` (a run stopped between its final validation and
    the checkpoint that records it validates that step again). Opened with ``resume_step=-1`` (a
    fresh run) over a file that holds rows, it keeps them: the file is renamed to the first free
    ``metrics.<k>.jsonl`` beside it, with a warning that names it.
    """

    def __init__(self, path: Path, resume_step: int | None = None, *, validated: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step == -1 and path.is_file() and path.stat().st_size:
            kept = next(
                path.with_name(f"{path.stem}.{k}{path.suffix}")
                for k in itertools.count(1)
                if not path.with_name(f"{path.stem}.{k}{path.suffix}").exists()
            )
            path.rename(kept)
            warnings.warn(
                f"a new run starts in {path.parent}: the metrics already there were kept as {kept}", stacklevel=2
            )
        elif resume_step is not None and path.exists():

            def keep(row: dict[str, Any] | None) -> bool:
                if row is None:
                    return False
                step = row["step"]
                return step < resume_step or (step == resume_step and (validated or not _is_validation(row)))

            lines = path.read_text().splitlines(keepends=True)
            path.write_text("".join(line for line in lines if keep(_row(line))))
        self._file = open(path, "a")  # noqa: SIM115 - closed in finish()

    def log(self, row: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps(row, default=str) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


def _row(line: str) -> dict[str, Any] | None:
    """A metrics row with an integer ``step``; None for a half-written last line of a killed run."""
    try:
        row = json.loads(line)
        row["step"] = int(row["step"])
        return row
    except (ValueError, KeyError, TypeError):
        return None


def _is_validation(row: dict[str, Any]) -> bool:
    return any(key.startswith("val/") for key in row)


class Tracking:
    """Metrics sinks of a run.

    Args:
        backends: names from :data:`LOGGER_BACKENDS` (a str or a list of them).
        run_dir: the run directory (needed for ``jsonl``, ``tensorboard`` and ``wandb``).
        project_name, experiment_name: the wandb project and run name.
        config: a plain dict recorded as the wandb run's config.
        table_every: ``console`` prints its metrics table every this many steps (<= 0: never).

    Raises:
        ConfigError: an unknown backend name, or a file backend without a run directory.
    """

    def __init__(
        self,
        backends: str | list[str],
        run_dir: str | Path | None = None,
        *,
        project_name: str = "rllm_torch",
        experiment_name: str = "run",
        config: dict | None = None,
        table_every: int = 32,
        **kwargs: Any,
    ) -> None:
        self.backends = [backends] if isinstance(backends, str) else list(backends)
        unknown = [b for b in self.backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ConfigError(f"rllm.trainer.logger: unknown logger(s) {unknown}; choose from {list(LOGGER_BACKENDS)}.")
        if run_dir is None and set(self.backends) - {"console"}:
            raise ConfigError(
                f"the {sorted(set(self.backends) - {'console'})} logger(s) need a run directory (rllm.trainer.default_local_dir)."
            )
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.project_name, self.experiment_name, self.config, self.table_every = (
            project_name,
            experiment_name,
            config,
            table_every,
        )
        self._sinks: list[Any] | None = None
        self.console = None

    def open(self, resume_step: int | None = None, *, validated: bool = True) -> None:
        """Open the sinks. ``resume_step``: drop what was logged after that step (-1: a fresh run;
        ``metrics.jsonl`` rows already there are kept aside, see :class:`JsonlSink`), and its
        validation unless ``validated``; None: append to what is there."""
        sinks: list[Any] = []
        if "jsonl" in self.backends:
            sinks.append(JsonlSink(self.run_dir / "metrics.jsonl", resume_step, validated=validated))
        if "console" in self.backends:
            from rllm_torch.trainer.logs.console_sink import ConsoleSink

            self.console = ConsoleSink(table_every=self.table_every)
            sinks.append(self.console)
        if "tensorboard" in self.backends:
            from rllm_torch.trainer.logs.external_sinks import TensorBoardSink

            sinks.append(TensorBoardSink(self.run_dir / "tensorboard", resume_step))
        if "wandb" in self.backends:
            from rllm_torch.trainer.logs.external_sinks import open_wandb_sink

            sinks += [
                s
                for s in [open_wandb_sink(self.run_dir, self.project_name, self.experiment_name, self.config)]
                if s is not None
            ]
        self._sinks = sinks

    def start_progress(self, total_steps: int, initial_step: int) -> None:
        """Show the console progress bar (``console`` only) at ``initial_step`` of ``total_steps``."""
        if self._sinks is None:
            self.open()
        if self.console is not None:
            self.console.start(total_steps, initial_step)

    def restore_validation(self, step: int, metrics: dict[str, Any]) -> None:
        """Show the last validation of a resumed run (``console``: the bar and the next table)."""
        if self.console is not None:
            self.console.restore_validation(step, metrics)

    def log(self, data: dict[str, Any], step: int, **kwargs: Any) -> None:
        """Record ``data`` (numbers; other values are written as strings) at ``step``."""
        if self._sinks is None:
            self.open()
        row = {"step": step, **{k: _plain(v) for k, v in data.items()}}
        for sink in self._sinks:
            sink.log(row, step)

    def finish(self) -> None:
        """Close the files and the progress bar."""
        for sink in self._sinks or []:
            sink.finish()
        self._sinks = None


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value

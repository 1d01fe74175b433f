"""``ConsoleSink``: a ``tqdm`` progress bar over training steps (on stderr when it is a terminal;
tqdm shows the time left) with the current reward and the last validation pass@1, a compact
``rich`` table of the main metrics every ``table_every`` steps and one line per validation (on
stdout)."""

from __future__ import annotations

import io
import re
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

__all__ = ["ConsoleSink", "metrics_table"]

_TABLE_KEYS = re.compile(
    r"^(reward/[^/]+/mean|advantage/[^/]+/(mean|std|fraction_zero)|actor/(loss|grad_norm|approx_kl|lr)|batch/response_length|time/step)$"
)


def _reward_mean(row: dict[str, Any]) -> float | None:
    return next(
        (v for k, v in row.items() if k.startswith("reward/") and k.endswith("/mean") and isinstance(v, (int, float))),
        None,
    )


def metrics_table(rows: list[dict[str, Any]], validation: dict[str, Any]) -> Table:
    """The main metrics at the last of ``rows`` and their mean over all of ``rows``, then the
    last validation's pass@k values."""
    last, first_step = rows[-1], rows[0]["step"]
    table = Table(title=f"step {last['step']}", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("metric")
    table.add_column(f"step {last['step']}", justify="right")
    table.add_column(f"mean {first_step}-{last['step']}", justify="right")
    for key in sorted(k for k in last if _TABLE_KEYS.match(k)):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if isinstance(last[key], (int, float)) and values:
            table.add_row(key, f"{last[key]:.4g}", f"{sum(values) / len(values):.4g}")
    for key in sorted(k for k in validation if "pass@" in k):
        table.add_row(f"{key} (step {validation['step']})", f"{validation[key]:.4g}", "")
    return table


class ConsoleSink:
    """The ``console`` logger. Args: table_every: steps between tables (<= 0: no table)."""

    def __init__(self, table_every: int = 32) -> None:
        self.table_every, self.bar, self.window = table_every, None, []
        self.validation: dict[str, Any] = {}
        self.last_reward: float | None = None

    def start(self, total_steps: int, initial_step: int) -> None:
        """Show the progress bar."""
        self.bar = tqdm(  # disable=None: no bar when stderr is not a terminal (a piped log gets the tables)
            total=total_steps,
            initial=initial_step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
            disable=None,
        )
        pass1 = [v for k, v in self.validation.items() if k.endswith("pass@1")]
        if pass1:  # a resumed run's last validation
            self.bar.set_postfix({"val_pass@1": f"{pass1[0]:.3f}"})

    def _write(self, text: str) -> None:
        tqdm.write(text.rstrip("\n"), file=sys.stdout)
        sys.stdout.flush()

    def restore_validation(self, step: int, metrics: dict[str, Any]) -> None:
        """Keep a validation done before a resume (shown on the bar and in the next table)."""
        self.validation = {k: v for k, v in metrics.items() if "pass@" in k and isinstance(v, (int, float))} | {
            "step": step
        }

    def log(self, row: dict[str, Any], step: int) -> None:
        if any(k.startswith("val/") for k in row):
            self.restore_validation(step, row)
            shown = ", ".join(f"{k}={v:.3f}" for k, v in sorted(self.validation.items()) if k != "step")
            self._write(f"step {step} validation: {shown}")
        else:
            self.window.append(row)
            self.last_reward = _reward_mean(row)
            if self.table_every > 0 and step % self.table_every == 0:
                buffer = io.StringIO()
                Console(file=buffer, width=100, force_terminal=False).print(metrics_table(self.window, self.validation))
                self._write(buffer.getvalue())
                self.window = []
        if self.bar is not None:
            if step > self.bar.n:
                self.bar.update(step - self.bar.n)
            postfix = {}
            if self.last_reward is not None:
                postfix["reward"] = f"{self.last_reward:.3f}"
            pass1 = [v for k, v in self.validation.items() if k.endswith("pass@1")]
            if pass1:
                postfix["val_pass@1"] = f"{pass1[0]:.3f}"
            self.bar.set_postfix(postfix, refresh=False)
            if self.bar.n >= self.bar.total:
                self.finish()

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

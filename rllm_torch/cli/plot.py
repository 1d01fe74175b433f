"""``rllm-torch-plot RUN_DIR``: training curves of a run from its ``metrics.jsonl``, as a PNG.

Four panels over training steps: reward mean (per role), advantage mean and std (per role),
validation pass@k (per data source), and the policy loss. A finished ``rllm-torch-train`` run
writes ``RUN_DIR/curves.png`` itself.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rllm_torch.core.errors import ConfigError

__all__ = ["read_metrics", "plot_run", "main"]

_PANELS = (
    ("reward mean (training batch)", re.compile(r"^reward/([^/]+)/mean$")),
    ("advantage mean and std", re.compile(r"^advantage/([^/]+)/(mean|std)$")),
    ("validation", re.compile(r"^val/([^/]+)/(pass@\d+)$")),
    ("policy loss", re.compile(r"^actor/loss$")),
)


def read_metrics(path: str | Path) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (steps, values)}`` of every numeric metric in a ``metrics.jsonl``; a line that
    is not JSON (the half-written last line of a killed run) is skipped.

    Raises:
        ConfigError: the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; rllm-torch-plot needs a run directory with metrics.jsonl (the jsonl logger)."
        )
    series: dict[str, tuple[list[int], list[float]]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            step = int(row.pop("step"))
        except (ValueError, KeyError, TypeError):
            continue
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step), values.append(float(value))
    return series


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw ``run_dir/metrics.jsonl`` into ``output`` (default ``run_dir/curves.png``); returns its path.

    Raises:
        ConfigError: ``run_dir`` has no ``metrics.jsonl``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    series = read_metrics(run_dir / "metrics.jsonl")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (title, pattern) in zip(axes.flat, _PANELS, strict=True):
        drawn = False
        for key in sorted(k for k in series if pattern.match(k)):
            steps, values = series[key]
            ax.plot(
                steps, values, marker="o" if title == "validation" else None, markersize=3, linewidth=1.2, label=key
            )
            drawn = True
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in axes[1]:
        ax.set_xlabel("training step")
    fig.suptitle(str(run_dir.resolve().name), fontsize=10)
    fig.tight_layout()
    output = Path(output) if output is not None else run_dir / "curves.png"
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> None:
    """The console script: ``rllm-torch-plot RUN_DIR [-o OUT.png]``."""
    parser = argparse.ArgumentParser(
        prog="rllm-torch-plot",
        description="Plot reward, advantage and validation curves of a run from its metrics.jsonl.",
    )
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("-o", "--output", help="the PNG to write (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        print(plot_run(args.run_dir, args.output))
    except ConfigError as exc:
        parser.exit(2, f"rllm-torch-plot: {exc}\n")


if __name__ == "__main__":
    main()

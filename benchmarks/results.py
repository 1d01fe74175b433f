"""Where a benchmark writes its results file: the tracked ``benchmarks/RESULTS*.md`` only when
asked (``--write-results``), else ``outputs/benchmarks/`` under the working directory (not
tracked), so that running a benchmark does not rewrite the repository's recorded numbers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_write_results", "results_path", "write_results_file", "UNTRACKED"]

TRACKED = Path(__file__).parent
UNTRACKED = Path("outputs") / "benchmarks"


def add_write_results(parser: argparse.ArgumentParser) -> None:
    """The ``--write-results`` flag."""
    parser.add_argument(
        "--write-results",
        action="store_true",
        help=f"update the tracked benchmarks/RESULTS*.md (default: write it to {UNTRACKED}/)",
    )


def results_path(name: str, write_results: bool) -> Path:
    """``benchmarks/<name>`` with ``write_results``, else ``outputs/benchmarks/<name>`` (its
    directory made)."""
    if write_results:
        return TRACKED / name
    UNTRACKED.mkdir(parents=True, exist_ok=True)
    return UNTRACKED / name


def write_results_file(name: str, text: str, write_results: bool, *, append: bool = False) -> Path:
    """Write ``text`` to :func:`results_path` (after what the file holds, with ``append``), print
    it and say where; returns the path."""
    target = results_path(name, write_results)
    if append and target.is_file():
        text = target.read_text() + "\n" + text
    target.write_text(text)
    print(text)
    print(f"wrote {target}", file=sys.stderr)
    return target

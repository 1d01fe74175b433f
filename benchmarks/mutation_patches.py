"""An independent mutation round from patch files: bugs written by someone who did not read the
tests, each a ``git diff`` of one line, planted alone, run against the tests, then taken out.

    python benchmarks/mutation_patches.py DIR            # DIR holds <ID>.patch files and bugs.tsv
    python benchmarks/mutation_patches.py DIR --only S01 O03 --stages first

``bugs.tsv`` has one line per bug: ``ID<TAB>what<TAB>file:line<TAB>first tests<TAB>layer``. A bug
is caught when its first tests (picked by the planter from the test files' names) fail; if they
pass, its layer (a test directory) runs next. Every pytest runs under ``timeout``; a run that
hits it is reported as ``timeout`` and not counted as caught (a slow machine is not a failing
test): rerun those bugs alone with ``--only``. The checkout must be clean: each patch
is applied with ``git apply`` and taken out with ``git apply -R``, and a dirty tree stops the round.
The table goes to stdout (paste it into RESULTS_mutation.md with the machine's description).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = {"first": 900, "layer": 2400}  # a layer of tests/cli takes 10+ minutes on 2 loaded cores


@dataclass(frozen=True)
class Bug:
    """One planted bug and where its tests are."""

    name: str
    what: str
    where: str
    first: tuple[str, ...]
    layer: str


def read_bugs(directory: Path) -> list[Bug]:
    """The bugs of ``directory/bugs.tsv``, in file order."""
    bugs = []
    for line in (directory / "bugs.tsv").read_text().splitlines():
        if not line.strip():
            continue
        name, what, where, first, layer = line.split("\t")
        bugs.append(Bug(name, what, where, tuple(first.split()), layer.strip()))
    return bugs


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _pytest(paths: tuple[str, ...], timeout_s: int) -> tuple[bool | None, str]:
    """(passed, the first failing test's line or the exit reason); passed is None on a timeout."""
    command = ["timeout", str(timeout_s), sys.executable, "-m", "pytest", *paths]
    done = subprocess.run(
        [*command, "-x", "-q", "-p", "no:cacheprovider", "-rf"], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode == 0:
        return True, ""
    if done.returncode == 124:
        return None, "timeout"
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return False, failed[0] if failed else f"pytest exit {done.returncode}"


def _run_one(patch: Path, paths: tuple[str, ...], timeout_s: int) -> tuple[bool | None, str]:
    if _git("status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise SystemExit("the checkout has changes: run the round on a clean checkout")
    applied = _git("apply", str(patch))
    if applied.returncode != 0:
        raise SystemExit(f"{patch.name} does not apply to this checkout: {applied.stderr.strip()}")
    try:
        return _pytest(paths, timeout_s)
    finally:
        _git("apply", "-R", str(patch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--stages", nargs="+", choices=("first", "layer"), default=["first", "layer"])
    args = parser.parse_args()
    bugs = [b for b in read_bugs(args.directory) if args.only is None or b.name in args.only]
    for bug in bugs:  # all of them, before minutes of tests
        check = _git("apply", "--check", str(args.directory / f"{bug.name}.patch"))
        if check.returncode != 0:
            raise SystemExit(f"{bug.name}.patch does not apply to this checkout: {check.stderr.strip()}")
    caught: dict[str, str] = {}
    for stage in args.stages:
        for bug in bugs:
            if bug.name in caught:
                continue
            paths = bug.first if stage == "first" else (bug.layer,)
            start = time.perf_counter()
            passed, reason = _run_one(args.directory / f"{bug.name}.patch", paths, TIMEOUT_S[stage])
            took = time.perf_counter() - start
            verdict = {True: "survived", False: "caught", None: "timeout (not counted)"}[passed]
            print(f"{bug.name} {stage}: {verdict} in {took:.0f} s {reason}", flush=True)
            if passed is False:
                caught[bug.name] = f"{stage}: {reason}"
    print("\n| id | the bug | file:line | caught | by |\n|---|---|---|---|---|")
    for bug in bugs:
        by = caught.get(bug.name, "— (ran " + ", ".join(f"`{p}`" for p in (*bug.first, bug.layer)) + ")")
        mark = "yes" if bug.name in caught else "**no**"
        print(f"| {bug.name} | {bug.what} | `{bug.where}` | {mark} | {by} |")
    print(f"\nKill rate: {len(caught)} of {len(bugs)} ({100 * len(caught) / max(len(bugs), 1):.0f}%)")


if __name__ == "__main__":
    main()

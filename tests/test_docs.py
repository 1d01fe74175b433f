"""The documentation: it builds with MkDocs in strict mode (a broken link, a missing anchor or a
docstring the API reference cannot read fails), and every Python example of the README and of
``docs/`` runs as it is written (a block after ``<!-- not run: why -->`` is skipped, saying why)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- not run: ([^>]*) -->\n)?( *)```python\n(.*?)```", re.S)


def examples() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1 + bool(match.group(1))
            found.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(4)), match.group(2)))
    return found


EXAMPLES = examples()


def test_the_pages_have_examples_to_run():
    assert len([e for e in EXAMPLES if e[2] is None]) >= 8


@pytest.mark.parametrize("where, code, skipped", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_every_python_example_of_the_documentation_runs(where, code, skipped, tmp_path):
    if skipped is not None:
        pytest.skip(skipped)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"


def test_the_documentation_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    home = (tmp_path / "site" / "index.html").read_text()
    assert "A first example" in home  # the README is the home page
    settings = (tmp_path / "site" / "settings" / "index.html").read_text()
    assert "rllm.stepwise_advantage" in settings and "micro_batch_tokens" in settings  # written from the declarations

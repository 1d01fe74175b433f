"""The documentation: it builds with MkDocs in strict mode (a broken link, a missing anchor or a
docstring the API reference cannot read fails), every Python example of the README and of
``docs/`` runs as it is written (a block after ``<!-- not run: why -->`` is skipped, saying why),
the pages written from their sources (``docs/index.md``, the settings table) are current, and every
setting a page names is one of the schema."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rllm_torch.cli.command_line import known_keys

ROOT = Path(__file__).resolve().parents[1]
# docs/index.md is the README, written by docs/hooks.py
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")]
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


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_written_pages_are_current_and_read_on_github_as_files():
    hooks = _hooks()
    assert hooks.stale_pages() == [], "run `python docs/hooks.py`"
    index, settings = (ROOT / "docs" / "index.md").read_text(), (ROOT / "docs" / "settings.md").read_text()
    assert "## A first example" in index and "](docs/" not in index  # the README, with links that work from docs/
    assert "| `max_new_tokens` | `null` |" in settings and "### `rllm.stepwise_advantage`" in settings


#: Dotted names in the pages that are not settings: a checkpoint's file, a family of metrics, a method.
NOT_SETTINGS = {"backend.pt", "backend.vespo_", "model.generate"}


def _rllm_name(name: str) -> bool:
    """Whether ``name`` is rLLM's (the porting page's): one of its import paths or the names in
    them, which the compatibility package mirrors (``rllm.trainer.algorithms`` is
    ``rllm_torch.compat.rllm.trainer.algorithms``), or a key of its backends' configs that the
    command line answers with ours (``model.lora_rank``)."""
    from rllm_torch.trainer.rllm_settings import RLLM_BACKEND_KEYS

    if name in RLLM_BACKEND_KEYS:
        return True
    for module in (name, name.rsplit(".", 1)[0]):
        try:
            if module.startswith("rllm.") and importlib.util.find_spec(f"rllm_torch.compat.{module}") is not None:
                return True
        except ModuleNotFoundError:
            continue
    return False


def test_every_setting_a_page_names_is_a_setting_of_the_schema():
    keys, open_prefixes = known_keys()
    named = re.compile(r"`((?:rllm|backend|model|data|task)\.[A-Za-z0-9_.]+)")
    unknown = []
    for page in PAGES:
        for match in named.finditer(page.read_text()):
            key = match.group(1).rstrip(".")
            known = key in keys or any(key.startswith(f"{p}.") for p in open_prefixes) or _rllm_name(key)
            if not known and not any(k.startswith(f"{key}.") for k in keys) and key not in NOT_SETTINGS:
                unknown.append(f"{page.relative_to(ROOT)}: {key}")
    assert not unknown, unknown


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown table row of ``text`` whose first cell starts with ``first_cell``."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]
    return [row for row in rows if row[0].startswith(first_cell)]


def test_the_training_pages_default_run_numbers_are_those_of_the_results_file_it_cites():
    page = (ROOT / "docs" / "training.md").read_text()
    results = (ROOT / "benchmarks" / "RESULTS_default_runs.md").read_text()
    assert "`benchmarks/RESULTS_default_runs.md`" in page
    for first in ("step", "val pass@1"):  # the validation curve of rllm-torch-train
        assert _table_rows(page, first)[0] == _table_rows(results, first)[0], first
    for row in _table_rows(results, "`"):  # every estimator: pass@1 and pass@4 before -> after
        assert row[:3] in [page_row[:3] for page_row in _table_rows(page, "`")], row
    summary = re.search(r"validation pass@1 (\S+) → (\S+), pass@4 (\S+) → (\S+)\.", results).groups()
    assert f"pass@1 {summary[0]} before training → {summary[1]} after** (pass@4 {summary[2]} → {summary[3]})" in page

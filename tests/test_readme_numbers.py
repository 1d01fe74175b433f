"""Every number the README states comes from a results file it links (issue 43): each paragraph's
numbers (code and link targets aside) appear among the numbers of the ``benchmarks/RESULTS*.md``
files that the same paragraph links. A claim without its source, or a number changed in one place
only, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# a standalone number: not part of a word or a name ("SmolLM2", "GPT-2", "135M", "Qwen2.5"), a range's
# second end included ("1.40-1.87x"); a trailing x, × or % is the number's unit
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)\d[\d,]*(?:\.\d+)?(?=[x×%]?(?![\w]))")
RESULTS_LINK = re.compile(r"\]\((benchmarks/RESULTS[\w]*\.md)(?:#[^)]*)?\)")


def paragraphs(text: str) -> list[str]:
    """The README's paragraphs and list items, without code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    parts = re.split(r"\n\s*\n|\n(?=- )", text)
    return [p for p in parts if p.strip()]


def numbers(text: str) -> set[str]:
    """The numbers of ``text`` outside inline code and link targets, commas dropped."""
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def unsourced(readme: str, root: Path) -> list[tuple[str, list[str]]]:
    """``(paragraph start, numbers its linked results files lack)`` for each paragraph with any."""
    found = []
    for paragraph in paragraphs(readme):
        stated = numbers(paragraph)
        if not stated:
            continue
        sources = set()
        for link in RESULTS_LINK.findall(paragraph):
            sources |= numbers((root / link).read_text())
        missing = sorted(stated - sources)
        if missing:
            found.append((paragraph.strip()[:80], missing))
    return found


def test_every_number_in_the_readme_appears_in_a_results_file_its_paragraph_links():
    assert unsourced(README.read_text(), ROOT) == []


def test_a_number_without_a_linked_source_is_found(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS_x.md").write_text("| 1M | 3.1 ms | 792x | 1.40-1.87 |\n")
    sourced = "GRPO on 1M rewards in 3.1 ms, 1.40-1.87x faster ([table](benchmarks/RESULTS_x.md))."
    assert unsourced(sourced, tmp_path) == []
    assert unsourced(sourced.replace("3.1", "2.9"), tmp_path) == [(sourced.replace("3.1", "2.9")[:80], ["2.9"])]
    assert unsourced("Trains in 52 s on SmolLM2-135M and GPT-2.", tmp_path) == [
        ("Trains in 52 s on SmolLM2-135M and GPT-2.", ["52"])
    ]
    assert unsourced("`pip install torch==2.13.0` then [docs](docs/x.md)", tmp_path) == []


@pytest.mark.parametrize("link", sorted(set(RESULTS_LINK.findall(README.read_text()))))
def test_every_results_file_the_readme_links_exists(link):
    assert (ROOT / link).is_file()

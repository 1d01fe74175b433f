"""The pages written from their sources, so that they read the same on GitHub and on the site and
cannot drift: ``docs/index.md`` is the README (its ``docs/`` links made relative), and the table
of ``docs/settings.md`` is written from the settings' declarations (``rllm_torch.trainer.schema``).

    python docs/hooks.py      # writes both pages

``tests/test_docs.py`` checks that the files are current, and so does the site build (this file is
also its MkDocs hook: a stale page stops ``mkdocs build``, naming the command).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BEGIN = "<!-- settings table: written by `python docs/hooks.py` from the declarations; edit those, not this -->"
END = "<!-- end of the settings table -->"
INDEX_HEAD = "<!-- written by `python docs/hooks.py` from README.md; edit README.md, not this -->\n"


def settings_table() -> str:
    from rllm_torch.rllm.settings import walk
    from rllm_torch.trainer.schema import TrainConfig

    defaults = OmegaConf.structured(TrainConfig)
    lines, section = [], None
    for key, declaration, _ in walk(TrainConfig):
        top = key.rsplit(".", 1)[0] if "." in key else "(top level)"
        if top != section:
            section = top
            lines += [
                "",
                f"### `{section}`",
                "",
                "| setting | default | resumable | what it does |",
                "|---|---|---|---|",
            ]
        value = OmegaConf.select(defaults, key, default=None, throw_on_resolution_failure=False)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        shown = "null" if value is None else repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        extra = []
        if declaration.choices:
            extra.append("one of " + ", ".join(f"`{c}`" for c in declaration.choices))
        if declaration.minimum is not None:
            bound = f"{'>' if declaration.exclusive_minimum else '>='} {declaration.minimum}"
            extra.append(bound + (f", <= {declaration.maximum}" if declaration.maximum is not None else ""))
        help_text = declaration.help.replace("|", "\\|") + (f" ({'; '.join(extra)})" if extra else "")
        name = key.rsplit(".", 1)[-1]
        lines.append(f"| `{name}` | `{shown}` | {'yes' if declaration.resumable else ''} | {help_text} |")
    return "\n".join(lines)


def settings_page(current: str) -> str:
    """``current`` (``docs/settings.md``) with the table between its markers written anew."""
    head, _, rest = current.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{settings_table()}\n\n{END}{tail}"


def index_page() -> str:
    """The README as the site's home page, its ``docs/`` links made relative to ``docs/`` and its
    links to files outside the site (``benchmarks/RESULTS*.md``) written as their paths."""
    readme = (ROOT / "README.md").read_text().replace("](docs/", "](")
    return INDEX_HEAD + re.sub(r"\[[^\]]*\]\(((?:benchmarks|examples|tests)/[^)#]*)(?:#[^)]*)?\)", r"`\1`", readme)


def pages() -> dict[Path, str]:
    """``{page: what it must hold}``."""
    settings = DOCS / "settings.md"
    return {settings: settings_page(settings.read_text()), DOCS / "index.md": index_page()}


def stale_pages() -> list[Path]:
    """The written pages whose file is not what :func:`pages` writes."""
    return [path for path, text in pages().items() if not path.is_file() or path.read_text() != text]


def on_pre_build(config, **kwargs) -> None:
    """MkDocs hook: a stale written page stops the build."""
    if stale := stale_pages():
        from mkdocs.exceptions import PluginError

        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        raise PluginError(f"{names}: not current with the sources they are written from; run `python docs/hooks.py`")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")

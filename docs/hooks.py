"""mkdocs hook: the home page is the README, and the settings reference is written from the
settings' declarations (``rllm_torch.trainer.schema``), so neither can drift from its source."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

MARK = "<!-- settings table -->"
README = "<!-- README -->"
ROOT = Path(__file__).resolve().parents[1]


def settings_table() -> str:
    from rllm_torch.rllm.settings import walk
    from rllm_torch.trainer.schema import TrainConfig

    defaults = OmegaConf.structured(TrainConfig)
    lines, section = [], None
    for key, declaration, _ in walk(TrainConfig):
        top = key.rsplit(".", 1)[0] if "." in key else "(top level)"
        if top != section:
            section = top
            lines += ["", f"### `{section}`", "", "| setting | default | resumable | what it does |", "|---|---|---|---|"]
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


def readme() -> str:
    """The repository's README as the site's home page (its ``docs/`` links made relative)."""
    return (ROOT / "README.md").read_text().replace("](docs/", "](")


def on_page_markdown(markdown: str, **kwargs) -> str:
    if README in markdown:
        markdown = markdown.replace(README, readme())
    return markdown.replace(MARK, settings_table()) if MARK in markdown else markdown

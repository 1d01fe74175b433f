"""Warnings of ``rllm-torch-train`` as one line each (:func:`one_line_warnings`).

Python's default format is two lines: ``file:line: Category: message`` and the source line that
called ``warnings.warn``. A warning of this package is about a setting or the run, never about
the line of our code that noticed it, so it prints as ``rllm-torch-train: warning: <message>``;
a warning raised elsewhere (a library, the user's own code, or ours pointing at the user's call
with ``stacklevel``) keeps its ``file:line: Category:`` prefix, which says where it came from,
without the source line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

__all__ = ["PACKAGE_DIR", "format_warning", "one_line_warnings"]

#: The directory of the ``rllm_torch`` package: a warning attributed to a file under it is ours.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _ours(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(PACKAGE_DIR)
    except (OSError, ValueError):  # "<string>", a frozen module
        return False


def format_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
    *,
    program: str = "rllm-torch-train",
) -> str:
    """One line for one warning (the signature of :func:`warnings.formatwarning`).

    Examples:
        >>> import rllm_torch.cli.warning_lines as w
        >>> w.format_warning("step 3: nothing trains", UserWarning, str(w.PACKAGE_DIR / "trainer" / "step.py"), 9)
        'rllm-torch-train: warning: step 3: nothing trains\\n'
        >>> w.format_warning("old", DeprecationWarning, "/home/me/train.py", 12)
        '/home/me/train.py:12: DeprecationWarning: old\\n'
    """
    text = " ".join(str(message).split("\n"))
    if _ours(filename):
        return f"{program}: warning: {text}\n"
    return f"{filename}:{lineno}: {category.__name__}: {text}\n"


def one_line_warnings() -> None:
    """Print every warning of this process as :func:`format_warning` writes it (the console scripts
    call it first; a library user's own program keeps Python's format)."""
    warnings.formatwarning = format_warning

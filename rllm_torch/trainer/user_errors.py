"""Where an exception raised in the user's own code (a reward function, a workflow, a grouping
hook, a registered estimator or loss) came from: :func:`user_frame` finds the innermost frame of
its traceback that is neither this package nor an installed library nor Python's standard
library, and :func:`describe_error` says the exception with that place in one line,
``ZeroDivisionError: division by zero (rewards.py:2 in raises: return 1 / 0)``.

The exception followed is the first of its chain (``__cause__``, else ``__context__``): a
:class:`~rllm_torch.core.errors.WorkflowError` wraps the workflow's own last exception.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

__all__ = ["FAILED_STEPS_LIMIT", "root_exception", "user_frame", "describe_error"]

#: A run (``rllm.workflow.raise_on_error=false`` or not) stops with the first error when every
#: episode of this many training steps in a row failed: nothing trains, and nothing will.
FAILED_STEPS_LIMIT = 3

_PACKAGE = Path(__file__).resolve().parents[1]
_LIBRARIES = tuple(
    {
        Path(p).resolve()
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)


def root_exception(exc: BaseException) -> BaseException:
    """The first exception of ``exc``'s chain (its ``__cause__``, else ``__context__``, to the end)."""
    seen = {id(exc)}
    while (earlier := exc.__cause__ or exc.__context__) is not None and id(earlier) not in seen:
        seen.add(id(earlier))
        exc = earlier
    return exc


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):  # <string>, <frozen ...>
        return False
    path = Path(filename).resolve()
    return not path.is_relative_to(_PACKAGE) and not any(path.is_relative_to(lib) for lib in _LIBRARIES)


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code in the traceback of ``exc``'s first exception
    (:func:`root_exception`); None when none of its frames is the user's."""
    frames = traceback.extract_tb(root_exception(exc).__traceback__)
    return next((f for f in reversed(frames) if _is_user_file(f.filename)), None)


def describe_error(exc: BaseException) -> str:
    """``Type: message (file:line in function: source line)`` of ``exc``'s first exception, the
    place being the user's code (:func:`user_frame`); without it when no frame is the user's.

    Examples:
        >>> describe_error(ValueError("no place"))
        'ValueError: no place'
    """
    root = root_exception(exc)
    text = f"{type(root).__name__}: {' '.join(str(root).split())}".rstrip(": ")
    frame = user_frame(root)
    if frame is None:
        return text
    source = f": {frame.line.strip()}" if frame.line else ""
    return f"{text} ({frame.filename}:{frame.lineno} in {frame.name}{source})"

"""The machine line every benchmark records beside its numbers."""

from __future__ import annotations

import platform

__all__ = ["cpu_name", "cpu_flags"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else what ``platform`` knows) and the instruction sets
    that decide its matmul speed (:func:`cpu_flags`), e.g. ``"AMD EPYC (avx2, no avx512f, ...)"``."""
    try:
        with open("/proc/cpuinfo") as info:
            name = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} ({cpu_flags()})"


FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> str:
    """The instruction sets that decide float32 and bfloat16 matmul speed, each as present or not
    (``/proc/cpuinfo``), e.g. ``"avx2, no avx512f, no avx512_bf16, no amx_bf16, no amx_tile"``."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = set(next(line for line in info if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "instruction sets unknown"
    return ", ".join(flag if flag in flags else f"no {flag}" for flag in FLAGS)

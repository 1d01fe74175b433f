"""The machine line every benchmark records beside its numbers."""

from __future__ import annotations

import platform

__all__ = ["cpu_name", "instruction_sets"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def instruction_sets() -> str:
    """The vector instruction sets that decide the CPU kernels (and so their rounding):
    ``"AVX2, AVX-512 (no BF16), no AMX"``, from ``/proc/cpuinfo``'s flags ("unknown" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = set(next(line.split(":", 1)[1].split() for line in info if line.startswith("flags")))
    except (OSError, StopIteration):
        return "unknown instruction sets"
    avx512 = (
        "AVX-512" + (" with BF16" if "avx512_bf16" in flags else " (no BF16)") if "avx512f" in flags else "no AVX-512"
    )
    return ", ".join(["AVX2" if "avx2" in flags else "no AVX2", avx512, "AMX" if "amx_tile" in flags else "no AMX"])

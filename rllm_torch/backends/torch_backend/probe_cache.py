"""The dtype probe's timings kept per machine (``backend.dtype_cache``), so that later runs of
the same model and shapes on the same machine choose the same dtypes without measuring again: a
run is reproducible on its machine, and a restart costs nothing.

One JSON file maps a key to its timings. The key names everything the timings depend on: the CPU
(or GPU) model, torch's thread count and version, the libraries' instruction-set caps when set
(:data:`LIBRARY_CAPS`), the host heap's setting (:func:`~.micro_batches.map_host_tensors`), the
model's class and size (LoRA: the trained parameters), the probe's shapes and activation
checkpointing. Another machine, torch, model or batch measures anew; deleting
the file (or ``backend.dtype_cache=null``) measures at every start.

Timings taken while other work held the CPU are not what the machine does alone, and a choice made
from them would stay for every later run. Each entry keeps the machine's load when it was measured
(:func:`machine_load`); an entry measured busy (or before loads were kept) is measured again by the
first run that finds the machine quiet (:func:`is_busy`), and replaced.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path

import torch
from torch import nn

from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.backends.torch_backend.micro_batches import HOST_MMAP_THRESHOLD_BYTES
from rllm_torch.backends.torch_backend.precision import PhaseProbe, PhaseTimings, ProbeShapes

__all__ = ["probe_key", "cached_probe", "machine_load", "is_busy", "LIBRARY_CAPS", "BUSY_SHARE"]

#: Environment variables that hold PyTorch's CPU libraries to fewer instruction sets (and so change
#: the timings): part of the key when set.
LIBRARY_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


#: The machine is busy when its 1-minute load average is above this share of the cores the process
#: may run on: on 2 cores, another job's two threads (load about 2), not this run's own start-up.
BUSY_SHARE = 0.75


def machine_load() -> tuple[float, int]:
    """``(1-minute load average, cores this process may run on)``; a load of 0 where the system
    does not report one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except OSError:
        return 0.0, cores


def is_busy(load: tuple[float, int]) -> bool:
    """Whether other work holds the CPU at ``load`` (:func:`machine_load`'s pair): see :data:`BUSY_SHARE`."""
    average, cores = load
    return average > BUSY_SHARE * cores


def _processor(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _checkpointing(lm: nn.Module) -> bool:
    """Whether activation checkpointing is on (``transformers`` 5.x's name, else the older one)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(lm), name):
            return bool(getattr(lm, name))
    return False


def probe_key(model: nn.Module, device: torch.device, shapes: ProbeShapes) -> str:
    """What the timings of ``model`` at ``shapes`` on ``device`` depend on, as one string."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    size = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parts = [
        _processor(device),
        f"{torch.get_num_threads()} threads" if device.type == "cpu" else device.type,
        f"torch {torch.__version__}",
        # the host heap's setting decides how much of a step is page faults (micro_batches.map_host_tensors)
        *([f"host heap below {HOST_MMAP_THRESHOLD_BYTES >> 20} MiB"] if device.type == "cpu" else []),
        *(f"{name}={os.environ[name]}" for name in LIBRARY_CAPS if name in os.environ),
        type(lm).__name__,
        f"{size} parameters, {trainable} trained",
        f"vocab {getattr(config, 'vocab_size', '?')}",
        f"checkpointing {_checkpointing(lm)}",
        "shapes " + "x".join(map(str, astuple(shapes))),
    ]
    return "; ".join(parts)


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):  # no file yet, or one cut short: measure and write it anew
        return {}
    return entries if isinstance(entries, dict) else {}


def _timings(kept: list) -> PhaseTimings:
    float32, bfloat16, *stopped = kept
    return PhaseTimings(float(float32), float(bfloat16), bool(stopped and stopped[0]))


def cached_probe(
    path: str | os.PathLike | None,
    key: str,
    measure: Callable[[], PhaseProbe],
    load: Callable[[], tuple[float, int]] | None = None,
) -> PhaseProbe:
    """The timings kept under ``key`` in the file ``path`` (``~`` expanded), else ``measure()``'s,
    kept there for the next run. ``path`` None: always ``measure()``.

    ``load`` (a CPU's: :func:`machine_load`) is read before anything is measured: kept timings that
    were measured busy (:func:`is_busy`), or with no load kept, are measured again when the machine
    is quiet now, and replaced; the new entry keeps the load. None (a GPU): kept timings are always
    used. The returned probe's ``source`` says which (a cache that cannot be written is said too,
    and the run goes on)."""
    if path is None:
        return measure()
    file = Path(path).expanduser()
    now = load() if load is not None else None
    entry, again = _read(file).get(key), ""
    if isinstance(entry, dict):
        try:
            sampling, update = _timings(entry["sampling"]), _timings(entry["update"])
            then = tuple(entry["load"]) if "load" in entry else None
            if now is None or is_busy(now) or (then is not None and not is_busy(then)):
                return PhaseProbe(sampling, update, 0.0, f"as measured {entry['measured']}, kept in {path}")
            was = f"load {then[0]:.1f} on {then[1]} cores" if then else "no load kept"
            again = f"; the kept timings of {entry['measured']} were measured again ({was}; {now[0]:.1f} now)"
        except (KeyError, TypeError, ValueError, IndexError):
            pass  # an entry of another form: measured again below, and replaced
    probe = measure()
    entries = _read(file)
    entries[key] = {
        "sampling": [probe.sampling.float32, probe.sampling.bfloat16, probe.sampling.stopped],
        "update": [probe.update.float32, probe.update.bfloat16, probe.update.stopped],
        "measured": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        **({"load": list(now)} if now is not None else {}),
    }
    source = probe.source + again
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False, suffix=".tmp") as out:
            json.dump(entries, out, indent=1, sort_keys=True)
        os.replace(out.name, file)  # whole or not at all: a run beside this one reads either file
    except OSError as exc:
        return PhaseProbe(probe.sampling, probe.update, probe.seconds, f"{source}; not kept ({exc.strerror})")
    return PhaseProbe(probe.sampling, probe.update, probe.seconds, f"{source}, kept in {path}")

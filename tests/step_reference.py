"""Runs whose metrics and exported weights are recorded, so that a change to the trainer's step
can be checked against the numbers the step gave before it (``tests/data/step_reference.json``,
checked by ``tests/trainer/test_step_reference.py``).

Each run is a few steps of a tiny configuration covering one path of the step: the default job
(with validation), the multi-turn tasks, async training at staleness 0 and 2, per-role losses, remax,
``optimal_token_baseline`` and dynamic sampling. Record them again (after a change that is meant
to change the numbers, saying why in its commit) with::

    python tests/step_reference.py --write

Portable numerics. float32 kernels round differently from one CPU to the next (MKL's and oneDNN's
code paths and ATen's vector width are chosen at run time from the CPU's instruction sets), and
three training steps amplify a last-bit difference: the default job's third grad norm is
0.820707 on an AMD EPYC (AVX2), 0.820760 on an Intel Xeon with AVX-512 and AMX, 0.820697 on the
same Xeon with MKL held to AVX2. So the runs are recorded and checked in a child process whose every
CPU-dispatching library is held to its portable code path (:data:`PORTABLE_NUMERICS`: ATen's
``default`` kernels, MKL's conditional numerical reproducibility in ``COMPATIBLE,STRICT`` mode,
oneDNN at SSE4.1, one thread): the same instructions on every x86-64 CPU, hence the same bits, and
the comparison is exact on every machine. (On the Xeon the held route gives the same bits whatever
MKL, oneDNN or ATen would otherwise pick: ``MKL_ENABLE_INSTRUCTIONS=AVX2`` or no oneDNN cap change
nothing.)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data" / "step_reference.json"

TINY = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=16",
    "task.val_size=4",
    "data.train_batch_size=8",
    "rllm.rollout.n=4",
    "rllm.rollout.n_val=2",
    "rllm.trainer.total_batches=3",
    "rllm.trainer.test_freq=2",
    "rllm.trainer.save_freq=0",
    "rllm.rollout.max_new_tokens=1",  # a one-digit answer without its end token: a random policy scores ~1/13
    "backend.lr=0.001",  # the rate it was recorded at, whatever the tiny model's default becomes
)

#: name -> overrides of :data:`TINY`.
RUNS: dict[str, tuple[str, ...]] = {
    "default": (),
    "chain_turn_level": ("task.name=chain", "rllm.stepwise_advantage.mode=turn_level"),
    "guess_mt_grpo": (
        "task.name=guess",
        "task.max_turns=3",
        "rllm.stepwise_advantage.mode=mt_grpo",
        "rllm.rollout.max_new_tokens=2",
    ),
    "async_staleness_0": ("rllm.async_training.enable=true",),
    "async_staleness_2": (  # the producer samples up to two versions ahead (each step's staleness is logged)
        "rllm.async_training.enable=true",
        "rllm.async_training.staleness_threshold=2",
        "rllm.trainer.total_batches=4",
    ),
    "per_role_losses": (
        "task.name=distill",
        "task.mix_rl=true",
        "rllm.algorithm.use_precomputed_advantage=true",
        "rllm.algorithm.estimator_map={solver:[rloo,cispo]}",
    ),
    "remax": ("rllm.algorithm.adv_estimator=remax",),
    "optimal_token_baseline": ("rllm.algorithm.adv_estimator=optimal_token_baseline",),
    "dynamic_sampling": ("rllm.algorithm.filter_groups.enable=true", "task.train_size=32"),
}

#: Runs whose samples depend on timing: at staleness 2 the producer samples ahead while the trainer
#: updates, and which policy version samples a batch depends on which of the two gets there first
#: (under load the versions, and so every later number, differ from run to run). For these the
#: test checks what the schedule cannot change: the rows and their keys, each step's groups, the bound.
TIMING_DEPENDENT = frozenset({"async_staleness_2"})

#: Environment that holds every CPU-dispatching library to its portable code path (read when the
#: libraries load, so set before the child process starts): see the module docstring.
PORTABLE_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

#: Metrics that measure the machine, not the computation.
VOLATILE_PREFIXES = ("time/", "memory/", "perf/")


def machine() -> str:
    """The machine a recording was made on: the CPU model and torch's version (floating-point
    results may differ in their last bits on another CPU's kernels)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}; torch {torch.__version__}"


def run_reference(name: str, run_dir: Path) -> dict:
    """Run ``name`` of :data:`RUNS` in ``run_dir``: its metric rows (without the volatile ones)
    and the SHA-256 and summary statistics of its exported weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trainer_fakes import make_config

    from rllm_torch.cli.train_command import run

    run(make_config(run_dir, *TINY, *RUNS[name]))
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if not k.startswith(VOLATILE_PREFIXES)})
    weights_file = run_dir / "checkpoints" / "final" / "model.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(str(weights_file))
    flat = torch.cat([t.double().reshape(-1) for _, t in sorted(tensors.items())])
    return {
        "rows": rows,
        "weights_sha256": hashlib.sha256(weights_file.read_bytes()).hexdigest(),
        "weights_sum": float(flat.sum()),
        "weights_sumsq": float((flat * flat).sum()),
    }


def portable_runs(root: Path, *, timeout: float = 900) -> dict:
    """Every run of :data:`RUNS`, made in a child process under :data:`PORTABLE_NUMERICS` (run
    directories under ``root``): ``{"machine": ..., "runs": {name: run_reference(...)}}``.

    Raises:
        subprocess.CalledProcessError / TimeoutExpired: the child failed or ran past ``timeout`` s.
    """
    out = root / "step_reference.json"
    subprocess.run(
        [sys.executable, __file__, "--runs", str(root), str(out)],
        env={**os.environ, **PORTABLE_NUMERICS},
        check=True,
        timeout=timeout,
    )
    return json.loads(out.read_text())


def _runs_here(root: Path, out: Path) -> None:
    import torch

    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # the environment was not read: refuse to record
        sys.exit(
            f"step_reference: ATen runs its {torch.backends.cpu.get_cpu_capability()} kernels, not the portable ones"
        )
    torch.set_num_threads(1)
    runs = {name: run_reference(name, root / name) for name in RUNS}
    out.write_text(json.dumps({"machine": machine(), "runs": runs}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:2] == ["--runs"] and len(sys.argv) == 4:
        _runs_here(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:] == ["--write"]:
        with tempfile.TemporaryDirectory() as tmp:
            DATA.write_text(json.dumps(portable_runs(Path(tmp)), indent=1, sort_keys=True) + "\n")
        print(f"wrote {DATA}")
    else:
        sys.exit("usage: python tests/step_reference.py --write")

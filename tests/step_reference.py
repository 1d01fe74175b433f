"""Runs whose metrics and exported weights are recorded, so that a change to the trainer's step
can be checked against the numbers the step gave before it (``tests/data/step_reference.json``,
checked by ``tests/trainer/test_step_reference.py``).

Each run is a few steps of a tiny configuration covering one path of the step: the default job
(with validation), the multi-turn tasks, async training at staleness 0 and 2, per-role losses, remax,
``optimal_token_baseline`` and dynamic sampling. Record them again (after a change that is meant
to change the numbers, saying why in its commit) with::

    python tests/step_reference.py --write
"""

from __future__ import annotations

import hashlib
import json
import platform
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


def write_reference(root: Path) -> None:
    """Record every run of :data:`RUNS` into :data:`DATA`."""
    out = {"machine": machine(), "runs": {name: run_reference(name, root / name) for name in RUNS}}
    DATA.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/step_reference.py --write")
    with tempfile.TemporaryDirectory() as tmp:
        write_reference(Path(tmp))
    print(f"wrote {DATA}")

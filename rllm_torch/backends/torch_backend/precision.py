"""``backend.dtype``: the compute dtype of each phase (sampling, update), chosen by measuring.

Whether bfloat16 pays is a property of the machine and the shapes, not of a CPU flag: on an Intel
Xeon with AVX-512 BF16 and no AMX, bf16 matmuls ran at 0.44-0.75x float32's rate and the
SmolLM2 recipe ten times slower under bf16 autocast; on a Xeon with AMX the same recipe's
decoding and update ran faster in bf16; an AMD EPYC without either emulates bf16 through float32.
So ``backend.dtype=auto`` times the run's own shapes in both dtypes at start-up
(:func:`measure_phases`: a decoding step at the sampling batch, a training micro-batch's forward
and backward through the policy's scorer) and :func:`choose_precision` picks per phase, with the
rule written once (:func:`choose_dtype`): bfloat16 only where it measured faster by
:data:`BF16_MARGIN` on a CPU, or at least as fast on a GPU (where bf16 also halves activation
memory); a dtype that measured slower is never the default. The start-up summary states the
ratios and the probe's own cost.

bfloat16 is compute only: forwards run under ``torch.autocast`` (FSDP2: a ``MixedPrecisionPolicy``
with bf16 parameters) while weights, gradients and AdamW state stay float32 (what verl's FSDP
workers and TRL's ``bf16=True`` do).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.backends.torch_backend.model import DTYPES, compute_autocast
from rllm_torch.backends.torch_backend.sampling import cache_keyword, default_rollout_batch_size
from rllm_torch.core.errors import ConfigError

__all__ = [
    "BF16_MARGIN",
    "PhaseTimings",
    "PhaseProbe",
    "ProbeShapes",
    "Precision",
    "choose_dtype",
    "choose_precision",
    "measure_phases",
    "probe_shapes",
]

#: On a CPU, bfloat16 is chosen for a phase only when float32 takes at least this many times as
#: long: below it, run-to-run noise (about 10% on a shared 2-core machine) could flip the choice.
BF16_MARGIN = 1.15


@dataclass(frozen=True)
class PhaseTimings:
    """Seconds of one probe call of a phase in each dtype (medians)."""

    float32: float
    bfloat16: float
    stopped: bool = False  # bf16's call was stopped at PROBE_CUTOFF x float32's time: a lower bound

    @property
    def speedup(self) -> float:
        """float32's time over bfloat16's: above 1, bfloat16 is faster."""
        return self.float32 / self.bfloat16 if self.bfloat16 > 0 else math.inf

    def words(self) -> str:
        """``"bf16 1.9x faster"``, ``"bf16 2.3x slower"``, ``"bf16 as fast"``, ``"bf16 over 3.0x
        slower (stopped there)"``."""
        s = self.speedup
        if self.stopped:
            return f"bf16 over {1 / s:.1f}x slower (stopped there)"
        if round(s, 2) == 1.0:
            return "bf16 as fast as float32"
        return f"bf16 {s:.2f}x faster" if s > 1 else f"bf16 {1 / s:.2f}x slower"


@dataclass(frozen=True)
class PhaseProbe:
    """What :func:`measure_phases` measured: each phase's timings, the probe's own wall time (s)
    and where the timings come from, in the start-up summary's words (``"probe 9.8 s"``; kept
    timings: :func:`~.probe_cache.cached_probe`)."""

    sampling: PhaseTimings
    update: PhaseTimings
    seconds: float
    source: str = ""

    def averaged(self, process_group: object | None) -> PhaseProbe:
        """These timings averaged over the ranks of ``process_group`` (a collective: every rank
        calls it), so that every rank chooses alike; itself for None (one process)."""
        if process_group is None:
            return self
        import torch.distributed as dist

        times = [self.sampling.float32, self.sampling.bfloat16, self.update.float32, self.update.bfloat16]
        total = torch.tensor(times, dtype=torch.float64)
        if dist.get_backend(process_group) == "nccl":
            total = total.cuda()
        dist.all_reduce(total, group=process_group)
        mean = (total / dist.get_world_size(process_group)).tolist()
        source = f"{self.source}, averaged over {dist.get_world_size(process_group)} ranks"
        return PhaseProbe(PhaseTimings(*mean[:2]), PhaseTimings(*mean[2:]), self.seconds, source)


@dataclass(frozen=True)
class ProbeShapes:
    """The run's shapes the probe times.

    Args:
        sampling_rows: rows of one decoding step (prompts per sampling call x rollouts).
        context_tokens: tokens already in each row's cache at that step.
        update_rows, update_tokens: a training micro-batch of ``update_rows`` rows of
            ``update_tokens`` tokens.
    """

    sampling_rows: int
    context_tokens: int
    update_rows: int
    update_tokens: int

    def within(self, context: int | None) -> ProbeShapes:
        """These shapes in a model of ``context`` positions (None: no limit known): rows no longer
        than it, the same number of tokens per micro-batch."""
        if context is None:
            return self
        tokens = min(self.update_tokens, context)
        budget = self.update_rows * self.update_tokens
        return ProbeShapes(self.sampling_rows, min(self.context_tokens, context - 1), max(1, budget // tokens), tokens)


#: Tokens in each row's cache at the timed decoding step: a decoding step's cost is its weights'
#: matmuls over the rows (attention over a short cache is a small part), and a short cache keeps
#: the untimed prefill that builds it cheap.
PROBE_CONTEXT_TOKENS = 16
#: Decoding steps per timed sampling call, in one autocast region as ``generate`` runs them:
#: autocast casts each weight once per region, so a call of one step would charge bf16 a cast
#: per step (it measured bf16 1.2x slower than float32 that way on a Xeon with AMX, where the
#: recipe's sampling ran 1.3x faster in bf16).
PROBE_DECODE_STEPS = 8
#: Tokens of the update's pilot call: one short row.
PROBE_PILOT_TOKENS = 16
#: A bf16 probe call is stopped once it has taken this many times float32's (bf16 is then far
#: beyond the margin on the slow side) ...
PROBE_CUTOFF = 3.0
#: ... plus this many seconds in the warm-up, whose first bf16 call builds its kernels.
PROBE_SLACK_S = 1.0
#: A bf16 call is never stopped before this many seconds: a call of microseconds (a tiny model)
#: varies by several times from one call to the next, and costs nothing worth cutting.
PROBE_MIN_CUT_S = 0.25
#: Tokens of the timed training micro-batch: the matmuls' widths are the model's own, this sets
#: their height and bounds the probe's cost to seconds. At 256 tokens AMX's bf16 did not show (SmolLM2,
#: 2 cores: bf16 1.04x faster, while the recipe's update, about 6,000 tokens a micro-batch, took 9.8 s
#: in bf16 and 19.4 s in float32); at 1,024 it did (1.5x), as at 2,048 (1.6x).
PROBE_UPDATE_TOKENS = 1024
#: A row of the timed micro-batch: the responses' length plus a typical chat prompt's.
PROBE_PROMPT_TOKENS = 96


def probe_shapes(config: object, vocab_size: int, response_tokens: int) -> ProbeShapes:
    """The shapes :func:`measure_phases` times for a run: a decoding step of one sampling call's
    rows (``data.train_batch_size`` prompts, at most ``backend.rollout_batch_size`` or its default,
    x ``rllm.rollout.n``) and a micro-batch of :data:`PROBE_UPDATE_TOKENS` tokens (at most
    ``backend.micro_batch_tokens``) in rows of :data:`PROBE_PROMPT_TOKENS` + ``response_tokens``."""
    backend = config.backend
    prompts = min(config.data.train_batch_size, backend.rollout_batch_size or default_rollout_batch_size(vocab_size))
    budget = min(PROBE_UPDATE_TOKENS, backend.micro_batch_tokens or PROBE_UPDATE_TOKENS)
    row = min(PROBE_PROMPT_TOKENS + response_tokens, budget)
    return ProbeShapes(prompts * config.rllm.rollout.n, PROBE_CONTEXT_TOKENS, max(1, budget // row), row)


@dataclass(frozen=True)
class Precision:
    """The compute dtype of each phase (None: float32, no autocast) and the start-up summary's
    words for it; ``warning``: an explicit ``bfloat16`` that measured slower here (else None)."""

    sampling: torch.dtype | None
    update: torch.dtype | None
    summary: str
    warning: str | None = None


def choose_dtype(timings: PhaseTimings, *, device_type: str, margin: float = BF16_MARGIN) -> torch.dtype | None:
    """bfloat16 (``torch.bfloat16``) or float32 (None) for a phase that measured ``timings``: on a
    GPU bf16 where it is at least as fast; elsewhere only where float32 takes at least ``margin``
    times as long. Never a dtype that measured slower."""
    needed = 1.0 if device_type == "cuda" else margin
    return torch.bfloat16 if timings.speedup >= needed else None


def _name(dtype: torch.dtype | None) -> str:
    return "float32" if dtype is None else "bfloat16"


def choose_precision(
    setting: str,
    device: torch.device,
    *,
    pretrained: bool,
    probe: Callable[[], PhaseProbe],
) -> Precision:
    """The phases' dtypes for ``backend.dtype=setting``.

    ``float32``: float32 everywhere, nothing measured. ``auto``: float32 for a model built from
    scratch (the tiny default's exact numbers, nothing measured); for a pretrained model
    (``pretrained``), each phase as :func:`choose_dtype` decides from ``probe()``. ``bfloat16``:
    bfloat16 everywhere, honoured; on a CPU it is measured too, and a phase where it measured slower
    is named in :attr:`Precision.warning` with its ratio.

    Args:
        setting: ``backend.dtype``.
        device: where the policy computes.
        pretrained: ``model.path`` is set.
        probe: measures both phases (:func:`measure_phases` bound to the run's model and shapes;
            tests inject timings).

    Raises:
        ConfigError: an unknown name (float16 included: it needs loss scaling, which the trainer
            does not do), or bfloat16 on a CUDA GPU without bf16 (compute capability below 8.0).
    """
    if setting not in DTYPES:
        hint = " (float16 needs loss scaling; use bfloat16)" if setting == "float16" else ""
        raise ConfigError(f"backend.dtype={setting!r} is not one of {DTYPES}{hint}.")
    if setting == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            "backend.dtype=bfloat16 but this CUDA GPU has no bfloat16 support (compute capability 8.0 or newer "
            "is needed): set backend.dtype=float32."
        )
    if setting == "float32" or (setting == "auto" and not pretrained):
        reason = "" if setting == "float32" else " (backend.dtype=auto: a model built from scratch)"
        return Precision(None, None, f"float32{reason}")
    if setting == "bfloat16" and device.type == "cuda":
        return Precision(torch.bfloat16, torch.bfloat16, "bfloat16 compute (float32 weights and AdamW state)")
    measured = probe()
    phases = {"sampling": measured.sampling, "update": measured.update}
    cost = measured.source
    if setting == "bfloat16":
        slower = [f"{phase} {t.words()}" for phase, t in phases.items() if t.speedup < 1.0]
        warning = (
            f"backend.dtype=bfloat16 measured slower than float32 here ({', '.join(slower)}); honoured as set. "
            "backend.dtype=auto picks each phase's faster dtype."
            if slower
            else None
        )
        ratios = "; ".join(f"{phase}: {t.words()}" for phase, t in phases.items())
        summary = f"bfloat16 compute (float32 weights and AdamW state; measured {ratios}; {cost})"
        return Precision(torch.bfloat16, torch.bfloat16, summary, warning)
    chosen = {phase: choose_dtype(t, device_type=device.type) for phase, t in phases.items()}
    words = "; ".join(f"{phase} {_name(chosen[phase])} ({t.words()})" for phase, t in phases.items())
    weights = ", float32 weights and AdamW state" if any(chosen.values()) else ""
    summary = (
        f"backend.dtype=auto measured on this {'GPU' if device.type == 'cuda' else 'CPU'}: {words}{weights}; {cost}"
    )
    return Precision(chosen["sampling"], chosen["update"], summary)


class _OverTime(Exception):
    """A bf16 probe call ran past its time limit."""


@contextmanager
def _time_limit(deadline: float) -> Iterator[None]:
    """Raise :class:`_OverTime` at the first module call after ``deadline`` (a global forward
    pre-hook: it also fires in a checkpointed backward's recomputation)."""

    def check(module: nn.Module, args: object) -> None:
        if time.perf_counter() > deadline:
            raise _OverTime

    handle = torch.nn.modules.module.register_module_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()


def _time_phase(
    call: Callable[[torch.dtype | None, bool], None], repeats: int, sync: Callable[[], None], *, warm_ups: int = 0
) -> PhaseTimings:
    """``call(dtype, pilot)``'s median wall time in float32 and in bf16 over ``repeats`` timed
    rounds, after a pilot round (``pilot=True``: a small call that builds the kernels) and
    ``warm_ups`` untimed full rounds, the dtypes alternating within a round so that a change of
    load hits both alike. A bf16 call that takes :data:`PROBE_CUTOFF` times its round's float32
    call (at least :data:`PROBE_MIN_CUT_S`; plus :data:`PROBE_SLACK_S` in the pilot) is stopped
    there and the phase's timing ends:
    bf16 is that much slower at least (on a CPU that emulates bf16 a full probe took 3 minutes)."""

    def timed(dtype: torch.dtype | None, pilot: bool) -> float:
        sync()
        start = time.perf_counter()
        call(dtype, pilot)
        sync()
        return time.perf_counter() - start

    float32, bfloat16 = [], []
    for round_ in range(1 + warm_ups + repeats):
        pilot = round_ == 0
        seconds = timed(None, pilot)
        limit = max(PROBE_CUTOFF * seconds, PROBE_MIN_CUT_S) + (PROBE_SLACK_S if pilot else 0.0)
        start = time.perf_counter()
        try:
            with _time_limit(start + limit):
                bf16 = timed(torch.bfloat16, pilot)
        except _OverTime:
            return PhaseTimings(seconds, time.perf_counter() - start, stopped=True)
        if round_ > warm_ups:
            float32.append(seconds)
            bfloat16.append(bf16)
    return PhaseTimings(statistics.median(float32), statistics.median(bfloat16))


def measure_phases(
    model: nn.Module,
    score: Callable[[torch.Tensor, torch.Tensor, torch.dtype | None], torch.Tensor],
    shapes: ProbeShapes,
    *,
    vocab_size: int,
    repeats: tuple[int, int] = (1, 1),
) -> PhaseProbe:
    """Time the run's two phases in float32 and under bfloat16 autocast on ``model``'s device.

    Sampling: :data:`PROBE_DECODE_STEPS` decoding steps of ``shapes.sampling_rows`` rows over a
    cache of ``shapes.context_tokens`` tokens (the model's own forward with its KV cache, in eval
    mode, without gradients, in one autocast region). Update: ``score(input_ids, attention_mask,
    dtype)``'s sum, forward and backward, on ``shapes.update_rows x shapes.update_tokens`` tokens
    (the scorer the update runs, with activation checkpointing and LoRA as configured). Each phase:
    a pilot round (small calls that build the kernels; the update also one untimed full round),
    then ``repeats`` (sampling, update) rounds, the dtypes alternating, medians; a bf16 call that takes :data:`PROBE_CUTOFF` times
    float32's is stopped there (:func:`_time_phase`). On SmolLM2 and 2 CPU cores: 30-40 s where
    bf16 runs natively (a decoding step of 64 rows takes 0.15-0.2 s, a 1,024-token forward and
    backward 4.5-7 s), a few seconds more where it is emulated. Random token ids from a generator
    of its own and the global RNG state restored, so the run's numbers do not depend on the probe;
    gradients are dropped afterwards.

    Returns:
        :class:`PhaseProbe` with the probe's own wall time in ``seconds``.
    """
    start = time.perf_counter()
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    high = max(int(vocab_size), 1)
    decode_ids = torch.randint(0, high, (shapes.sampling_rows, 1), generator=generator).to(device)
    context = torch.randint(0, high, (shapes.sampling_rows, shapes.context_tokens), generator=generator).to(device)
    rows = torch.randint(0, high, (shapes.update_rows, shapes.update_tokens), generator=generator).to(device)
    was_training = model.training
    caches = {}
    body = causal_lm(model).base_model  # the decoder without the head: the cache without [R, T, V] logits
    keyword = cache_keyword(model)

    def decode(dtype: torch.dtype | None, pilot: bool) -> None:
        """The pilot builds the dtype's cache and decodes one step (it builds the kernels); a timed
        call decodes PROBE_DECODE_STEPS steps in one autocast region, as generate runs them (the
        weights cast once), then crops the cache back."""
        steps = 1 if pilot else PROBE_DECODE_STEPS
        with torch.no_grad(), compute_autocast(device, dtype):
            if pilot:
                caches[dtype] = body(context, use_cache=True).past_key_values
            for _ in range(steps):
                model(decode_ids, use_cache=True, **{keyword: caches[dtype]})
        caches[dtype].crop(-steps)

    def update(dtype: torch.dtype | None, pilot: bool) -> None:
        """The pilot: one row of PROBE_PILOT_TOKENS tokens (cheap, and a bf16 that is emulated
        shows itself there); other calls: the micro-batch."""
        ids = rows[:1, :PROBE_PILOT_TOKENS] if pilot else rows
        try:
            score(ids, torch.ones_like(ids), dtype).sum().backward()
        finally:  # stopped or not, nothing of the probe stays in the gradients
            model.zero_grad(set_to_none=True)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.eval()
        try:
            sampling = _time_phase(decode, repeats[0], sync)
        finally:
            caches.clear()
            model.train(was_training)
        training = _time_phase(update, repeats[1], sync, warm_ups=1)  # a full-size call builds its own kernels
    seconds = time.perf_counter() - start
    return PhaseProbe(
        sampling=sampling,
        update=training,
        seconds=seconds,
        source=f"probe {seconds:.1f} s",
    )

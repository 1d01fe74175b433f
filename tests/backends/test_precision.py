"""``backend.dtype``: each phase's dtype chosen from measured timings (never from the CPU's flags).

The decision is tested with injected timings, so every branch runs on every machine; the probe
itself is run for real on a small saved model."""

from __future__ import annotations

import json
import time

import pytest
import torch
import trainer_rank_tasks as tasks

from rllm_torch.backends.torch_backend import TorchBackend
from rllm_torch.backends.torch_backend import actor as actor_module
from rllm_torch.backends.torch_backend import precision as precision_module
from rllm_torch.backends.torch_backend.model import enable_gradient_checkpointing
from rllm_torch.backends.torch_backend.precision import (
    BF16_MARGIN,
    PROBE_CUTOFF,
    PROBE_MIN_CUT_S,
    PROBE_SLACK_S,
    PhaseProbe,
    PhaseTimings,
    ProbeShapes,
    _time_phase,
    choose_dtype,
    choose_precision,
    measure_phases,
)
from rllm_torch.backends.torch_backend.probe_cache import BUSY_SHARE, cached_probe, is_busy, probe_key
from rllm_torch.core.errors import ConfigError

CPU, GPU = torch.device("cpu"), torch.device("cuda")
FASTER, SLOWER, EQUAL = PhaseTimings(2.3, 1.0), PhaseTimings(1.0, 2.3), PhaseTimings(1.0, 1.0)


def _probe(sampling: PhaseTimings, update: PhaseTimings):
    return lambda: PhaseProbe(sampling, update, seconds=3.2, source="probe 3.2 s")


def _never():
    raise AssertionError("nothing should be measured here")


@pytest.mark.parametrize(
    ("timings", "cpu", "gpu"),
    [
        (FASTER, torch.bfloat16, torch.bfloat16),
        (SLOWER, None, None),
        (EQUAL, None, torch.bfloat16),  # a GPU keeps bf16 where it is as fast (and halves activations)
        (PhaseTimings(1.10, 1.0), None, torch.bfloat16),  # 1.10x: within a CPU's noise
        (PhaseTimings(BF16_MARGIN, 1.0), torch.bfloat16, torch.bfloat16),
        (PhaseTimings(0.99, 1.0), None, None),  # slower by 1%: never the default
    ],
    ids=["faster", "slower", "equal", "within-margin", "at-margin", "barely-slower"],
)
def test_a_phase_takes_bf16_only_where_it_measured_faster(timings, cpu, gpu):
    assert choose_dtype(timings, device_type="cpu") is cpu
    assert choose_dtype(timings, device_type="cuda") is gpu


@pytest.mark.parametrize(
    ("sampling", "update", "want"),
    [
        (FASTER, SLOWER, (torch.bfloat16, None)),
        (SLOWER, FASTER, (None, torch.bfloat16)),
        (SLOWER, SLOWER, (None, None)),
        (FASTER, FASTER, (torch.bfloat16, torch.bfloat16)),
        (EQUAL, EQUAL, (None, None)),
    ],
)
def test_auto_chooses_each_phase_from_its_own_timings(sampling, update, want):
    precision = choose_precision("auto", CPU, pretrained=True, probe=_probe(sampling, update))
    assert (precision.sampling, precision.update) == want and precision.warning is None


def test_the_summary_states_each_phase_its_ratio_and_the_probe_cost():
    precision = choose_precision("auto", CPU, pretrained=True, probe=_probe(FASTER, PhaseTimings(1.0, 2.5)))
    assert precision.summary == (
        "backend.dtype=auto measured on this CPU: sampling bfloat16 (bf16 2.30x faster); "
        "update float32 (bf16 2.50x slower), float32 weights and AdamW state; probe 3.2 s"
    )
    neither = choose_precision("auto", CPU, pretrained=True, probe=_probe(SLOWER, EQUAL)).summary
    assert neither == (
        "backend.dtype=auto measured on this CPU: sampling float32 (bf16 2.30x slower); "
        "update float32 (bf16 as fast as float32); probe 3.2 s"
    )


def test_nothing_is_measured_for_float32_or_a_model_built_from_scratch():
    scratch = choose_precision("auto", CPU, pretrained=False, probe=_never)
    assert (scratch.sampling, scratch.update) == (None, None)
    assert scratch.summary == "float32 (backend.dtype=auto: a model built from scratch)"
    plain = choose_precision("float32", CPU, pretrained=True, probe=_never)
    assert (plain.sampling, plain.update, plain.summary) == (None, None, "float32")


def test_an_explicit_bf16_that_measured_slower_is_honoured_with_one_warning_naming_the_ratio():
    precision = choose_precision("bfloat16", CPU, pretrained=True, probe=_probe(SLOWER, FASTER))
    assert (precision.sampling, precision.update) == (torch.bfloat16, torch.bfloat16)
    assert precision.warning == (
        "backend.dtype=bfloat16 measured slower than float32 here (sampling bf16 2.30x slower); honoured as set. "
        "backend.dtype=auto picks each phase's faster dtype."
    )
    assert "\n" not in precision.warning
    faster = choose_precision("bfloat16", CPU, pretrained=False, probe=_probe(FASTER, FASTER))
    assert faster.warning is None and "sampling: bf16 2.30x faster" in faster.summary


def test_a_gpu_measures_the_same_way_and_an_explicit_bf16_there_is_not_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    auto = choose_precision("auto", GPU, pretrained=True, probe=_probe(EQUAL, SLOWER))
    assert (auto.sampling, auto.update) == (torch.bfloat16, None)
    assert auto.summary.startswith("backend.dtype=auto measured on this GPU: sampling bfloat16 (bf16 as fast")
    explicit = choose_precision("bfloat16", GPU, pretrained=True, probe=_never)
    assert (explicit.sampling, explicit.update) == (torch.bfloat16, torch.bfloat16)


def test_bf16_on_a_gpu_without_bf16_and_float16_are_start_up_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(ConfigError, match="backend.dtype=bfloat16 but this CUDA GPU has no bfloat16 support"):
        choose_precision("bfloat16", GPU, pretrained=True, probe=_never)
    with pytest.raises(ConfigError, match="float16 needs loss scaling; use bfloat16"):
        choose_precision("float16", CPU, pretrained=True, probe=_never)
    with pytest.raises(ConfigError, match="float16 needs loss scaling; use bfloat16"):
        TorchBackend(tasks.backend_config("backend.dtype=float16"))


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A small Llama-shaped model saved with save_pretrained: a ``model.path`` as a user gives one."""
    path = tmp_path_factory.mktemp("pretrained")
    TorchBackend(tasks.backend_config("model.arch=llama")).model.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("sampling", "update"), [(FASTER, SLOWER), (SLOWER, FASTER)], ids=["sample-bf16", "update-bf16"]
)
def test_the_backend_samples_and_updates_in_the_dtypes_chosen_for_each(monkeypatch, saved_model, sampling, update):
    measured = []
    monkeypatch.setattr(
        actor_module, "measure_phases", lambda *a, **k: measured.append(a[2]) or PhaseProbe(sampling, update, 1.0, "")
    )
    backend = TorchBackend(
        tasks.backend_config(f"model.path={saved_model}", "backend.num_threads=1", "backend.dtype_cache=null")
    )
    want_sampling = torch.bfloat16 if sampling is FASTER else None
    want_update = torch.bfloat16 if update is FASTER else None
    assert (backend.precision.sampling, backend.precision.update) == (want_sampling, want_update)
    assert backend.actor.scorer.autocast_dtype is want_update and backend.compute_dtype is want_update
    assert backend.init_rollout_engine().autocast_dtype is want_sampling
    rows = dict(backend.summary_rows())
    assert rows["precision"] == backend.precision.summary and "warning" not in rows
    (shapes,) = measured  # the run's own shapes: one sampling call's rows x rollouts
    config = backend.config
    assert shapes.sampling_rows == config.data.train_batch_size * config.rllm.rollout.n


def test_the_probe_times_both_phases_and_leaves_the_model_and_the_random_state_as_they_were(saved_model, monkeypatch):
    # no cut-off: on a loaded machine a slow bf16 call would be stopped and the calls below differ
    monkeypatch.setattr(precision_module, "PROBE_CUTOFF", float("inf"))
    backend = TorchBackend(tasks.backend_config(f"model.path={saved_model}", "backend.dtype=float32"))
    model = backend.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    calls = []

    def score(ids, mask, dtype):
        calls.append((tuple(ids.shape), dtype, torch.is_grad_enabled()))
        backend.actor.scorer.autocast_dtype = dtype
        return backend.actor.scorer(ids, mask).log_probs

    probe = measure_phases(model, score, ProbeShapes(6, 4, 2, 8), vocab_size=len(backend.tokenizer), repeats=(2, 2))
    for timings in (probe.sampling, probe.update):
        assert timings.float32 > 0 and timings.bfloat16 > 0
    assert probe.seconds >= probe.update.float32 + probe.update.bfloat16
    # a pilot round on one short row, an untimed full round and two timed, the dtypes alternating, with gradients
    assert (
        calls
        == [((1, 8), None, True), ((1, 8), torch.bfloat16, True)]
        + [
            ((2, 8), None, True),
            ((2, 8), torch.bfloat16, True),
        ]
        * 3
    )
    assert torch.equal(torch.random.get_rng_state(), state)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_measurements_are_kept_per_machine_model_and_shapes_and_reused(tmp_path):
    """The second run of the same model and shapes on the same machine measures nothing and chooses
    alike; other shapes measure anew; a cut-off file is measured over; no file, every time."""
    cache, calls = tmp_path / "cache" / "dtype.json", []

    def measure(timings):
        return lambda: calls.append(timings) or PhaseProbe(timings, timings, 2.0, "probe 2.0 s")

    stopped = PhaseTimings(1.0, 3.5, stopped=True)
    first = cached_probe(cache, "machine A; shapes 64", lambda: PhaseProbe(FASTER, stopped, 2.0, "probe 2.0 s"))
    assert first.source == f"probe 2.0 s, kept in {cache}"
    again = cached_probe(cache, "machine A; shapes 64", measure(SLOWER))
    assert calls == [] and (again.sampling, again.update) == (FASTER, stopped)  # each phase its own, as kept
    assert again.source.startswith("as measured 20") and again.source.endswith(f", kept in {cache}")
    other = cached_probe(cache, "machine A; shapes 8", measure(SLOWER))
    assert calls == [SLOWER] and other.update == SLOWER
    assert cached_probe(cache, "machine A; shapes 64", measure(EQUAL)).update == stopped  # both entries kept
    cache.write_text('{"machine A; shapes 64": {"sampling": [1.0')  # a write cut short
    assert cached_probe(cache, "machine A; shapes 64", measure(EQUAL)).update == EQUAL and calls[-1] == EQUAL
    assert cached_probe(None, "machine A; shapes 64", measure(SLOWER)).update == SLOWER and calls[-1] == SLOWER
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unkept = cached_probe(blocked / "dtype.json", "k", measure(FASTER))
    assert unkept.update == FASTER and unkept.source.startswith("probe 2.0 s; not kept (")


QUIET, BUSY = (0.3, 2), (2.1, 2)  # 1-minute load average, cores: nothing else running / another 2-thread job


@pytest.mark.parametrize(
    ("load", "busy"), [(QUIET, False), ((1.5, 2), False), ((1.6, 2), True), (BUSY, True), ((2.1, 4), False)]
)
def test_the_machine_is_busy_above_three_quarters_of_its_cores(load, busy):
    assert is_busy(load) is busy  # BUSY_SHARE = 0.75: 1.5 on 2 cores, 3.0 on 4
    assert BUSY_SHARE == 0.75


def test_timings_measured_on_a_busy_machine_are_measured_again_by_the_first_quiet_start_and_replaced(tmp_path):
    cache, calls = tmp_path / "dtype.json", []

    def measure(timings):
        return lambda: calls.append(timings) or PhaseProbe(timings, timings, 2.0, "probe 2.0 s")

    # measured while another job held the cores: used by a start that is busy too
    busy = cached_probe(cache, "k", measure(EQUAL), load=lambda: BUSY)
    assert calls == [EQUAL] and busy.update == EQUAL
    assert cached_probe(cache, "k", measure(SLOWER), load=lambda: BUSY).update == EQUAL and calls == [EQUAL]
    # the first quiet start measures again, says why, and keeps its timings with its load
    again = cached_probe(cache, "k", measure(FASTER), load=lambda: QUIET)
    assert calls == [EQUAL, FASTER] and again.update == FASTER
    assert "the kept timings of 20" in again.source and "measured again (load 2.1 on 2 cores; 0.3 now)" in again.source
    assert again.source.endswith(f", kept in {cache}")
    # quiet timings stay, whatever the load of a later start
    for later in (QUIET, BUSY):
        kept = cached_probe(cache, "k", measure(SLOWER), load=lambda later=later: later)
        assert kept.update == FASTER and kept.source.startswith("as measured 20") and calls == [EQUAL, FASTER]
    # an entry kept before loads were: measured again once the machine is quiet, used as it is while busy
    cache.write_text('{"k": {"sampling": [1.0, 1.0], "update": [1.0, 1.0], "measured": "2026-12-07 14:26"}}')
    assert cached_probe(cache, "k", measure(SLOWER), load=lambda: BUSY).update == EQUAL and len(calls) == 2
    fresh = cached_probe(cache, "k", measure(SLOWER), load=lambda: QUIET)
    assert fresh.update == SLOWER and "2026-12-07 14:26 were measured again (no load kept; 0.3 now)" in fresh.source
    # no load (a GPU's probe): kept timings are used as they are
    cache.write_text('{"k": {"sampling": [1.0, 1.0], "update": [1.0, 1.0], "measured": "2026-12-07 14:26"}}')
    assert cached_probe(cache, "k", measure(FASTER)).update == EQUAL and len(calls) == 3


def test_a_start_on_a_cpu_reads_the_machines_load_for_the_probe_cache(monkeypatch, saved_model, tmp_path):
    loads, measured = [], []
    monkeypatch.setattr(actor_module, "machine_load", lambda: loads.append(1) or QUIET)
    monkeypatch.setattr(
        actor_module,
        "measure_phases",
        lambda *a, **k: measured.append(1) or PhaseProbe(FASTER, SLOWER, 1.0, "probe 1.0 s"),
    )
    config = tasks.backend_config(
        f"model.path={saved_model}", "backend.num_threads=1", f"backend.dtype_cache={tmp_path / 'd.json'}"
    )
    backend = TorchBackend(config)
    assert (
        loads == [1]
        and measured == [1]
        and (backend.precision.sampling, backend.precision.update) == (torch.bfloat16, None)
    )
    kept = json.loads((tmp_path / "d.json").read_text())
    assert [entry["load"] for entry in kept.values()] == [list(QUIET)]


def test_the_key_names_the_machine_the_model_and_the_shapes(saved_model):
    backend = TorchBackend(
        tasks.backend_config(
            f"model.path={saved_model}", "backend.dtype=float32", "backend.gradient_checkpointing=false"
        )
    )
    model, cpu = backend.model, torch.device("cpu")
    key = probe_key(model, cpu, ProbeShapes(64, 16, 2, 128))
    assert f"torch {torch.__version__}" in key and "LlamaForCausalLM" in key and "threads" in key
    assert "host heap below 32 MiB" in key  # timings taken with another heap setting are measured again
    assert key != probe_key(model, cpu, ProbeShapes(32, 16, 2, 128))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert key != probe_key(model, cpu, ProbeShapes(64, 16, 2, 128))
    finally:
        torch.set_num_threads(threads)
    enable_gradient_checkpointing(model)
    checkpointed = probe_key(model, cpu, ProbeShapes(64, 16, 2, 128))
    assert key != checkpointed
    model.get_input_embeddings().weight.requires_grad_(False)  # fewer trained parameters (as LoRA): another key
    assert checkpointed != probe_key(model, cpu, ProbeShapes(64, 16, 2, 128))


def test_a_bf16_call_far_slower_than_float32_is_stopped_there_and_the_phase_takes_float32():
    """Where bf16 is emulated, a full probe took minutes: the bf16 call is cut at PROBE_CUTOFF x
    float32's time (plus the warm-up's slack), at the next module call."""
    layer, seen = torch.nn.Identity(), []

    def call(dtype, warm_up):
        seen.append((dtype, warm_up))
        for _ in range(1 if dtype is None else 10_000):
            layer(torch.zeros(1))
            time.sleep(0.002)

    start = time.perf_counter()
    timings = _time_phase(call, 1, lambda: None)
    elapsed = time.perf_counter() - start
    assert timings.stopped and seen == [(None, True), (torch.bfloat16, True)]  # stopped in the warm-up
    # the uncut call sleeps 10,000 x 2 ms = 20 s; the bounds leave room for a loaded machine's late wake-ups
    limit = max(PROBE_CUTOFF * timings.float32, PROBE_MIN_CUT_S) + PROBE_SLACK_S
    assert limit <= timings.bfloat16 < limit + 7
    assert elapsed < 15 and choose_dtype(timings, device_type="cuda") is None
    assert timings.words().startswith("bf16 over ") and timings.words().endswith("x slower (stopped there)")
    fast = _time_phase(lambda dtype, warm_up: layer(torch.zeros(1)), 2, lambda: None)
    assert not fast.stopped and fast.float32 > 0 and fast.bfloat16 > 0


def test_a_call_of_milliseconds_is_timed_whole_however_many_times_slower_bf16_is():
    """Below PROBE_MIN_CUT_S nothing is cut: a call of microseconds varies by several times from
    one call to the next (a tiny model's probe was stopped on such noise), and costs nothing."""
    layer = torch.nn.Identity()

    def call(dtype, warm_up):
        time.sleep(0.001 if dtype is None else 0.010)  # bf16 10x slower, all of it under the floor
        layer(torch.zeros(1))  # where a stop would come

    timings = _time_phase(call, 3, lambda: None)
    assert not timings.stopped and 0.001 <= timings.float32 < timings.bfloat16 < PROBE_MIN_CUT_S
    assert choose_dtype(timings, device_type="cpu") is None  # measured slower: float32

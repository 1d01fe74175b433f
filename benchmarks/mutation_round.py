"""A mutation round: plant plausible one-line bugs in the package, one at a time, run the tests
that should catch each, and report which were caught (the kill rate). Each bug is a string the
source must contain exactly once, its replacement, and the tests to run.

    python benchmarks/mutation_round.py                  # every mutant, a table on stdout
    python benchmarks/mutation_round.py --only M3 M7     # some of them
    python benchmarks/mutation_round.py --write          # and benchmarks/RESULTS_mutation.md

The file is restored after each mutant (also on Ctrl-C). Run it on a clean checkout: it edits the
sources in place while it runs.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS_mutation.md"


@dataclass(frozen=True)
class Mutant:
    """One planted bug: in ``path``, ``old`` (exactly once) becomes ``new``; ``tests`` should fail."""

    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS: list[Mutant] = [
    # --- rLLM fidelity (issue 40) ---
    Mutant(
        "M1",
        "an option given both ways: the keyword silently wins",
        "rllm_torch/rllm/dispatch.py",
        "if option in from_config and not _same(from_config[option], value):",
        "if False:",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M2",
        "rLLM's config is not passed to an estimator with rLLM's signature",
        "rllm_torch/rllm/dispatch.py",
        "    if entry.takes_config:\n",
        "    if False:\n",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M3",
        "traj_groups hold every trajectory, untrained ones too",
        "rllm_torch/rllm/roles.py",
        "    if rows_N is None:\n        return [batch.trajectory_groups[g] for g in groups]",
        "    if True:\n        return [batch.trajectory_groups[g] for g in groups]",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M4",
        "the role is read from the trajectories' shared name, not the group id",
        "rllm_torch/rllm/types.py",
        "            self.group_role = role_of_group_id(self.group_id)",
        "            self.group_role = self.trajectories[0].name if self.trajectories else DEFAULT_GROUP_ROLE",
        ("tests/rllm/test_rllm_conformance.py", "tests/rllm/test_types.py"),
    ),
    Mutant(
        "M5",
        "from_config on a section reads nothing (the defaults)",
        "rllm_torch/rllm/config_sources.py",
        "        given = {name: section.get(key) for key, name in by_key.items()}",
        "        given = {name: None for key, name in by_key.items()}",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M6",
        "rejection sampling mode none drops nothing (the old pass-through)",
        "rllm_torch/trainer/pipeline/rejection_sampling.py",
        "        if size < config.min_trajs_per_group:",
        "        if size < config.min_trajs_per_group and config.mode == 'episode':",
        ("tests/rllm/test_rllm_conformance.py", "tests/trainer/test_filtering.py"),
    ),
    Mutant(
        "M7",
        "too_easy counts groups with a mean of at least .5",
        "rllm_torch/rllm/metrics.py",
        "(flat_M & (mean_M >= 1.0))",
        "(flat_M & (mean_M >= 0.5))",
        ("tests/rllm/test_rllm_conformance.py", "tests/rllm/test_collect.py"),
    ),
    Mutant(
        "M8",
        "an episode without a termination reason is not counted",
        "rllm_torch/trainer/logs/step_metrics.py",
        "reasons = Counter((e.termination_reason or TerminationReason.UNKNOWN).value for e in episodes)",
        "reasons = Counter(e.termination_reason.value for e in episodes if e.termination_reason is not None)",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M9",
        "compat='rllm' does not reach REINFORCE++ baseline's singleton rule",
        "rllm_torch/rllm/config.py",
        'compat = RLLM_COMPAT_ESTIMATOR_OPTIONS.get(name, {}) if self.compat == "rllm" else {}',
        "compat = {}",
        ("tests/rllm/test_rllm_conformance.py",),
    ),
    Mutant(
        "M10",
        "a registered loss aggregates over its micro-batch, not the global mini-batch",
        "rllm_torch/backends/torch_backend/update.py",
        "scale = normaliser if (own or mode) == mode else None",
        "scale = None",
        (
            "tests/cli/test_rllm_port.py::test_a_users_loss_registered_by_decorator_trains_as_the_builtin_it_reimplements",
        ),
    ),
    Mutant(
        "M11",
        "rLLM's eps_clip does not reach the clip",
        "rllm_torch/trainer/rllm_settings.py",
        '    "rllm.algorithm.eps_clip": "backend.clip_ratio_low",\n',
        "",
        ("tests/cli/test_rllm_port.py",),
    ),
    # --- needs and the plan (issue 41) ---
    Mutant(
        "M12",
        "an estimator's declared needs are dropped at registration",
        "rllm_torch/rllm/registry.py",
        "        needs=needs,",
        "        needs=frozenset(),",
        ("tests/core/estimators/test_remax.py", "tests/backends/test_kl_and_critic.py"),
    ),
    Mutant(
        "M13",
        "a map entry's role is ignored: every role runs the default estimator",
        "rllm_torch/rllm/plan.py",
        "            name = registered_name(self.algorithm_config.estimator_for(role))",
        "            name = registered_name(self.algorithm_config.estimator)",
        ("tests/rllm/test_rllm_conformance.py", "tests/rllm/test_collect.py"),
    ),
    # --- per-role maps (issue 44's class: combinations of the maps) ---
    Mutant(
        "M15",
        "a map giving every role one loss trains with the run's loss instead",
        "rllm_torch/backends/torch_backend/update.py",
        "            return [(used[0] if used else self.loss_fn, None)]",
        "            return [(self.loss_fn, None)]",
        ("tests/backends/test_per_role_losses.py",),
    ),
    Mutant(
        "M16",
        "the trainer's (estimator, loss) pair silently overrides the config's loss_fn_map for a role",
        "rllm_torch/rllm/config_fields.py",
        "            if role in losses and losses[role] != loss:",
        "            if False:",
        ("tests/backends/test_per_role_losses.py",),
    ),
    Mutant(
        "M17",
        "a group's reward baseline from an earlier step is replaced by this step's greedy reward",
        "rllm_torch/trainer/pipeline/baselines.py",
        "if group.group_id in rewards and group.reward_baseline is None:",
        "if group.group_id in rewards:",
        ("tests/core/estimators/test_remax.py",),
    ),
    # --- losses (issue 44's class: a mask on the case random batches never produce) ---
    Mutant(
        "M14",
        "DPPO-KL drops a token that moved against its positive advantage",
        "rllm_torch/core/losses/trust_region.py",
        "(binary_kl <= high) | (p <= p_old)",
        "(binary_kl <= high) | (p >= p_old)",
        ("tests/core/losses/test_trust_region.py",),
    ),
    # --- the step (issue 41) and the async producer, the stop, the user's task (issues 42-44) ---
    Mutant(
        "M18",
        "a stop request seen by one rank stops that rank alone",
        "rllm_torch/trainer/unified_trainer.py",
        "if self.stop_signals is None or not self.ranks.any(self.stop_signals.requested):",
        "if self.stop_signals is None or not self.stop_signals.requested:",
        ("tests/cli/test_sigterm_one_rank.py",),
    ),
    Mutant(
        "M19",
        "a batch taken from the buffer does not wake the producer (drop mode refills only at a sync)",
        "rllm_torch/trainer/pipeline/async_rollouts.py",
        "            self.ready -= item is not None\n            self._changed.notify_all()",
        "            self.ready -= item is not None",
        ("tests/trainer/test_async_buffer.py",),
    ),
    Mutant(
        "M20",
        "the buffer holds one sync interval more than the staleness bound allows",
        "rllm_torch/trainer/pipeline/async_rollouts.py",
        "        return (self.bound + 1) * self.trigger_parameter_sync_step",
        "        return (self.bound + 2) * self.trigger_parameter_sync_step",
        ("tests/trainer/test_async_buffer.py",),
    ),
    Mutant(
        "M21",
        "async/staleness_mean divides by the histogram's length, not the groups",
        "rllm_torch/trainer/pipeline/async_rollouts.py",
        '"async/staleness_mean": total / max(sum(counts), 1),',
        '"async/staleness_mean": total / max(len(counts), 1),',
        ("tests/trainer/test_async_buffer.py",),
    ),
    Mutant(
        "M22",
        "partial rollouts are ignored: one batch samples at a time",
        "rllm_torch/trainer/pipeline/async_rollouts.py",
        "self.max_sampling = config.capacity if config.partial_rollout else 1",
        "self.max_sampling = 1",
        ("tests/trainer/test_async_buffer.py",),
    ),
    Mutant(
        "M23",
        "async/buffer_batches counts the end-of-data marker as a batch",
        "rllm_torch/trainer/batches.py",
        "self.config.version_at(state.global_step), self.producer.ready)",
        "self.config.version_at(state.global_step), self.producer.buffer.qsize())",
        ("tests/trainer/test_async_training.py::test_no_group_is_trained_beyond_the_staleness_bound",),
    ),
    Mutant(
        "M24",
        "what the estimators need never reaches the backend",
        "rllm_torch/trainer/unified_trainer.py",
        "state = TrainerState(needs=self.settings.plan.needs)",
        "state = TrainerState()",
        ("tests/trainer/test_step_needs.py",),
    ),
    Mutant(
        "M25",
        "the passes honour sum_pi_squared but not a declared need of old log-probs",
        "rllm_torch/backends/torch_backend/passes.py",
        'and not trainer_state.needs & {"old_log_probs", "sum_pi_squared"}',
        'and "sum_pi_squared" not in trainer_state.needs',
        ("tests/trainer/test_step_needs.py",),
    ),
    Mutant(
        "M26",
        "dynamic sampling's extra draws cross into the next epoch",
        "rllm_torch/trainer/batches.py",
        "        if item is None or item.epoch != state.epoch:",
        "        if item is None:",
        ("tests/trainer/test_step_reference.py", "tests/trainer/test_dynamic_sampling.py"),
    ),
    Mutant(
        "M27",
        "loss_agg_mode is dropped on the way to the update",
        "rllm_torch/backends/torch_backend/update.py",
        'self.loss_agg_mode = self.algorithm.loss_agg_mode or "token-mean"',
        'self.loss_agg_mode = "token-mean"',
        ("tests/backends/test_losses.py::test_each_loss_fn_and_aggregation_mode_changes_a_real_training_step",),
    ),
    Mutant(
        "M28",
        "backend.top_entropy_quantile is dropped on the way to the loss",
        "rllm_torch/backends/torch_backend/update.py",
        "        if s.top_entropy_quantile < 1:",
        "        if False:",
        ("tests/backends/test_loss_options_and_filters_in_training.py::test_each_option_changes_the_step_it_acts_on",),
    ),
    Mutant(
        "M29",
        "the backend's on_epoch_end is not called when the run ends within an epoch",
        "rllm_torch/trainer/unified_trainer.py",
        "if state.batch_in_epoch == len(dataloader) or last_step:",
        "if state.batch_in_epoch == len(dataloader):",
        ("tests/trainer/test_unified_trainer.py",),
    ),
    Mutant(
        "M30",
        "an outcome estimator may declare a per-token input (and would get None)",
        "rllm_torch/rllm/registry.py",
        'if form != "tokens" and (per_token := sorted(needs & TOKEN_INPUTS)):',
        "if False:",
        ("tests/trainer/test_step_needs.py",),
    ),
    Mutant(
        "M31",
        "the checks ignore the trainer's estimator map",
        "rllm_torch/trainer/config_checks.py",
        "    algorithm_config, plan = _check_algorithm(config, estimator_map)",
        "    algorithm_config, plan = _check_algorithm(config, None)",
        ("tests/trainer/test_unified_trainer.py", "tests/backends/test_per_role_losses.py"),
    ),
    Mutant(
        "M32",
        "the group-of-one warning forgets estimators whose baseline is the group's",
        "rllm_torch/trainer/logs/summary.py",
        "grouped = [name for name in sorted(plan.estimators) if registration(name).group_baseline]",
        "grouped = []",
        ("tests/cli/test_command_line.py",),
    ),
    Mutant(
        "M33",
        "a reward returning numpy's bool is refused again",
        "rllm_torch/trainer/reward_threads.py",
        "    if isinstance(reward, (bool, np.bool_)):",
        "    if isinstance(reward, bool):",
        ("tests/test_reward_types.py", "tests/trainer/test_workflow_engine.py"),
    ),
    Mutant(
        "M34",
        "a second run in a live run directory is not stopped (the lock is not exclusive)",
        "rllm_torch/trainer/logs/run_lock.py",
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        ("tests/cli/test_run_directory.py",),
    ),
    Mutant(
        "M35",
        "the response length ignores the task's answers (one answer token's margin)",
        "rllm_torch/backends/torch_backend/task_defaults.py",
        "ANSWER_MARGIN = 2",
        "ANSWER_MARGIN = 1",
        ("tests/backends/test_task_defaults.py",),
    ),
    Mutant(
        "M36",
        "the trainer's own advantages run even when a backend overrides rLLM's compute_advantages",
        "rllm_torch/trainer/step.py",
        "self.own_advantages = type(backend).compute_advantages is not BackendProtocol.compute_advantages",
        "self.own_advantages = False",
        ("tests/trainer/test_unified_trainer.py",),
    ),
]


def run_mutant(mutant: Mutant, timeout: int) -> tuple[bool, float, str]:
    """``(caught, seconds, note)``: the mutant planted, its tests run, the file restored."""
    path = ROOT / mutant.path
    source = path.read_text()
    if source.count(mutant.old) != 1:
        return False, 0.0, f"not planted: the text occurs {source.count(mutant.old)} times"
    path.write_text(source.replace(mutant.old, mutant.new))
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        caught = done.returncode != 0
        last = (done.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        caught, last = True, "timed out"
    finally:
        path.write_text(source)
    return caught, time.perf_counter() - start, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names to run (default: all)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant's tests")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    rows = []
    for mutant in chosen:
        caught, seconds, note = run_mutant(mutant, args.timeout)
        rows.append((mutant, caught, seconds, note))
        print(
            f"{mutant.name:4} {'caught  ' if caught else 'SURVIVED'} {seconds:6.1f} s  {mutant.what}  [{note}]",
            flush=True,
        )
    killed = sum(caught for _, caught, _, _ in rows)
    print(f"kill rate: {killed}/{len(rows)} = {killed / max(len(rows), 1):.0%}")
    if args.write:
        lines = [
            "# Mutation round",
            "",
            f"`python benchmarks/mutation_round.py --write` on {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}: each mutant planted alone, its tests run, the source restored.",
            "",
            "| mutant | planted bug | file | caught | tests |",
            "|---|---|---|---|---|",
        ]
        for mutant, caught, _, _ in rows:
            tests = ", ".join(f"`{t}`" for t in mutant.tests)
            lines.append(
                f"| {mutant.name} | {mutant.what} | `{mutant.path}` | {'yes' if caught else '**no**'} | {tests} |"
            )
        lines += ["", f"Kill rate: {killed} of {len(rows)} ({killed / max(len(rows), 1):.0%})."]
        RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

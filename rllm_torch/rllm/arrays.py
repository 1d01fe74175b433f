"""rLLM's list-of-arrays estimator functions, computed through the tensor estimators.

Packing and unpacking happen on the numpy side: the groups are concatenated once (equal groups
become one ``[G, K]`` array, the dense layout) and the results come back as views of one array.

Same names, arguments and results as rLLM's ``rllm.trainer.algorithms.advantage`` /
``rl_algo`` (``rllm.experimental.common`` before 2026-06): a list of per-group 1-D numpy arrays
in, a pair of per-group lists of numpy arrays out (float64 for float64 or Python-float rewards,
float32 otherwise). Each takes both of rLLM's calls (:func:`~rllm_torch.rllm.arrays.rllm_call`):
today's ``fn(rewards, algorithm_config, traj_groups=...)``, whose options come from the config,
and the seed's ``fn(rewards, norm_adv_by_std_in_grpo=..., epsilon=...)``. No option is
swallowed: one the estimator does not take is refused (the run-wide options excepted, which
every estimator accepts and uses where they apply), and one given both ways must agree.
Differences, on purpose (docs/design.md §3): ``epsilon`` is configurable (the misspelled
``episilon`` keyword still works, with a ``DeprecationWarning``); RLOO on a group of one returns
a pair; REINFORCE returns new float arrays, never the caller's objects; REINFORCE++ baseline
gives a group of one baseline 0 unless its option ``singleton_baseline="own_reward"`` (rLLM's
code) is set.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from enum import Enum

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.rllm.config import RUN_OPTIONS, AlgorithmConfig
from rllm_torch.rllm.dispatch import RLLM_CONFIG_OPTIONS, compute_advantages
from rllm_torch.rllm.registry import registered_name, registration

__all__ = [
    "get_rllm_adv_estimator",
    "get_adv_estimator",
    "rllm_call",
    "calculate_echo_advantages",
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
    "by_group",
]

ArrayGroups = Sequence[np.ndarray]


def get_rllm_adv_estimator(name: str | Enum) -> Callable:
    """The estimator registered under ``name``, callable the rLLM way: per-group arrays in,
    ``(advantages_by_group, returns_by_group)`` out (rLLM's API).

    For a built-in this is rLLM's arrays-form function (e.g. ``calculate_grpo_advantages``); for
    an ``"arrays"`` registration, the function itself; for a ``"tensors"`` registration, an
    adapter that packs the arrays, runs the tensor function and returns per-group arrays (float64
    for float64 or Python-float rewards, float32 otherwise). The built-ins and the adapter take
    both of rLLM's calls (:func:`rllm_call`): today's ``fn(rewards, algorithm_config,
    traj_groups=...)`` and the seed's ``fn(rewards, norm_adv_by_std_in_grpo=..., ...)``. For the
    tensor form of any name, see :func:`get_tensor_adv_estimator`.

    Raises:
        UnknownEstimatorError: ``name`` is not registered; the message lists the registered names.
        ConfigError: ``name`` is token-level: it has no per-group form.
    """
    entry = registration(name)
    if entry.form == "arrays":
        return entry.fn
    key = registered_name(name)
    if entry.form == "tokens":
        raise ConfigError(
            f"estimator {key!r} is token-level (it needs [B, T] token rewards and a response mask), so it has no rLLM "
            "per-group form; call it through compute_advantages(TokenRewards(...), name) or get_tensor_adv_estimator(name)."
        )

    def rllm_form(rewards, algorithm_config=None, **options):
        return rllm_call(key, rewards, algorithm_config, **options)  # no seed signature: options are keywords

    rllm_form.__name__ = rllm_form.__qualname__ = f"{getattr(entry.fn, '__name__', key)}_by_group"
    rllm_form.__doc__ = f"rLLM form of the tensor estimator {key!r}: per-group arrays in, per-group lists out."
    return rllm_form


def get_adv_estimator(name: str | Enum) -> Callable:
    """rLLM's newer name of :func:`get_rllm_adv_estimator` (its ``terminal-rl`` branch,
    ``rllm/trainer/algorithms/advantage.py``, pairs it with ``register_adv_estimator``): the
    estimator registered under ``name``, called with per-group arrays, returning
    ``(advantages_by_group, returns_by_group)``.

    Raises:
        UnknownEstimatorError: ``name`` is not registered (a ``ValueError``, as rLLM's); the
            message lists the registered names.
        ConfigError: ``name`` is token-level: it has no per-group form.
    """
    return get_rllm_adv_estimator(name)


def rllm_call(
    name: str | Enum,
    rewards: object,
    algorithm_config: object = None,
    *,
    seed_option: str | None = None,
    **options: object,
) -> tuple[list, list]:
    """Run the estimator registered as ``name`` (a built-in or a tensor-form registration) on
    rLLM's per-group arrays, called either way rLLM calls its estimators:

    * today's (rLLM since 2026-05-02): ``fn(rewards, algorithm_config, traj_groups=...)``; the
      options come from the config (see :func:`compute_advantages`);
    * the seed's: ``fn(rewards, norm_adv_by_std_in_grpo=..., epsilon=...)``, where the second
      positional argument, when it is not an :class:`AlgorithmConfig`, is the seed's first
      positional option ``seed_option`` (``norm_adv_by_std_in_grpo`` for GRPO, ``epsilon`` for
      REINFORCE++ baseline and PRPO).

    Returns:
        ``(advantages_by_group, returns_by_group)``: one array per group (the same lists twice, as rLLM).

    Raises:
        ConfigError: an option the estimator does not take (the run-wide ones excepted, which every
            estimator accepts), one given both as a keyword and in ``algorithm_config`` with
            different values, or a config section (a dict) where an ``AlgorithmConfig`` belongs.
        TypeError: a second positional argument where the seed's signature had none.
    """
    config = algorithm_config
    if algorithm_config is not None and not isinstance(algorithm_config, AlgorithmConfig):
        label = registered_name(name)
        if hasattr(algorithm_config, "keys"):
            raise ConfigError(
                f"{label}: algorithm_config must be an AlgorithmConfig, got a {type(algorithm_config).__name__}; build "
                "one with AlgorithmConfig.from_config(section)."
            )
        if seed_option is None:
            raise TypeError(
                f"{label} takes (rewards, algorithm_config, **options); got {algorithm_config!r} as algorithm_config."
            )
        if seed_option in options:
            raise TypeError(f"{label} got {seed_option!r} both positionally and as a keyword.")
        config, options[seed_option] = None, algorithm_config  # the seed's order
    traj_groups = options.pop("traj_groups", None)
    episilon = options.pop("episilon", None)
    if config is not None and registered_name(name) in RLLM_DROPS_KEYWORDS:
        if episilon is not None:
            options["epsilon"] = episilon  # rLLM's spelling: dropped alike
        options, episilon = _dropped_as_rllm(registered_name(name), config, options), None
    return by_group(
        lambda batch: compute_advantages(
            batch, name, algorithm_config=config, traj_groups=traj_groups, episilon=episilon, **options
        ),
        rewards,
    )


#: rLLM's estimators whose function (``fn(rewards, algorithm_config, **kwargs)``) reads its options
#: from the config and drops every keyword, GRPO's ``epsilon`` too (fixed at 1e-6 in
#: ``calculate_grpo_advantages``); its REINFORCE++ baseline and PRPO read an ``epsilon`` keyword.
RLLM_DROPS_KEYWORDS = frozenset({"grpo", "echo", "reinforce", "rloo"})


def _dropped_as_rllm(name: str, config: AlgorithmConfig, options: dict) -> dict:
    """``options`` less the run-wide ones that :func:`compute_advantages` would take from the
    keyword (rLLM's config has no field for them, and ``config`` leaves them at their default)
    where ``name``'s rLLM function drops them, each with one warning naming it and where to set it."""
    from_config = config.estimator_call_kwargs(name)
    for option in [o for o in options if o in RUN_OPTIONS and o not in RLLM_CONFIG_OPTIONS]:
        if options[option] != from_config[option]:
            warnings.warn(
                f"estimator {name!r}: {option}={options[option]!r} as a keyword is dropped, as rLLM's "
                f"calculate_{name}_advantages drops every keyword: algorithm_config.{option}={from_config[option]!r} "
                "is used; drop the keyword, or set the config.",
                UserWarning,
                stacklevel=4,  # the caller of calculate_*_advantages
            )
        del options[option]
    return options


def _pack(rewards: ArrayGroups) -> tuple[GroupedRewards, np.ndarray] | None:
    """Per-group numpy arrays (or lists) packed on the numpy side: one concatenation, and equal
    groups as one ``[G, K]`` array (the dense layout); ``(batch, sizes)``. None when the input is
    not plain numeric 1-D groups (tensors, ragged nesting, non-numbers): the caller then takes
    :meth:`GroupedRewards.from_groups`, which names what is wrong."""
    if isinstance(rewards, (np.ndarray, str, bytes)) or not isinstance(rewards, Sequence) or not rewards:
        return None
    if any(isinstance(g, Tensor) for g in rewards):
        return None
    try:
        sizes = np.fromiter(map(len, rewards), dtype=np.int64, count=len(rewards))
        flat = np.concatenate(rewards)
    except (TypeError, ValueError):
        return None
    if flat.ndim != 1 or flat.shape[0] != sizes.sum() or flat.dtype.kind not in "biuf":
        return None
    rewards_N = torch.from_numpy(np.ascontiguousarray(flat))
    if sizes[0] > 0 and (sizes == sizes[0]).all():
        return GroupedRewards.from_padded(rewards_N.view(len(sizes), int(sizes[0]))), sizes
    index_N = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))
    batch = GroupedRewards(rewards_N, index_N, len(sizes), None, group_major=True)
    batch.__dict__["counts"] = torch.from_numpy(sizes)
    return batch, sizes


def _unpack(values_N: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Flat values back to one view per group (rows of one ``[G, K]`` array for equal groups)."""
    if len(sizes) and sizes[0] > 0 and (sizes == sizes[0]).all():
        return list(values_N.reshape(len(sizes), int(sizes[0])))
    return np.split(values_N, np.cumsum(sizes)[:-1])


def by_group(estimator: Callable, rewards: ArrayGroups, **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``estimator(batch, **options)`` (a tensor estimator) on rLLM's per-group arrays, its
    advantages back as per-group arrays, returned twice (as rLLM returns the same lists)."""
    return _by_group(estimator, rewards, **options)


def _by_group(estimator: Callable, rewards: ArrayGroups, **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    packed = _pack(rewards)
    if packed is None:  # the general path: any sequences or tensors, with checks that name the group
        batch = GroupedRewards.from_groups(rewards)
        advantages, _ = estimator(batch, **options)
        by_group = [values.cpu().numpy() for values in batch.split(advantages)]
        return by_group, by_group
    batch, sizes = packed
    advantages, _ = estimator(batch, **options)
    by_group = _unpack(advantages.numpy(), sizes)
    return by_group, by_group


def calculate_grpo_advantages(
    rewards: ArrayGroups,
    algorithm_config: AlgorithmConfig | bool | None = None,
    episilon: float | None = None,
    **options,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GRPO per group (rLLM API); see :func:`rllm_torch.core.estimators.grpo` for the formula.

    Called as rLLM calls it today, ``(rewards, algorithm_config, traj_groups=...)`` (the options
    from the config), or as the seed did, ``(rewards, norm_adv_by_std_in_grpo, episilon)``;
    ``epsilon`` and ``std_correction`` as keywords. See :func:`~rllm_torch.rllm.arrays.rllm_call`.
    """
    return rllm_call(
        "grpo", rewards, algorithm_config, seed_option="norm_adv_by_std_in_grpo", episilon=episilon, **options
    )


def calculate_echo_advantages(
    rewards: ArrayGroups, algorithm_config: AlgorithmConfig | None = None, **options
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """ECHO's advantages, GRPO's (rLLM API, branch ``terminal-rl``; arXiv:2605.24517): the run's
    ``echo`` loss adds its cross-entropy term (:func:`rllm_torch.core.losses.echo_loss`)."""
    return rllm_call("echo", rewards, algorithm_config, **options)


def calculate_reinforce_advantages(
    rewards: ArrayGroups, algorithm_config: AlgorithmConfig | None = None, **options
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE: advantage = reward (rLLM API); see :func:`rllm_torch.core.estimators.reinforce`."""
    return rllm_call("reinforce", rewards, algorithm_config, **options)


def calculate_reinforce_plus_plus_baseline_advantages(
    rewards: ArrayGroups,
    algorithm_config: AlgorithmConfig | float | None = None,
    epsilon: float | None = None,
    **options,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE++ baseline (rLLM API); see :func:`rllm_torch.core.estimators.reinforce_plus_plus_baseline`.

    ``(rewards, algorithm_config, epsilon)`` as rLLM today, or the seed's ``(rewards, epsilon)``."""
    if epsilon is not None:
        options["epsilon"] = epsilon
    return rllm_call("reinforce_plus_plus_baseline", rewards, algorithm_config, seed_option="epsilon", **options)


def calculate_rloo_advantages(
    rewards: ArrayGroups, algorithm_config: AlgorithmConfig | None = None, **options
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Reinforce Leave-one-out (rLLM API), arXiv:2402.14740; see :func:`rllm_torch.core.estimators.rloo`."""
    return rllm_call("rloo", rewards, algorithm_config, **options)


def calculate_prpo_advantages(
    rewards: ArrayGroups,
    algorithm_config: AlgorithmConfig | float | None = None,
    epsilon: float | None = None,
    **options,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """PRPO, batch-level whitening (rLLM API); see :func:`rllm_torch.core.estimators.prpo`.

    ``(rewards, algorithm_config, epsilon)`` as rLLM today, or the seed's ``(rewards, epsilon)``."""
    if epsilon is not None:
        options["epsilon"] = epsilon
    return rllm_call("prpo", rewards, algorithm_config, seed_option="epsilon", **options)


def calculate_grpo_advantages_per_group(
    rewards: np.ndarray,
    norm_adv_by_std_in_grpo: bool = True,
    episilon: float | None = None,
    *,
    epsilon: float | None = None,
    std_correction: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """GRPO for one group's ``[n]`` rewards (rLLM ``rl_algo`` API): ``(advantages, returns)``.

    rLLM gives a group of one mean 0 and std 1 (``A = r / (1 + ε)``), as here."""
    options = {} if epsilon is None else {"epsilon": epsilon}
    advantages, returns = calculate_grpo_advantages(
        [rewards], norm_adv_by_std_in_grpo, episilon, std_correction=std_correction, **options
    )
    return advantages[0], returns[0]


def calculate_rloo_advantages_per_group(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RLOO for one group's ``[n]`` rewards (rLLM ``rl_algo`` API); a pair also for ``n == 1``."""
    advantages, returns = calculate_rloo_advantages([rewards])
    return advantages[0], returns[0]

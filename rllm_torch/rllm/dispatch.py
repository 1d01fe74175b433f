"""Calling a registered estimator (:mod:`~rllm_torch.rllm.registry`) on packed tensors
(:func:`get_tensor_adv_estimator`, :func:`compute_advantages`), with its options checked and
its outputs checked for shape, dtype and device; rLLM's per-group arrays go through
:mod:`~rllm_torch.rllm.arrays` (``get_rllm_adv_estimator``), which calls this.

Options reach an estimator by name: ``compute_advantages(batch, "pass_at_k", k=2)``, or from a
run's config, ``rllm.algorithm.estimator_options.pass_at_k.k=2``. The run-wide options
(:data:`~rllm_torch.rllm.config.RUN_OPTIONS`: ``norm_adv_by_std_in_grpo``, ``epsilon``, ``std_correction``, ``gamma``,
``lam``, given to every estimator by the trainer) are passed to an estimator only if its
signature names them (or takes ``**kwargs``); any other option must be one the estimator
takes, else :class:`~rllm_torch.core.errors.ConfigError` lists the ones it does.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from enum import Enum

from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks
from rllm_torch.core.errors import (
    ConfigError,
    RLLMTorchError,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.bound_estimator import BoundEstimator, _check_batch_kind
from rllm_torch.rllm.config import BATCH_INPUTS, RUN_OPTIONS, AlgorithmConfig
from rllm_torch.rllm.registry import CALL_DATA, Registration, registered_name, registration
from rllm_torch.rllm.settings import check_value, declared, default_of

__all__ = ["get_tensor_adv_estimator", "compute_advantages", "bind_estimator"]

_RUN_DECLARATIONS = {name: declared(AlgorithmConfig)[name] for name in RUN_OPTIONS}
_RUN_DEFAULTS = {f.name: default_of(f) for f in dataclasses.fields(AlgorithmConfig) if f.name in RUN_OPTIONS}
#: The run-wide options that are fields of rLLM's own ``AlgorithmConfig`` (its estimators read them there).
RLLM_CONFIG_OPTIONS = frozenset({"norm_adv_by_std_in_grpo"})


def get_tensor_adv_estimator(name: str | Enum) -> Callable[[GroupedRewards], tuple[Tensor, Tensor]]:
    """The estimator registered under ``name`` as a function of packed rewards:
    ``fn(batch: GroupedRewards, **options) -> (advantages [N], returns [N])``.

    For a built-in, its tensor implementation (e.g. :func:`~rllm_torch.grpo`); for a
    ``"tensors"`` or ``"tokens"`` registration, the function itself (a ``"tokens"`` one takes a
    :class:`~rllm_torch.core.tokens.TokenRewards`); for an ``"arrays"`` registration, an adapter
    through :func:`compute_advantages` (which gives it the groups as per-group arrays).

    Raises:
        UnknownEstimatorError: ``name`` is not registered; the message lists the registered names.
    """
    entry = registration(name)
    if entry.tensor_fn is not None:
        return entry.tensor_fn
    if entry.form in ("tensors", "tokens"):
        return entry.fn
    key = registered_name(name)

    def tensor_form(batch: GroupedRewards, **options) -> tuple[Tensor, Tensor]:
        return compute_advantages(batch, key, **options)

    tensor_form.__name__ = tensor_form.__qualname__ = f"{getattr(entry.fn, '__name__', key)}_on_tensors"
    return tensor_form


def _checked_run_options(options: dict[str, object]) -> dict[str, object]:
    """The run-wide options, each through its declaration (``AlgorithmConfig``'s): its own check
    (raising the core's typed errors), else its bounds and choices."""
    checked = {}
    for name, value in options.items():
        declaration = _RUN_DECLARATIONS[name]
        checked[name] = (
            declaration.check(value) if declaration.check else check_value(value, declaration, declaration.key)
        )
    return checked


def _merged_options(name: str, config: AlgorithmConfig | None, explicit: dict[str, object]) -> dict[str, object]:
    """The defaults of the run-wide options, then ``config``'s options, then the ``explicit``
    keywords, where an option given both ways with two values (``1`` is not ``True``) takes the
    config's, with a warning naming both (rLLM's estimators read the config and drop such a
    keyword: ``rllm/trainer/algorithms/advantage.py``). A run-wide option rLLM's config does not
    have (``epsilon``, ``std_correction``, ``gamma``, ``lam``) left at its default in ``config`` is
    not given there: the keyword's value is used, as rLLM's estimators read such a keyword."""
    from_config = config.estimator_call_kwargs(name) if config is not None else {}
    for option, value in explicit.items():
        if option not in from_config or _same(from_config[option], value):
            continue
        if (
            option in RUN_OPTIONS
            and option not in RLLM_CONFIG_OPTIONS
            and _same(from_config[option], _RUN_DEFAULTS[option])
        ):
            continue  # rLLM's config has no such field: the keyword is the only value given, and it is used
        where = (
            f"algorithm_config.{option}"
            if option in RUN_OPTIONS
            else f"algorithm_config.estimator_options[{name!r}][{option!r}]"
        )
        warnings.warn(
            f"estimator {name!r}: {option}={value!r} as a keyword and {where}={from_config[option]!r} differ; the "
            "config's value is used (as rLLM does): drop the keyword, or set the config.",
            UserWarning,
            stacklevel=_caller_level(),
        )
        explicit = {k: v for k, v in explicit.items() if k != option}
    return dict(_RUN_DEFAULTS) | from_config | explicit


def _caller_level() -> int:
    """The ``stacklevel`` (from the function calling this one) of the first frame outside rllm_torch."""
    package, frame, level = os.path.dirname(os.path.dirname(__file__)), sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _same(a: object, b: object) -> bool:
    """One value given twice: equal, and a bool only equal to the same bool (``1`` is not ``True``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # e.g. tensors of several elements
        return a is b


def _call_kwargs(
    entry: Registration, name: str, options: dict[str, object], config: AlgorithmConfig | None
) -> dict[str, object]:
    """The keywords ``entry`` is called with: the run-wide options it declares, every other option
    (each must be declared) and rLLM's ``algorithm_config`` (built from the options when the caller
    gave none)."""
    run_options = _checked_run_options({k: options[k] for k in RUN_OPTIONS})
    own = {k: v for k, v in options.items() if k not in RUN_OPTIONS}
    accepted = entry.options
    if accepted is not None:
        unknown = sorted(set(own) - accepted)
        if unknown:
            takes = ", ".join(sorted(accepted - BATCH_INPUTS)) or "no option"
            raise ConfigError(
                f"estimator {name!r} takes no option {', '.join(map(repr, unknown))}; it takes: {takes}. "
                f"(From a run's config: rllm.algorithm.estimator_options.{name}.<option>=value, with a leading + for an "
                f"option the schema does not list, e.g. a custom estimator's. The run-wide "
                f"options {', '.join(RUN_OPTIONS)} go to every estimator, each taking those it declares.)"
            )
    kwargs = {k: v for k, v in run_options.items() if accepted is None or k in accepted} | own
    if entry.takes_config:
        kwargs["algorithm_config"] = config if config is not None else _config_of(name, run_options, own)
    return kwargs


def bind_estimator(
    estimator: str | Enum, algorithm_config: AlgorithmConfig | None = None, **options: object
) -> BoundEstimator:
    """The estimator registered as ``estimator`` with its options merged and checked (as
    :func:`compute_advantages` does them), ready to call on batches: a run's plan binds each
    role's estimator once.

    Raises:
        UnknownEstimatorError: ``estimator`` is not registered.
        ConfigError: an option it does not take; an option given two ways with two values.
        InvalidRewardsError / InvalidRewardTypeError: a run option out of range or of the wrong type.
    """
    entry = registration(estimator)
    name = registered_name(estimator)
    merged = _merged_options(name, algorithm_config, options)
    return BoundEstimator(name, entry, _call_kwargs(entry, name, merged, algorithm_config))


def _config_of(name: str, run_options: dict[str, object], own: dict[str, object]) -> AlgorithmConfig:
    """An :class:`AlgorithmConfig` carrying the call's options, for an estimator that reads
    rLLM's ``algorithm_config`` when the caller gave only keywords."""
    data = {k: v for k, v in own.items() if k not in BATCH_INPUTS}
    return AlgorithmConfig(estimator=name, **run_options, estimator_options={name: data} if data else {})


def compute_advantages(
    batch: GroupedRewards | TokenRewards,
    estimator: str | Enum,
    *,
    algorithm_config: AlgorithmConfig | None = None,
    traj_groups: list | None = None,
    episilon: float | None = None,
    **options: object,
) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as ``estimator`` on packed rewards.

    Built-ins and ``form="tensors"`` estimators run on the tensors directly; an ``"arrays"``
    estimator gets per-group numpy arrays (float32, float64 for float64 rewards) and its
    per-group output is packed back; a ``"tokens"`` estimator (``reinforce_plus_plus``, ``gae``)
    takes a :class:`~rllm_torch.core.tokens.TokenRewards` instead of a ``GroupedRewards``.

    **Options.** Each comes from one of three places, in this order: its default, the
    ``algorithm_config`` (its run-wide fields and ``estimator_options[estimator]``), a keyword.
    An option given both in ``algorithm_config`` and as a keyword must have the same value
    (else :class:`~rllm_torch.core.errors.ConfigError`): nothing is silently overridden. An
    estimator registered with rLLM's signature ``fn(rewards, algorithm_config, **kwargs)`` gets
    the config (one built from the options when none is given) and, when it takes them,
    ``traj_groups``.

    Across ranks (``batch.process_group`` set): built-ins and tensor-form estimators written
    with the layout's reductions (``batch.layout``, see :class:`~rllm_torch.core.segment.SegmentLayout`)
    reduce over the ranks, as each built-in's docstring counts. An ``"arrays"`` estimator, whose
    per-group arrays must hold whole groups, gets the whole batch instead: every rank gathers
    every reward once (:meth:`GroupedRewards.all_ranks`, ``O(N)`` payload and a host sync) and
    every ``traj_groups`` object (one ``all_gather_object``), runs the function on all groups,
    and keeps its own trajectories' values; every rank must call it.

    Args:
        batch: the packed rewards of one role (a ``TokenRewards`` for a token-level estimator).
        estimator: a registered name.
        algorithm_config: rLLM's :class:`AlgorithmConfig`, whose options the estimator gets.
        traj_groups: the batch's groups (``TrajectoryGroup``, one per group of ``batch``, each
            with exactly the trajectories packed), for an estimator that reads them (rLLM's
            OPO example reads response lengths from their steps); None: none.
        norm_adv_by_std_in_grpo, epsilon, std_correction, gamma, lam: the run-wide options
            (:data:`RUN_OPTIONS`), passed to the estimators that declare them (``gamma`` and
            ``lam`` must lie in ``[0, 1]``).
        episilon: rLLM's spelling of ``epsilon``, deprecated (a ``DeprecationWarning``).
        **options: the estimator's own options (e.g. ``k`` of ``pass_at_k``, ``whiten`` of
            ``gae``), each one the estimator must take.

    Returns:
        ``(advantages, returns)`` in the batch's flat order (``[N]``; ``[B, T]`` for a
        token-level estimator), on its device, detached (the autograd contract of every
        estimator: advantages are constants of the loss).

    Across ranks, with a batch built with ``validate=True``: one ``all_gather_object`` first
    checks that every rank calls the same estimator with the same options (and raises on every
    rank an error that any rank hit, e.g. a name registered on one rank only); with
    ``validate=False`` that is the caller's to ensure.

    Raises:
        UnknownEstimatorError: ``estimator`` is not registered.
        ConfigError: an option the estimator does not take (the message lists those it takes);
            an option given two ways with two values (``epsilon`` and ``episilon`` too);
            ``traj_groups`` missing for an estimator that needs them.
        InvalidRewardsError / InvalidRewardTypeError: a run option out of range or of the wrong
            type; a ``GroupedRewards`` given to a token-level estimator or the reverse.
        DistributedBatchError: the ranks call different estimators or options (validated batches).
        EstimatorOutputError: a custom estimator returned something else than a pair with one
            value per trajectory (per token, for a token-level one).
    """
    if episilon is not None:
        warnings.warn("`episilon` is deprecated; use `epsilon`.", DeprecationWarning, stacklevel=2)
        if "epsilon" in options and not _same(options["epsilon"], episilon):
            raise ConfigError(
                f"got epsilon={options['epsilon']!r} and the deprecated episilon={episilon!r}; pass only epsilon."
            )
        options["epsilon"] = episilon
    checked = batch.process_group is not None and getattr(batch, "validated", False)
    try:
        if algorithm_config is not None and not isinstance(algorithm_config, AlgorithmConfig):
            raise ConfigError(
                f"algorithm_config must be an AlgorithmConfig (AlgorithmConfig.from_config(cfg) builds one from a config "
                f"section), got {type(algorithm_config).__name__}."
            )
        bound = bind_estimator(estimator, algorithm_config, **options)
        _check_batch_kind(batch, bound.registration, bound.name)
    except RLLMTorchError as exc:
        if not checked:
            raise
        agree_across_ranks(batch.process_group, exc, {}, must_match=())
    if checked:  # every rank must run the same estimator with the same options, or collectives cross
        facts = {k: v for k, v in bound.options.items() if k not in CALL_DATA | BATCH_INPUTS}
        agree_across_ranks(
            batch.process_group,
            None,
            {"estimator": bound.name, "options": facts},
            must_match=("estimator", "options"),
        )
    return bound(batch, traj_groups=traj_groups)


# compute_advantages' signature shows the run-wide options, read from their one declaration
compute_advantages.__signature__ = inspect.signature(compute_advantages).replace(
    parameters=[
        *list(inspect.signature(compute_advantages).parameters.values())[:2],
        *(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for name, default in _RUN_DEFAULTS.items()
        ),
        *list(inspect.signature(compute_advantages).parameters.values())[2:],
    ]
)

"""Calling a registered estimator (:mod:`~rllm_torch.rllm.registry`) in the form the caller has:
rLLM's per-group arrays (:func:`get_rllm_adv_estimator`), or packed tensors
(:func:`get_tensor_adv_estimator`, :func:`compute_advantages`), with its options checked and
its outputs checked for shape, dtype and device.

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
import warnings
from collections.abc import Callable
from enum import Enum

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks
from rllm_torch.core.errors import (
    ConfigError,
    EstimatorOutputError,
    InvalidRewardTypeError,
    RLLMTorchError,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import accumulation_dtype
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.config import BATCH_INPUTS, RUN_OPTIONS, AlgorithmConfig
from rllm_torch.rllm.registry import Registration, registered_name, registration
from rllm_torch.rllm.settings import check_value, declared, default_of

__all__ = ["get_rllm_adv_estimator", "get_tensor_adv_estimator", "compute_advantages"]

_RUN_DECLARATIONS = {name: declared(AlgorithmConfig)[name] for name in RUN_OPTIONS}
_RUN_DEFAULTS = {f.name: default_of(f) for f in dataclasses.fields(AlgorithmConfig) if f.name in RUN_OPTIONS}


def get_rllm_adv_estimator(name: str | Enum) -> Callable:
    """The estimator registered under ``name``, callable the rLLM way: per-group arrays in,
    ``(advantages_by_group, returns_by_group)`` out (rLLM's API).

    For a built-in this is rLLM's arrays-form function (e.g. ``calculate_grpo_advantages``); for
    an ``"arrays"`` registration, the function itself; for a ``"tensors"`` registration, an
    adapter that packs the arrays, runs the tensor function and returns per-group arrays (float64
    for float64 or Python-float rewards, float32 otherwise); options it does not declare are
    ignored, as rLLM's functions ignore extra keywords. For the tensor form of any name, see
    :func:`get_tensor_adv_estimator`.

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

    def rllm_form(rewards, **kwargs):
        from rllm_torch.rllm.arrays import by_group

        options = {k: v for k, v in kwargs.items() if entry.options is None or k in entry.options}
        return by_group(lambda batch: compute_advantages(batch, key, **options), rewards)

    rllm_form.__name__ = rllm_form.__qualname__ = f"{getattr(entry.fn, '__name__', key)}_by_group"
    rllm_form.__doc__ = f"rLLM form of the tensor estimator {key!r}: per-group arrays in, per-group lists out."
    return rllm_form


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


def _options_for(entry: Registration, name: str, run_options: dict[str, object], options: dict[str, object]) -> dict:
    """The keywords ``entry`` is called with: the run options it declares, and every other option
    (each must be declared)."""
    accepted = entry.options
    if accepted is not None:
        unknown = sorted(set(options) - accepted)
        if unknown:
            takes = ", ".join(sorted(accepted - {"batch", "rewards"} - BATCH_INPUTS)) or "no option"
            raise ConfigError(
                f"estimator {name!r} takes no option {', '.join(map(repr, unknown))}; it takes: {takes}. "
                f"(From a run's config: rllm.algorithm.estimator_options.{name}.<option>=value, with a leading + for an "
                f"option the schema does not list, e.g. a custom estimator's. The run-wide "
                f"options {', '.join(RUN_OPTIONS)} go to every estimator, each taking those it declares.)"
            )
    chosen = {k: v for k, v in run_options.items() if accepted is None or k in accepted}
    return chosen | options


def compute_advantages(
    batch: GroupedRewards | TokenRewards,
    estimator: str | Enum,
    *,
    episilon: float | None = None,
    **options: object,
) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as ``estimator`` on packed rewards.

    Built-ins and ``form="tensors"`` estimators run on the tensors directly; an ``"arrays"``
    estimator gets per-group numpy arrays (float32, float64 for float64 rewards) and its
    per-group output is packed back; a ``"tokens"`` estimator (``reinforce_plus_plus``, ``gae``)
    takes a :class:`~rllm_torch.core.tokens.TokenRewards` instead of a ``GroupedRewards``.

    Across ranks (``batch.process_group`` set): built-ins and tensor-form estimators written
    with the layout's reductions (``batch.layout``, see :class:`~rllm_torch.core.segment.SegmentLayout`)
    reduce over the ranks, as each built-in's docstring counts. An ``"arrays"`` estimator, whose
    per-group arrays must hold whole groups, gets the whole batch instead: every rank gathers
    every reward once (:meth:`GroupedRewards.all_ranks`, ``O(N)`` payload and a host sync), runs
    the function on all groups, and keeps its own trajectories' values; every rank must call it.

    Args:
        batch: the packed rewards of one role (a ``TokenRewards`` for a token-level estimator).
        estimator: a registered name.
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
            ``epsilon`` and ``episilon`` both given, and different.
        InvalidRewardsError / InvalidRewardTypeError: a run option out of range or of the wrong
            type; a ``GroupedRewards`` given to a token-level estimator or the reverse.
        DistributedBatchError: the ranks call different estimators or options (validated batches).
        EstimatorOutputError: a custom estimator returned something else than a pair with one
            value per trajectory (per token, for a token-level one).
    """
    run_options = {name: options.pop(name, default) for name, default in _RUN_DEFAULTS.items()}
    if episilon is not None:
        warnings.warn("`episilon` is deprecated; use `epsilon`.", DeprecationWarning, stacklevel=2)
        epsilon = run_options["epsilon"]
        if epsilon not in (_RUN_DEFAULTS["epsilon"], episilon):  # the default: not given
            raise ConfigError(f"got epsilon={epsilon!r} and the deprecated episilon={episilon!r}; pass only epsilon.")
        run_options["epsilon"] = episilon
    checked = batch.process_group is not None and getattr(batch, "validated", False)
    try:
        entry = registration(estimator)
        name = registered_name(estimator)
        _check_batch_kind(batch, entry, name)
        call_options = _options_for(entry, name, _checked_run_options(run_options), options)
    except RLLMTorchError as exc:
        if not checked:
            raise
        agree_across_ranks(batch.process_group, exc, {}, must_match=())
    if checked:  # every rank must run the same estimator with the same options, or collectives cross
        agree_across_ranks(
            batch.process_group,
            None,
            {"estimator": name, "options": call_options},
            must_match=("estimator", "options"),
        )
    if entry.tensor_fn is not None or entry.form in ("tensors", "tokens"):
        out = (entry.tensor_fn or entry.fn)(batch, **call_options)
        return _check_tensor_pair(out, batch, name)
    whole, mine = batch.all_ranks()  # the whole batch on every rank: the function sees every group
    dtype = accumulation_dtype(whole.rewards.dtype)
    groups = [g.cpu().numpy() for g in whole.split(whole.rewards.detach().to(dtype))]
    out = entry.fn(rewards=groups, **call_options)
    advantages, returns = _pack_array_pair(out, whole, name, dtype)
    return advantages[mine], returns[mine]


def _check_batch_kind(batch: object, entry: Registration, name: str) -> None:
    if entry.form == "tokens" and not isinstance(batch, TokenRewards):
        raise InvalidRewardTypeError(
            f"estimator {name!r} is token-level: pass a TokenRewards(token_level_rewards_BT, response_mask_BT) "
            f"(values=values_BT for gae), not a {type(batch).__name__}."
        )
    if entry.form != "tokens" and not isinstance(batch, GroupedRewards):
        hint = (
            " For token rewards, pack the sequence scores: GroupedRewards.from_padded(sequence_scores(rewards_BT).view(G, K))."
            if isinstance(batch, TokenRewards)
            else ""
        )
        raise InvalidRewardTypeError(
            f"estimator {name!r} works on groups: pass a GroupedRewards, not a {type(batch).__name__}.{hint}"
        )


def _check_tensor_pair(out: object, batch: GroupedRewards | TokenRewards, name: str) -> tuple[Tensor, Tensor]:
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        raise EstimatorOutputError(
            f"estimator {name!r} must return a pair (advantages, returns) of tensors, got {type(out).__name__}."
        )
    for what, t in zip(("advantages", "returns"), out, strict=True):
        if not t.is_floating_point():
            raise EstimatorOutputError(
                f"estimator {name!r} returned {what} of dtype {t.dtype}; return a floating-point tensor."
            )
        expected = batch.shape if isinstance(batch, TokenRewards) else (batch.num_trajectories,)
        if tuple(t.shape) != tuple(expected):
            per = "one per token" if isinstance(batch, TokenRewards) else "one per trajectory in flat order"
            raise EstimatorOutputError(
                f"estimator {name!r} returned {what} of shape {tuple(t.shape)}; expected {tuple(expected)}, {per}."
            )
    advantages, returns = out
    if advantages is returns:  # keep rLLM's one object for both
        detached = advantages.detach()
        return detached, detached
    return advantages.detach(), returns.detach()


def _pack_array_pair(out: object, batch: GroupedRewards, name: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise EstimatorOutputError(
            f"estimator {name!r} must return a pair (advantages_by_group, returns_by_group), got {type(out).__name__}."
        )
    packed = []
    for what, by_group in zip(("advantages", "returns"), out, strict=True):
        if len(by_group) != batch.num_groups:
            raise EstimatorOutputError(
                f"estimator {name!r} returned {what} for {len(by_group)} groups; the batch has {batch.num_groups}."
            )
        per_group = []
        for g, values in enumerate(by_group):
            try:
                arr = (
                    values.detach().cpu()
                    if isinstance(values, Tensor)
                    else torch.from_numpy(np.asarray(values, dtype=np.float64).reshape(-1))
                )
            except (TypeError, ValueError) as exc:
                raise EstimatorOutputError(
                    f"estimator {name!r} returned {what} for group {g} that are not numbers: {exc}"
                ) from exc
            per_group.append(arr.to(dtype))
        try:
            packed.append(batch.merge(per_group).to(batch.device))
        except ValueError as exc:
            raise EstimatorOutputError(
                f"estimator {name!r} returned {what} that do not match the groups: {exc}"
            ) from exc
    return packed[0], packed[1]


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

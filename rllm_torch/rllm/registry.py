"""The advantage-estimator registry: rLLM's ``register_rllm_adv_estimator`` /
``get_rllm_adv_estimator``, and :func:`compute_advantages`, which runs any registered estimator
on packed rewards.

An estimator is registered in one of two forms:

* ``form="arrays"`` (rLLM's): ``fn(rewards: list[np.ndarray], **options) ->
  (advantages_by_group, returns_by_group)``, per-group arrays in and out. Existing rLLM custom
  estimators register and run unchanged.
* ``form="tensors"`` (the fast path): ``fn(batch: GroupedRewards, **options) ->
  (advantages [N], returns [N])``, like the built-ins in :mod:`rllm_torch.core.estimators`.
* ``form="tokens"`` (token level): ``fn(batch: TokenRewards, **options) -> (advantages [B, T],
  returns [B, T])``, like ``reinforce_plus_plus`` and ``gae``.

Options reach an estimator by name: ``compute_advantages(batch, "pass_at_k", k=2)``, or from a
run's config, ``rllm.algorithm.estimator_options.pass_at_k.k=2``. The run-wide options
(:data:`RUN_OPTIONS`: ``norm_adv_by_std_in_grpo``, ``epsilon``, ``std_correction``, ``gamma``,
``lam``, given to every estimator by the trainer) are passed to an estimator only if its
signature names them (or takes ``**kwargs``); any other option must be one the estimator
takes, else :class:`~rllm_torch.core.errors.ConfigError` lists the ones it does.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks
from rllm_torch.core.errors import (
    ConfigError,
    EstimatorOutputError,
    EstimatorRegistrationError,
    InvalidRewardTypeError,
    RLLMTorchError,
    UnknownEstimatorError,
)
from rllm_torch.core.estimators.scaling import check_correction, check_discount, check_epsilon, check_flag
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import accumulation_dtype
from rllm_torch.core.tokens import TokenRewards

__all__ = [
    "register_rllm_adv_estimator",
    "get_rllm_adv_estimator",
    "get_tensor_adv_estimator",
    "registered_estimator_names",
    "is_token_level",
    "estimator_options",
    "compute_advantages",
    "RUN_OPTIONS",
]

EstimatorForm = Literal["arrays", "tensors", "tokens"]
_FORMS = ("arrays", "tensors", "tokens")
_FORM_HELP = "'arrays' (rLLM per-group arrays), 'tensors' (GroupedRewards) or 'tokens' (TokenRewards)"

# Options a run gives every estimator call; each estimator receives those its signature names.
RUN_OPTIONS = ("norm_adv_by_std_in_grpo", "epsilon", "std_correction", "gamma", "lam")


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    form: EstimatorForm
    tensor_fn: Callable | None  # tensor implementation behind a built-in's arrays-form function
    options: frozenset[str] | None  # keyword options the function accepts; None = **kwargs


_REGISTRY: dict[str, _Entry] = {}


def _key(name: object) -> str:
    if isinstance(name, Enum):
        name = name.value
    if not isinstance(name, str) or not name:
        raise UnknownEstimatorError(
            f"an estimator name must be a non-empty str or rLLMAdvantageEstimator, got {name!r}."
        )
    return name


def _accepted_options(fn: Callable) -> frozenset[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(
        p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def _add(name: object, fn: Callable, form: EstimatorForm, tensor_fn: Callable | None) -> None:
    if form not in _FORMS:
        raise ConfigError(f"form must be {_FORM_HELP}, got {form!r}.")
    if not callable(fn):
        raise EstimatorRegistrationError(f"estimator {name!r} must be callable, got {type(fn).__name__}.")
    key = _key(name)
    if key in _REGISTRY and _REGISTRY[key].fn is not fn:
        warnings.warn(
            f"advantage estimator {key!r} is registered again: {getattr(fn, '__qualname__', fn)} replaces {getattr(_REGISTRY[key].fn, '__qualname__', _REGISTRY[key].fn)}.",
            UserWarning,
            stacklevel=3,
        )
    _REGISTRY[key] = _Entry(fn, form, tensor_fn, _accepted_options(tensor_fn or fn))


def register_rllm_adv_estimator(name: str | Enum, *, form: EstimatorForm = "arrays") -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name`` (rLLM's API).

    Args:
        name: a str or an ``rLLMAdvantageEstimator`` member (stored by its value).
        form: ``"arrays"`` for rLLM's per-group numpy form, ``"tensors"`` for a function of a
            :class:`~rllm_torch.GroupedRewards` returning ``[N]`` tensors (the fast path),
            ``"tokens"`` for a function of a :class:`~rllm_torch.core.tokens.TokenRewards`
            returning ``[B, T]`` tensors (token level: the trainer gives it token rewards).

    Registering a name again replaces the earlier function, with a ``UserWarning``.

    Example:
        >>> @register_rllm_adv_estimator("centered_doc_example", form="tensors")
        ... def centered(batch):
        ...     adv = batch.rewards.float() - batch.rewards.float().mean()
        ...     return adv, adv
        >>> compute_advantages(GroupedRewards.from_groups([[1.0, 0.0]]), "centered_doc_example")[0]
        tensor([ 0.5000, -0.5000])
    """

    if callable(name) and not isinstance(name, (str, Enum)):
        raise EstimatorRegistrationError(
            f"register_rllm_adv_estimator needs a name: write @register_rllm_adv_estimator('my_name'), "
            f"not a bare @register_rllm_adv_estimator above {getattr(name, '__name__', name)!r}."
        )
    _key(name)
    if form not in _FORMS:
        raise ConfigError(f"form must be {_FORM_HELP}, got {form!r}.")

    def decorator(fn: Callable) -> Callable:
        _add(name, fn, form, None)
        return fn

    return decorator


def register_builtin(
    name: str | Enum, arrays_fn: Callable | None, tensor_fn: Callable, form: EstimatorForm = "tensors"
) -> None:
    """Register a built-in: its rLLM arrays-form function (if it has one), run through its tensor
    implementation; ``form`` is the tensor implementation's (``"tensors"`` or ``"tokens"``)."""
    if arrays_fn is None:
        _add(name, tensor_fn, form, None)
    else:
        _add(name, arrays_fn, "arrays", tensor_fn)


def registered_estimator_names() -> list[str]:
    """The registered estimator names, sorted."""
    return sorted(_REGISTRY)


def _entry(name: object) -> _Entry:
    key = _key(name)
    if key not in _REGISTRY:
        raise UnknownEstimatorError(
            f"unknown advantage estimator {key!r}; registered: {', '.join(registered_estimator_names())}. "
            "Register a custom one with @register_rllm_adv_estimator(name) before it is used (from rllm-torch-train: "
            "imports=[your_module])."
        )
    return _REGISTRY[key]


def is_token_level(name: str | Enum) -> bool:
    """Whether the estimator registered as ``name`` is token-level (``form="tokens"``: it takes a
    :class:`~rllm_torch.core.tokens.TokenRewards` and returns ``[B, T]`` advantages).

    Raises:
        UnknownEstimatorError: ``name`` is not registered.
    """
    return _entry(name).form == "tokens"


def estimator_options(name: str | Enum) -> frozenset[str] | None:
    """The keyword options the estimator registered as ``name`` takes (``None``: any, it takes
    ``**kwargs``).

    Raises:
        UnknownEstimatorError: ``name`` is not registered.
    """
    return _entry(name).options


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
    entry = _entry(name)
    if entry.form == "arrays":
        return entry.fn
    key = _key(name)
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
    entry = _entry(name)
    if entry.tensor_fn is not None:
        return entry.tensor_fn
    if entry.form in ("tensors", "tokens"):
        return entry.fn
    key = _key(name)

    def tensor_form(batch: GroupedRewards, **options) -> tuple[Tensor, Tensor]:
        return compute_advantages(batch, key, **options)

    tensor_form.__name__ = tensor_form.__qualname__ = f"{getattr(entry.fn, '__name__', key)}_on_tensors"
    return tensor_form


def _checked_run_options(options: dict[str, object]) -> dict[str, object]:
    checks = {
        "norm_adv_by_std_in_grpo": lambda v: check_flag(v, "norm_adv_by_std_in_grpo"),
        "epsilon": check_epsilon,
        "std_correction": check_correction,
        "gamma": lambda v: check_discount(v, "gamma"),
        "lam": lambda v: check_discount(v, "lam"),
    }
    return {k: checks[k](v) for k, v in options.items()}


def _options_for(entry: _Entry, name: str, run_options: dict[str, object], options: dict[str, object]) -> dict:
    """The keywords ``entry`` is called with: the run options it declares, and every other option
    (each must be declared)."""
    accepted = entry.options
    if accepted is not None:
        unknown = sorted(set(options) - accepted)
        if unknown:
            takes = ", ".join(sorted(accepted - {"batch", "rewards"})) or "no option"
            raise ConfigError(
                f"estimator {name!r} takes no option {', '.join(map(repr, unknown))}; it takes: {takes}. "
                f"(From a run's config: rllm.algorithm.estimator_options.{name}.<option>=value. The run-wide "
                f"options {', '.join(RUN_OPTIONS)} go to every estimator, each taking those it declares.)"
            )
    chosen = {k: v for k, v in run_options.items() if accepted is None or k in accepted}
    return chosen | options


def compute_advantages(
    batch: GroupedRewards | TokenRewards,
    estimator: str | Enum,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
    gamma: float = 1.0,
    lam: float = 1.0,
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
    if episilon is not None:
        warnings.warn("`episilon` is deprecated; use `epsilon`.", DeprecationWarning, stacklevel=2)
        if epsilon not in (1e-6, episilon):  # 1e-6: the default, so not given
            raise ConfigError(f"got epsilon={epsilon!r} and the deprecated episilon={episilon!r}; pass only epsilon.")
        epsilon = episilon
    checked = batch.process_group is not None and getattr(batch, "validated", False)
    run_options = dict(
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=epsilon,
        std_correction=std_correction,
        gamma=gamma,
        lam=lam,
    )
    try:
        entry = _entry(estimator)
        name = _key(estimator)
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


def _check_batch_kind(batch: object, entry: _Entry, name: str) -> None:
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

"""The advantage-estimator registry: rLLM's ``register_rllm_adv_estimator``, the names and
forms of what is registered (:func:`registered_estimator_names`, :func:`is_token_level`,
:func:`estimator_options`). :mod:`~rllm_torch.rllm.dispatch` calls them.

An estimator is registered in one of three forms:

* ``form="arrays"`` (rLLM's): ``fn(rewards: list[np.ndarray], **options) ->
  (advantages_by_group, returns_by_group)``, per-group arrays in and out. Existing rLLM custom
  estimators register and run unchanged.
* ``form="tensors"`` (the fast path): ``fn(batch: GroupedRewards, **options) ->
  (advantages [N], returns [N])``, like the built-ins in :mod:`rllm_torch.core.estimators`.
* ``form="tokens"`` (token level): ``fn(batch: TokenRewards, **options) -> (advantages [B, T],
  returns [B, T])``, like ``reinforce_plus_plus`` and ``gae``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from rllm_torch.core.errors import (
    ConfigError,
    EstimatorRegistrationError,
    UnknownEstimatorError,
)
from rllm_torch.rllm.config import BATCH_INPUTS, RLLM_COMPAT_ESTIMATOR_OPTIONS, RUN_OPTIONS

__all__ = [
    "register_rllm_adv_estimator",
    "register_adv_estimator",
    "CALL_DATA",
    "ESTIMATOR_INPUTS",
    "registered_estimator_names",
    "is_token_level",
    "estimator_options",
    "RUN_OPTIONS",
    "Registration",
    "registration",
    "registered_name",
    "register_builtin",
    "builtin_estimator_options",
    "BATCH_INPUTS",
]

EstimatorForm = Literal["arrays", "tensors", "tokens"]
_FORMS = ("arrays", "tensors", "tokens")
_FORM_HELP = "'arrays' (rLLM per-group arrays), 'tensors' (GroupedRewards) or 'tokens' (TokenRewards)"


@dataclass(frozen=True)
class Registration:
    """One registered estimator: its function, form, the built-in's tensor implementation and the
    options it accepts."""

    fn: Callable
    form: EstimatorForm
    tensor_fn: Callable | None  # tensor implementation behind a built-in's arrays-form function
    options: frozenset[str] | None  # keyword options the function accepts; None = **kwargs
    takes_config: bool = False  # it names ``algorithm_config`` (rLLM's signature since 2026-05) or takes **kwargs
    takes_traj_groups: bool = False  # it names ``traj_groups`` (rLLM passes them since 2026-05) or takes **kwargs
    needs_traj_groups: bool = False  # ``traj_groups`` is a parameter without a default
    needs: frozenset[str] = frozenset()  # what it reads from the batch besides rewards (ESTIMATOR_INPUTS)
    per_turn: str | None = None  # why a turn mode cannot run it (None: it can)
    group_baseline: bool = False  # its baseline is a statistic of the group (a group of one has none)


#: What an estimator may need from the batch besides its rewards, declared at registration
#: (``needs=``): the trainer asks the backend for the union of its roles' needs.
ESTIMATOR_INPUTS: dict[str, str] = {
    "old_log_probs": "the policy's log-probs before the update (TokenRewards.old_log_probs)",
    "sum_pi_squared": "sum_v pi_old(v)^2 at each response token (TokenRewards.sum_pi_squared)",
    "values": "a critic's value of each response token (TokenRewards.values; backend.critic.enable=true)",
    "baselines": "each group's greedy-rollout reward (the trainer samples one rollout a prompt at temperature 0)",
    "reward_components": "several reward functions' rewards per trajectory (Trajectory.reward_components)",
}
#: The inputs of :data:`ESTIMATOR_INPUTS` that are per response token (a token-level estimator's).
TOKEN_INPUTS = frozenset({"old_log_probs", "sum_pi_squared", "values"})


_REGISTRY: dict[str, Registration] = {}
_BUILTINS: list[str] = []  # in registration order


def registered_name(name: object) -> str:
    """The registry key of ``name`` (an ``rLLMAdvantageEstimator`` gives its value).

    Raises:
        UnknownEstimatorError: not a non-empty str or enum member.
    """
    if isinstance(name, Enum):
        name = name.value
    if not isinstance(name, str) or not name:
        raise UnknownEstimatorError(
            f"an estimator name must be a non-empty str or rLLMAdvantageEstimator, got {name!r}."
        )
    return name


#: What a call passes besides options: the rewards (``rewards`` / ``batch``), rLLM's config and its groups.
CALL_DATA = frozenset({"rewards", "batch", "algorithm_config", "traj_groups"})


def _signature_facts(fn: Callable) -> dict[str, object]:
    """What ``fn``'s signature takes: its keyword options (None: ``**kwargs``), whether it takes
    rLLM's ``algorithm_config`` and ``traj_groups``, and whether ``traj_groups`` has no default."""
    params = inspect.signature(fn).parameters
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {
        name
        for name, p in params.items()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    groups = params.get("traj_groups")
    return {
        "options": None if var_keyword else frozenset(named - CALL_DATA),
        "takes_config": var_keyword or "algorithm_config" in named,
        "takes_traj_groups": var_keyword or "traj_groups" in named,
        "needs_traj_groups": groups is not None and groups.default is inspect.Parameter.empty,
    }


def _needs(name: object, needs: object) -> frozenset[str]:
    if isinstance(needs, str) or not all(isinstance(n, str) for n in needs):
        raise EstimatorRegistrationError(
            f"estimator {name!r}: needs must be a tuple of names, e.g. ('old_log_probs',); got {needs!r}."
        )
    if unknown := sorted(set(needs) - set(ESTIMATOR_INPUTS)):
        raise EstimatorRegistrationError(
            f"estimator {name!r}: needs {unknown} are not inputs an estimator can ask for: {', '.join(ESTIMATOR_INPUTS)}."
        )
    return frozenset(needs)


def _add(
    name: object,
    fn: Callable,
    form: EstimatorForm,
    tensor_fn: Callable | None,
    *,
    needs: Iterable[str] = (),
    per_turn: str | None = None,
    group_baseline: bool = False,
) -> None:
    if form not in _FORMS:
        raise ConfigError(f"form must be {_FORM_HELP}, got {form!r}.")
    if not callable(fn):
        raise EstimatorRegistrationError(f"estimator {name!r} must be callable, got {type(fn).__name__}.")
    key = registered_name(name)
    if key in _REGISTRY and _REGISTRY[key].fn is not fn:
        warnings.warn(
            f"advantage estimator {key!r} is registered again: {getattr(fn, '__qualname__', fn)} replaces {getattr(_REGISTRY[key].fn, '__qualname__', _REGISTRY[key].fn)}.",
            UserWarning,
            stacklevel=3,
        )
    if per_turn is None and (form == "tokens" or (tensor_fn is None and form == "tokens")):
        per_turn = "it is token-level: it has its own per-token returns"
    needs = _needs(key, needs)
    if form != "tokens" and (per_token := sorted(needs & TOKEN_INPUTS)):
        raise EstimatorRegistrationError(
            f"estimator {key!r} needs {per_token}, which are per response token: only a token-level estimator "
            "(form='tokens', a function of a TokenRewards) gets them; register it with form='tokens'."
        )
    _REGISTRY[key] = Registration(
        fn,
        form,
        tensor_fn,
        **_signature_facts(tensor_fn or fn),
        needs=needs,
        per_turn=per_turn,
        group_baseline=group_baseline,
    )


def register_rllm_adv_estimator(
    name: str | Enum, *, form: EstimatorForm = "arrays", needs: Iterable[str] = ()
) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name`` (rLLM's API).

    rLLM's canonical signature (since 2026-05) is ``fn(rewards: list[np.ndarray],
    algorithm_config: AlgorithmConfig, **kwargs) -> (advantages_by_group, returns_by_group)``:
    the function gets the run's :class:`~rllm_torch.rllm.config.AlgorithmConfig` and, when it
    takes ``traj_groups`` (or ``**kwargs``), the role's ``TrajectoryGroup`` list aligned with
    ``rewards`` (each group holding exactly the trajectories whose rewards it gets). The seed's
    ``fn(rewards, norm_adv_by_std_in_grpo=True, **kwargs)`` works too: a function gets each
    run-wide option it names (and all of them through ``**kwargs``).

    Args:
        name: a str or an ``rLLMAdvantageEstimator`` member (stored by its value).
        form: ``"arrays"`` for rLLM's per-group numpy form, ``"tensors"`` for a function of a
            :class:`~rllm_torch.GroupedRewards` returning ``[N]`` tensors (the fast path),
            ``"tokens"`` for a function of a :class:`~rllm_torch.core.tokens.TokenRewards`
            returning ``[B, T]`` tensors (token level: the trainer gives it token rewards).
        needs: what it reads from the batch besides its rewards (:data:`ESTIMATOR_INPUTS`), e.g.
            ``("old_log_probs",)`` for a token-level one that reads ``batch.old_log_probs``: the
            trainer has the backend compute them before the advantages.

    Registering a name again replaces the earlier function, with a ``UserWarning``.

    Examples:
        >>> from rllm_torch import GroupedRewards, compute_advantages
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
    registered_name(name)
    if form not in _FORMS:
        raise ConfigError(f"form must be {_FORM_HELP}, got {form!r}.")

    needs = _needs(name, needs)

    def decorator(fn: Callable) -> Callable:
        _add(name, fn, form, None, needs=needs)
        return fn

    return decorator


def register_adv_estimator(
    name: str | Enum, *, form: EstimatorForm = "arrays", needs: Iterable[str] = ()
) -> Callable[[Callable], Callable]:
    """rLLM's newer name of :func:`register_rllm_adv_estimator` (its ``terminal-rl`` branch); the same registry."""
    return register_rllm_adv_estimator(name, form=form, needs=needs)


def register_builtin(
    name: str | Enum,
    arrays_fn: Callable | None,
    tensor_fn: Callable,
    form: EstimatorForm = "tensors",
    **facts: Any,
) -> None:
    """Register a built-in: its rLLM arrays-form function (if it has one), run through its tensor
    implementation; ``form`` is the tensor implementation's (``"tensors"`` or ``"tokens"``);
    ``facts``: ``needs``, ``per_turn`` and ``group_baseline`` (:class:`Registration`)."""
    if arrays_fn is None:
        _add(name, tensor_fn, form, None, **facts)
    else:
        _add(name, arrays_fn, "arrays", tensor_fn, **facts)
    _BUILTINS.append(registered_name(name))


def builtin_estimator_options() -> dict[str, dict[str, object]]:
    """``{built-in name: {option: default}}`` of the built-ins that take options beyond the
    run-wide ones and the batch's inputs (:data:`BATCH_INPUTS`), read from their signatures:
    what the typed run config lists under ``rllm.algorithm.estimator_options``, so each can be
    set without Hydra's ``+``. An option ``compat="rllm"`` sets (:data:`RLLM_COMPAT_ESTIMATOR_OPTIONS`)
    is listed as None, "not set": the run's ``compat`` then decides it, and a value the run gives wins."""
    out = {}
    for name in _BUILTINS:
        entry = _REGISTRY[name]
        parameters = inspect.signature(entry.tensor_fn or entry.fn).parameters.values()
        by_compat = RLLM_COMPAT_ESTIMATOR_OPTIONS.get(name, {})
        own = {
            p.name: None if p.name in by_compat else p.default
            for p in parameters
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in (*RUN_OPTIONS, *BATCH_INPUTS)
        }
        if own:
            out[name] = own
    return out


def registered_estimator_names() -> list[str]:
    """The registered estimator names, sorted."""
    return sorted(_REGISTRY)


def registration(name: object) -> Registration:
    """What is registered under ``name``.

    Raises:
        UnknownEstimatorError: ``name`` is not registered; the message lists the registered names.
    """
    key = registered_name(name)
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
    return registration(name).form == "tokens"


def estimator_options(name: str | Enum) -> frozenset[str] | None:
    """The keyword options the estimator registered as ``name`` takes (``None``: any, it takes
    ``**kwargs``).

    Raises:
        UnknownEstimatorError: ``name`` is not registered.
    """
    return registration(name).options

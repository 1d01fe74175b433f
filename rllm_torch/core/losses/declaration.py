"""A built-in policy loss as it is declared, once, where it is written (:class:`BuiltinLoss`): its
``rllm.algorithm.loss_fn`` name, the run setting each of its options is read from, the options its
name fixes, the aggregation it pins and what it requires of the run's settings.

Every loss, built in or registered, is a function of a
:class:`~rllm_torch.core.losses.context.LossContext` (the micro-batch's tensors and its
:class:`~rllm_torch.core.losses.aggregation.Aggregation`): a registered one reads its parameters
from ``ctx.params``, a built-in one takes its options as keyword arguments,
``fn(ctx, **options) -> (loss, stats)``. A declaration is what the update calls
(:meth:`BuiltinLoss.compute`, from a context) and what a user calls on tensors
(``ppo_clip_loss(log_probs, old_log_probs, advantages, response_mask, agg=..., clip_ratio_c=3.0)``).

Example (a loss of this package, in its module)::

    @builtin_loss("sapo", backend_settings("tau_pos", "tau_neg") | LEVEL)
    def sapo_loss(ctx: LossContext, *, tau_pos: float = 1.0, ...) -> LossOutput: ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.errors import LossDeclarationError
from rllm_torch.core.losses.aggregation import Aggregation
from rllm_torch.core.losses.context import LossContext, LossOutput

__all__ = ["BuiltinLoss", "builtin_loss", "backend_settings", "CLIP", "LEVEL"]


def backend_settings(*options: str) -> dict[str, str]:
    """``{option: "backend.<option>"}``: options read from the ``backend`` setting of their name."""
    return {option: f"backend.{option}" for option in options}


#: PPO's clip range, read by every loss that clips or bounds the ratio.
CLIP = backend_settings("clip_ratio_low", "clip_ratio_high")
#: The ratio per token or per sequence (GSPO's), a setting of the algorithm.
LEVEL = {"importance_sampling_level": "rllm.algorithm.importance_sampling_level"}


class BuiltinLoss:
    """A built-in policy loss: its function and what it declares.

    Args:
        name: its ``rllm.algorithm.loss_fn`` name.
        fn: ``fn(ctx: LossContext, *, **options) -> (loss, stats)``.
        settings: each option it takes, mapped to the run setting it is read from
            (``"backend.clip_ratio_low"``), or to None for an argument a direct call may give but
            a run never sets (``clip_cov``'s ``random_keys``).
        fixed: options of ``fn`` its name sets whatever is given (``gspo``: the sequence ratio);
            an option in both is taken and overridden.
        agg_mode: the aggregation it pins (its math needs it); None: the run's (the token mean
            when called on tensors without one).
        requirement: why a run's settings do not suit it (its options, ``loss_agg_mode`` and
            ``tis_mode`` in, missing options at their defaults), or None when they do.
        when_none: an option's value when it is given as None (``vanilla``'s dual clip at 3.0).
        old_policy: False for a loss of the log-likelihood alone, called on tensors without
            ``old_log_probs``.
        doc: its documentation, for a name declared on another loss's function (``gspo`` on
            PPO's); None: the function's.
        module: the module that declares it, for such a name (None: the function's).

    Raises:
        LossDeclarationError: an option of ``fn`` with no declared setting and not fixed, or a
            declared option ``fn`` does not take (when its module is imported).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., LossOutput],
        settings: Mapping[str, str | None],
        *,
        fixed: Mapping[str, Any] | None = None,
        agg_mode: str | None = None,
        requirement: Callable[[Mapping[str, Any]], str | None] | None = None,
        when_none: Mapping[str, Any] | None = None,
        old_policy: bool = True,
        doc: str | None = None,
        module: str | None = None,
    ) -> None:
        self.name, self.fn, self.settings, self.agg_mode = name, fn, dict(settings), agg_mode
        self.fixed, self.when_none, self.requirement = dict(fixed or {}), dict(when_none or {}), requirement
        self.old_policy = old_policy
        functools.update_wrapper(self, fn)
        self.__doc__, self.__module__ = doc or fn.__doc__, module or fn.__module__
        parameters = inspect.signature(fn).parameters.values()
        takes = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
        self._defaults = {p.name: p.default for p in parameters if p.name in takes}
        where = f"{fn.__module__}.{fn.__qualname__}"
        if missing := sorted(takes - set(self.settings) - set(self.fixed)):
            raise LossDeclarationError(
                f"loss {name!r}: option {missing[0]!r} of {where} has no setting. Map it to the run setting it is "
                f"read from in the loss's declaration (settings={{..., {missing[0]!r}: 'backend.{missing[0]}'}} in "
                f"{fn.__module__}) and declare that setting in rllm_torch/trainer/backend_schema.py "
                f"(BackendConfig), or fix its value there (fixed={{{missing[0]!r}: ...}})."
            )
        if unknown := sorted({*self.settings, *self.fixed, *self.when_none} - takes):
            raise LossDeclarationError(f"loss {name!r} declares options {unknown} that {where} does not take.")

    def __repr__(self) -> str:
        return f"BuiltinLoss({self.name!r})"

    @property
    def options(self) -> frozenset[str]:
        """The options it takes (the keys of :attr:`settings`)."""
        return frozenset(self.settings)

    @property
    def needs(self) -> frozenset[str]:
        """What it needs from the batch beyond the always-present tensors: nothing."""
        return frozenset()

    def why_not(self, options: Mapping[str, Any]) -> str | None:
        """Why it cannot run with ``options``, or None when it can (:attr:`requirement`)."""
        return None if self.requirement is None else self.requirement({**self._defaults, **options})

    def __call__(self, *tensors: Tensor, agg: Aggregation | None = None, **options: Any) -> LossOutput:
        """The loss on ``[N, T]`` tensors ``(log_probs, old_log_probs, advantages, response_mask)``
        (:mod:`~rllm_torch.core.losses.policy`'s notation; without ``old_log_probs`` for
        ``old_policy=False``), aggregated by ``agg`` (None: its pinned mode, else the token mean,
        over this batch's mask).

        Raises:
            TypeError: another number of tensors, or an option it does not take.
            ValueError: options it cannot run with (:attr:`requirement`), or the function's own.
        """
        if len(tensors) != 3 + self.old_policy:
            raise TypeError(f"loss {self.name!r} takes {3 + self.old_policy} tensors, got {len(tensors)}.")
        log_probs, *old, advantages, mask = tensors
        ctx = LossContext(
            logp_curr=log_probs,
            logp_old=old[0] if old else log_probs.detach(),
            advantages=advantages,
            action_mask=mask,
            obs_mask=torch.zeros_like(mask),
            aggregate=Aggregation(self.agg_mode or "token-mean") if agg is None else agg,
            params=options,
        )
        return self.compute(ctx)

    def compute(self, ctx: LossContext) -> LossOutput:
        """The loss on a context, as the update calls every loss: ``ctx.params`` are its options,
        ``ctx.aggregate`` its aggregation, ``ctx.action_mask`` the tokens it trains.

        Raises:
            TypeError: an option it does not take.
            ValueError: options it cannot run with (:attr:`requirement`), or the function's own.
        """
        if unknown := sorted(set(ctx.params) - self.options):
            raise TypeError(f"loss {self.name!r} takes no option {unknown}; its options: {sorted(self.options)}.")
        if why := self.why_not({**ctx.params, "loss_agg_mode": ctx.aggregate.mode}):
            raise ValueError(f"loss {self.name!r}: {why}.")
        options = {**ctx.params, **self.fixed}
        options |= {k: v for k, v in self.when_none.items() if options.get(k) is None}
        return self.fn(ctx, **options)

    def params(self, setting: Callable[[str], Any], loss_params: Mapping[str, Any]) -> dict[str, Any]:
        """Its options read from the run's settings (``setting("backend.clip_ratio_low")``); a
        built-in loss takes no ``loss_params`` (a registered loss's own)."""
        del loss_params
        return {option: setting(key) for option, key in self.settings.items() if key is not None}


def builtin_loss(name: str, settings: Mapping[str, str | None], **declared: Any) -> Callable[..., BuiltinLoss]:
    """Decorator declaring the function below it as the built-in loss ``name``
    (:class:`BuiltinLoss`'s arguments); the name it decorates becomes the declaration, called
    like the function on tensors."""
    return lambda fn: BuiltinLoss(name, fn, settings, **declared)

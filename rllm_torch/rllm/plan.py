"""What each role of a run trains with, resolved once (:class:`AdvantagePlan`): its estimator
(the registration, with what it declares it needs) and its policy loss, from the one merged
:class:`~rllm_torch.rllm.config.AlgorithmConfig` (``estimator``, ``estimator_map`` and its
``(estimator, loss)`` pairs, ``loss_fn``, ``loss_fn_map``; the trainer's
``traj_group_adv_estimator_map`` merged in by :meth:`AlgorithmConfig.from_config`). The per-role
rule (:mod:`~rllm_torch.rllm.role_plan`), the trainer and the backend read it instead of
resolving names again; the union of what the run's estimators and losses need
(:attr:`AdvantagePlan.needs`) is what the trainer asks the backend for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torch import Tensor

from rllm_torch.core.errors import ConfigError, UnknownEstimatorError
from rllm_torch.core.losses import BuiltinLoss, LossContext, RegisteredLoss, resolve_loss
from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.dispatch import bind_estimator
from rllm_torch.rllm.registry import registered_name, registration
from rllm_torch.rllm.stepwise import check_stepwise_estimator

__all__ = ["RolePlan", "RoleLoss", "AdvantagePlan"]


@dataclass(frozen=True)
class RoleLoss:
    """A role's policy loss, resolved once: what the update calls, one way for a built-in loss
    and a registered one.

    Attributes:
        name: its name (``loss_fn_map[role]``, else ``loss_fn``, else ``ppo``).
        loss: a built-in's declaration (:data:`~rllm_torch.core.losses.POLICY_LOSSES`) or a loss
            registered with ``register_loss``.
    """

    name: str
    loss: BuiltinLoss | RegisteredLoss

    @classmethod
    def of(cls, name: str) -> RoleLoss:
        """The loss ``name``, resolved (:func:`~rllm_torch.core.losses.resolve_loss`).

        Raises:
            ConfigError: no loss has that name.
        """
        return cls(name, resolve_loss(name))

    @property
    def agg_mode(self) -> str | None:
        """The aggregation it pins (``gspo``'s, a registration's); None: the run's."""
        return self.loss.agg_mode

    @property
    def needs(self) -> frozenset[str]:
        """What it needs from the batch (:data:`~rllm_torch.core.losses.LOSS_INPUTS`)."""
        return self.loss.needs

    def params(self, setting: Callable[[str], Any], loss_params: Mapping[str, Any]) -> dict[str, Any]:
        """Its ``LossContext.params``, read once per run: a built-in's options from their settings
        (``setting(key)``), a registered loss's rLLM parameters and ``loss_params``."""
        return self.loss.params(setting, loss_params)

    def __call__(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        """``(loss, metrics)`` on one micro-batch's context (its params from :meth:`params`)."""
        return self.loss.compute(ctx)


@dataclass(frozen=True)
class RolePlan:
    """What one group role trains with, resolved once: what the advantage and update stages call.

    Attributes:
        role: the group role.
        estimator: its estimator with the run's options bound (``estimator_map[role]``, else
            ``estimator``): called on the role's packed rewards.
        loss: its policy loss.
        source: where the estimator was named, for messages (``"role 'judge': estimator_map['judge']"``).
    """

    role: str
    estimator: BoundEstimator
    loss: RoleLoss
    source: str

    @property
    def needs(self) -> frozenset[str]:
        """What its estimator and its loss need from the batch besides the rewards."""
        return self.estimator.needs | self.loss.needs

    @property
    def token_level(self) -> bool:
        """Whether its estimator gives one advantage per token (``form="tokens"``)."""
        return self.estimator.token_level


class AdvantagePlan:
    """Each role's :class:`RolePlan`: every estimator and loss the config names is resolved and
    bound here, once; asking for a role's plan afterwards looks nothing up in a registry
    (an estimator or loss registered again later is not seen by this plan).

    Args:
        algorithm_config: the run's algorithm config (its maps already merged).

    Raises:
        UnknownEstimatorError: an estimator the config names is not registered (the message says
            where it was named).
        ConfigError: an estimator the stepwise mode cannot run, or an option it does not take.
        InvalidRewardsError / InvalidRewardTypeError: a run-wide option out of range.
    """

    def __init__(self, algorithm_config: AlgorithmConfig) -> None:
        self.algorithm_config = config = algorithm_config
        self._roles: dict[str, RolePlan] = {}
        self._default = self._bound(config.estimator, "estimator (rllm.algorithm.adv_estimator)")
        self._mapped = {
            role: self._bound(name, f"role {role!r}: estimator_map[{role!r}]")
            for role, name in config.estimator_map.items()
        }
        self._losses = {loss: RoleLoss.of(loss) for loss in config.losses_in_use().values()}
        #: every estimator the run names, by its registered name
        self.estimators: dict[str, BoundEstimator] = {b.name: b for b in (self._default, *self._mapped.values())}

    @classmethod
    def of(cls, plan: AdvantagePlan | AlgorithmConfig) -> AdvantagePlan:
        """``plan`` itself, or the plan of an :class:`AlgorithmConfig` (a caller of the public
        functions may give either)."""
        return plan if isinstance(plan, AdvantagePlan) else cls(plan)

    def _bound(self, name: object, source: str) -> BoundEstimator:
        try:
            key = registered_name(name)
            registration(key)
        except UnknownEstimatorError as exc:
            raise UnknownEstimatorError(f"{source} = {_label(name)!r} is not registered. {exc}") from exc
        check_stepwise_estimator(key, self.algorithm_config.stepwise_advantage_mode)
        return bind_estimator(key, self.algorithm_config)

    def role(self, role: str) -> RolePlan:
        """The plan of ``role`` (from what was bound at construction)."""
        plan = self._roles.get(role)
        if plan is None:
            mapped = role in self._mapped
            source = f"role {role!r}: " + (f"estimator_map[{role!r}]" if mapped else "estimator")
            loss = self._losses[self.algorithm_config.loss_fn_for(role)]
            plan = self._roles[role] = RolePlan(role, self._mapped.get(role, self._default), loss, source)
        return plan

    def check_outcome_level(self) -> None:
        """Refuse a token-level estimator (the trajectory-level collector gives one advantage per
        trajectory).

        Raises:
            ConfigError: naming the role (or the default estimator) and the estimator.
        """
        for role, bound in [("*", self._default), *self._mapped.items()]:
            if bound.token_level:
                where = "estimator" if role == "*" else f"role {role!r}: estimator_map[{role!r}]"
                raise ConfigError(
                    f"{where}: estimator {bound.name!r} is token-level (one advantage per response token, from token "
                    "rewards and values): the trajectory-level collector cannot run it. Use a backend's "
                    "compute_advantages on its token batch (rllm_torch.trainer.compute_token_advantages; the torch "
                    "backend does), or an outcome estimator (grpo, rloo, opo, ...)."
                )

    @property
    def loss(self) -> RoleLoss:
        """The run's policy loss (``loss_fn``, else ``ppo``): a role's unless ``loss_fn_map`` names another."""
        return self._losses[self.algorithm_config.loss_fn or "ppo"]

    @property
    def losses(self) -> set[str]:
        """Every policy loss the run trains with."""
        return set(self._losses)

    @property
    def needs(self) -> frozenset[str]:
        """What the run's estimators (:data:`~rllm_torch.rllm.registry.ESTIMATOR_INPUTS`) and losses
        (:data:`~rllm_torch.core.losses.LOSS_INPUTS`) need from the batch: the union."""
        bound = self.estimators.values()
        return frozenset().union(*(b.needs for b in bound), *(loss.needs for loss in self._losses.values()))

    def estimators_needing(self, need: str) -> list[str]:
        """The run's estimators that declare ``need``, sorted."""
        return sorted(name for name, bound in self.estimators.items() if need in bound.needs)


def _label(name: object) -> str:
    return name.value if isinstance(name, Enum) else str(name)

"""What each role of a run trains with, resolved once (:class:`AdvantagePlan`): its estimator
(the registration, with what it declares it needs) and its policy loss, from the one merged
:class:`~rllm_torch.rllm.config.AlgorithmConfig` (``estimator``, ``estimator_map`` and its
``(estimator, loss)`` pairs, ``loss_fn``, ``loss_fn_map``; the trainer's
``traj_group_adv_estimator_map`` merged in by :meth:`AlgorithmConfig.from_config`). The per-role
rule (:mod:`~rllm_torch.rllm.role_plan`), the trainer and the backend read it instead of
resolving names again; the union of what the run's estimators and losses need
(:attr:`AdvantagePlan.needs`) is what the trainer asks the backend for."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rllm_torch.core.errors import ConfigError, UnknownEstimatorError
from rllm_torch.core.losses import registered_loss
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.registry import Registration, registered_name, registration
from rllm_torch.rllm.stepwise import check_stepwise_estimator

__all__ = ["RolePlan", "AdvantagePlan"]


@dataclass(frozen=True)
class RolePlan:
    """What one group role trains with.

    Attributes:
        role: the group role.
        estimator: the registered name of its estimator (``estimator_map[role]``, else ``estimator``).
        registration: the estimator's registration (form, options, needs, ...).
        loss: its policy loss (``loss_fn_map[role]``, else ``loss_fn``, else ``ppo``).
        source: where the estimator came from, for messages (``"estimator_map['judge']"``).
    """

    role: str
    estimator: str
    registration: Registration
    loss: str
    source: str

    @property
    def token_level(self) -> bool:
        """Whether its estimator gives one advantage per token (``form="tokens"``)."""
        return self.registration.form == "tokens"


class AdvantagePlan:
    """Each role's :class:`RolePlan`, resolved once per role from ``algorithm_config``.

    Args:
        algorithm_config: the run's algorithm config (its maps already merged).

    Raises:
        UnknownEstimatorError: an estimator the config names is not registered (the message says
            where it was named).
        ConfigError: an estimator the stepwise mode cannot run.
    """

    def __init__(self, algorithm_config: AlgorithmConfig) -> None:
        self.algorithm_config = algorithm_config
        self._roles: dict[str, RolePlan] = {}
        self.estimators = {self._checked(algorithm_config.estimator, "estimator (rllm.algorithm.adv_estimator)")}
        for role, name in algorithm_config.estimator_map.items():
            self.estimators.add(self._checked(name, f"role {role!r}: estimator_map[{role!r}]"))

    def _checked(self, name: object, source: str) -> str:
        try:
            key = registered_name(name)
            registration(key)
        except UnknownEstimatorError as exc:
            raise UnknownEstimatorError(f"{source} = {_label(name)!r} is not registered. {exc}") from exc
        check_stepwise_estimator(key, self.algorithm_config.stepwise_advantage_mode)
        return key

    def role(self, role: str) -> RolePlan:
        """The plan of ``role`` (built the first time it is asked for)."""
        plan = self._roles.get(role)
        if plan is None:
            mapped = role in self.algorithm_config.estimator_map
            source = f"estimator_map[{role!r}]" if mapped else "estimator"
            name = registered_name(self.algorithm_config.estimator_for(role))
            plan = self._roles[role] = RolePlan(
                role, name, registration(name), self.algorithm_config.loss_fn_for(role), f"role {role!r}: {source}"
            )
        return plan

    def outcome(self, role: str) -> RolePlan:
        """:meth:`role`, whose estimator must give one advantage per trajectory (the collector's).

        Raises:
            ConfigError: a token-level estimator.
        """
        plan = self.role(role)
        if plan.token_level:
            raise ConfigError(
                f"role {role!r}: estimator {plan.estimator!r} is token-level (one advantage per response token, from token "
                "rewards and values): the trajectory-level collector cannot run it. Use a backend's compute_advantages on "
                "its token batch (rllm_torch.trainer.compute_token_advantages; the torch backend does), or an outcome "
                "estimator (grpo, rloo, opo, ...)."
            )
        return plan

    @property
    def losses(self) -> set[str]:
        """Every policy loss the run trains with."""
        return set(self.algorithm_config.losses_in_use().values())

    @property
    def needs(self) -> frozenset[str]:
        """What the run's estimators (:data:`~rllm_torch.rllm.registry.ESTIMATOR_INPUTS`) and losses
        (:data:`~rllm_torch.core.losses.LOSS_INPUTS`) need from the batch: the union."""
        found = set().union(*(registration(name).needs for name in self.estimators))
        for loss in self.losses:
            if (custom := registered_loss(loss)) is not None:
                found |= custom.needs
        return frozenset(found)

    def estimators_needing(self, need: str) -> list[str]:
        """The run's estimators that declare ``need``, sorted."""
        return sorted(name for name in self.estimators if need in registration(name).needs)


def _label(name: object) -> str:
    return name.value if isinstance(name, Enum) else str(name)

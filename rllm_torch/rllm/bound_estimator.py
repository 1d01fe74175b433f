"""A registered estimator with its options bound (:class:`BoundEstimator`): what a run's plan
holds for each role and calls on every batch, with no registry lookup and no option merging
left to do (:func:`~rllm_torch.rllm.dispatch.bind_estimator` builds one; it is TorchRL's
estimator-as-object, ``ValueEstimatorBase``, for rLLM's registry). Calling it runs the function
in its form and checks what comes back: one advantage and one return per trajectory (per token
for a token-level estimator), floating point, detached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.distributed import gather_objects
from rllm_torch.core.errors import ConfigError, EstimatorOutputError, InvalidRewardTypeError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import accumulation_dtype
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.registry import Registration

__all__ = ["BoundEstimator"]


@dataclass(frozen=True)
class BoundEstimator:
    """One registered estimator and the keywords it is called with.

    Attributes:
        name: its registered name (in messages and metrics).
        registration: what was registered (function, form, needs, ...), resolved once.
        options: its checked call keywords: the run-wide options it declares, its own options,
            and rLLM's ``algorithm_config`` for a function with rLLM's signature.
    """

    name: str
    registration: Registration
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def needs(self) -> frozenset[str]:
        """What it reads from the batch besides the rewards (``ESTIMATOR_INPUTS``)."""
        return self.registration.needs

    @property
    def token_level(self) -> bool:
        """Whether it gives one advantage per token (``form="tokens"``: a :class:`TokenRewards` in)."""
        return self.registration.form == "tokens"

    @property
    def takes_traj_groups(self) -> bool:
        """Whether it reads rLLM's ``traj_groups``."""
        return self.registration.takes_traj_groups

    def __call__(
        self, batch: GroupedRewards | TokenRewards, *, traj_groups: list | None = None, **inputs: object
    ) -> tuple[Tensor, Tensor]:
        """``(advantages, returns)`` of ``batch`` (``[N]`` in its flat order; ``[B, T]`` for a
        token-level estimator), on its device, detached.

        A tensor-form estimator (the built-ins, ``form="tensors"`` / ``"tokens"``) runs on the
        tensors; an ``"arrays"`` one gets per-group numpy arrays (float64 for float64 rewards,
        else float32) of the whole batch (across ranks every rank gathers every reward and
        ``traj_groups`` once, then keeps its own trajectories' values; every rank must call).

        Args:
            batch: one role's packed rewards (a ``TokenRewards`` for a token-level estimator).
            traj_groups: rLLM's groups, one per group of ``batch`` with exactly its trajectories,
                for an estimator that reads them; None: none.
            **inputs: the batch's tensors the estimator needs besides its rewards (``baselines``).

        Raises:
            InvalidRewardTypeError: a ``GroupedRewards`` for a token-level estimator or the reverse.
            ConfigError: ``traj_groups`` missing for an estimator that needs them, or not one per group.
            EstimatorOutputError: the function returned something else than a pair with one
                value per trajectory (per token).
        """
        entry, name = self.registration, self.name
        _check_batch_kind(batch, entry, name)
        call = dict(self.options) | inputs
        if traj_groups is not None and entry.takes_traj_groups:
            call["traj_groups"] = traj_groups
        elif entry.needs_traj_groups:
            raise ConfigError(
                f"estimator {name!r} takes traj_groups (rLLM passes each role's TrajectoryGroups), which this call does "
                "not have: run it through collect_reward_and_advantage_from_trajectory_groups or the trainer, or pass "
                "traj_groups= to compute_advantages."
            )
        if entry.tensor_fn is not None or entry.form in ("tensors", "tokens"):
            return _check_tensor_pair((entry.tensor_fn or entry.fn)(batch, **call), batch, name)
        whole, mine = batch.all_ranks()  # the whole batch on every rank: the function sees every group
        if "traj_groups" in call and batch.process_group is not None:
            parts = gather_objects(list(call["traj_groups"]), batch.process_group)
            call["traj_groups"] = [g for part in parts for g in part]
        dtype = accumulation_dtype(whole.rewards.dtype)
        groups = [g.cpu().numpy() for g in whole.split(whole.rewards.detach().to(dtype))]
        if "traj_groups" in call and len(call["traj_groups"]) != len(groups):
            raise ConfigError(
                f"estimator {name!r}: traj_groups holds {len(call['traj_groups'])} groups for a batch of {len(groups)}; "
                "give one TrajectoryGroup per group of the batch, in its order."
            )
        advantages, returns = _pack_array_pair(entry.fn(rewards=groups, **call), whole, name, dtype)
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

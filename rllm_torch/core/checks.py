"""Validation of user input shared by the packing constructors (private)."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidGroupIndexError, InvalidRewardsError, InvalidRewardTypeError

__all__ = [
    "REWARD_DTYPES",
    "check_reward_tensor",
    "group_to_array",
    "check_group_index",
    "inspect_group_index",
    "check_reward",
    "all_rewards_are_numbers",
    "check_weights",
    "check_reward_components",
]

_NUMERIC_KINDS = "biuf"  # numpy kinds: bool, signed int, unsigned int, float
REWARD_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


def check_reward_tensor(rewards: object, name: str, ndim: int) -> Tensor:
    """A real-valued (bool/int/float) tensor with ``ndim`` dimensions, else a typed error."""
    if not isinstance(rewards, Tensor):
        raise InvalidRewardTypeError(
            f"{name} must be a torch.Tensor, got {type(rewards).__name__}; use GroupedRewards.from_groups for lists or numpy arrays."
        )
    if rewards.dtype not in REWARD_DTYPES:
        raise InvalidRewardTypeError(
            f"{name} has dtype {rewards.dtype}; rewards must be bool, integer, float16, bfloat16, float32 or float64."
        )
    if rewards.dim() != ndim:
        raise InvalidRewardsError(f"{name} must have {ndim} dimension(s), got shape {tuple(rewards.shape)}.")
    return rewards


def group_to_array(group: object, g: int) -> np.ndarray | Tensor:
    """One group's rewards as a 1-D numeric numpy array (or tensor), naming group and position on error."""
    if isinstance(group, Tensor):
        check_reward_tensor(group, f"group {g}", ndim=1)
        return group
    if group is None or isinstance(group, (str, bytes, numbers.Number)):
        raise InvalidRewardTypeError(
            f"group {g} must be a sequence of rewards (list, numpy array or tensor), got {group!r}."
        )
    try:
        arr = np.asarray(group)
    except (TypeError, ValueError) as exc:
        raise InvalidRewardTypeError(f"group {g} could not be read as a 1-D array of rewards: {exc}") from exc
    if arr.ndim != 1:
        raise InvalidRewardsError(f"group {g} must be 1-D (one reward per trajectory), got shape {arr.shape}.")
    if arr.dtype.kind not in _NUMERIC_KINDS:
        for pos, value in enumerate(group):  # the caller's values: numpy may have made them str
            if value is None:
                raise InvalidRewardsError(
                    f"reward of group {g}, position {pos} is None; every trajectory needs a numeric reward (set it, or drop the trajectory before packing)."
                )
            if not isinstance(value, (numbers.Real, np.bool_)) or isinstance(value, complex):
                raise InvalidRewardTypeError(
                    f"reward of group {g}, position {pos} is {value!r} of type {type(value).__name__}; rewards must be real numbers or bools."
                )
        arr = arr.astype(np.float64)
    return arr


def check_group_index(group_index: object, rewards: Tensor, num_groups: int | None) -> Tensor:
    """Metadata checks of a flat group index (no data read, so no host sync)."""
    if not isinstance(group_index, Tensor):
        raise InvalidGroupIndexError(
            f"group_index must be a torch.Tensor of int64 group ids, got {type(group_index).__name__}; use factorize_group_labels for labels."
        )
    if group_index.dtype.is_floating_point or group_index.is_complex() or group_index.dtype == torch.bool:
        raise InvalidGroupIndexError(f"group_index must have an integer dtype, got {group_index.dtype}.")
    if group_index.dim() != 1:
        raise InvalidGroupIndexError(f"group_index must be 1-D, got shape {tuple(group_index.shape)}.")
    if group_index.shape[0] != rewards.shape[0]:
        raise InvalidGroupIndexError(
            f"group_index has {group_index.shape[0]} entries but rewards has {rewards.shape[0]}; give one group id per reward."
        )
    if group_index.device != rewards.device:
        raise InvalidGroupIndexError(
            f"group_index is on {group_index.device} but rewards is on {rewards.device}; move both to one device."
        )
    if num_groups is not None and (isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0):
        raise InvalidGroupIndexError(f"num_groups must be a non-negative int, got {num_groups!r}.")
    return group_index.long()


def inspect_group_index(group_index: Tensor, num_groups: int | None) -> tuple[int, bool]:
    """Data checks of a group index, with one host sync: ``(num_groups, is_sorted)``.

    ``num_groups`` defaults to ``max + 1``; every id must be in ``[0, num_groups)``.
    ``is_sorted`` (non-decreasing ids) means flat order is group-major.
    """
    if group_index.numel() == 0:
        return num_groups or 0, True
    low, high = torch.aminmax(group_index)
    ascending = (group_index[1:] >= group_index[:-1]).all()
    low, high, ascending = torch.stack([low, high, ascending.long()]).tolist()
    if num_groups is None:
        if high + 1 > group_index.numel():
            raise InvalidGroupIndexError(
                f"group_index goes up to {high} for only {group_index.numel()} rewards, so most groups would be empty; "
                "ids must be dense 0..G-1: renumber them with factorize_group_labels (or GroupedRewards.from_labels), "
                "or pass num_groups explicitly if empty groups are intended."
            )
        num_groups = high + 1
    if low < 0 or high >= num_groups:
        bad_N = (group_index < 0) | (group_index >= num_groups)
        pos = int(bad_N.nonzero()[0, 0])
        raise InvalidGroupIndexError(
            f"group_index[{pos}] = {int(group_index[pos])} is outside [0, {num_groups}); group ids must be dense 0..num_groups-1 (see factorize_group_labels)."
        )
    return num_groups, bool(ascending)


_REWARD_SCALARS = (numbers.Real, np.bool_)  # Python and numpy reals and bools; not arrays, tensors, strings


def check_reward(value: object, where: str) -> float:
    """A trajectory's reward as a float: a real number or a bool (Python or numpy scalar).

    Raises:
        InvalidRewardsError: ``value`` is None.
        InvalidRewardTypeError: anything else that is not a real scalar: a list, an array or a
            tensor (even of one element), a string, a complex number. ``where`` names the
            trajectory (task, group, trajectory name).
    """
    if value is None:
        raise InvalidRewardsError(
            f"{where}: reward is None; every trained trajectory needs a reward (set trajectory.reward, or a last-step reward before the transform)."
        )
    if not isinstance(value, _REWARD_SCALARS):
        raise InvalidRewardTypeError(
            f"{where}: reward {value!r} of type {type(value).__name__} is not a real number; a trajectory has one "
            "scalar reward (a float, int or bool; convert a one-element array or tensor with float(...))."
        )
    return float(value)


def all_rewards_are_numbers(values: list) -> bool:
    """Whether every value would pass :func:`check_reward` (one pass over the distinct types)."""
    return all(issubclass(t, _REWARD_SCALARS) for t in set(map(type, values)))


def check_matches(
    value: Tensor,
    name: str,
    like: Tensor,
    like_name: str,
    *,
    error: type[Exception] = InvalidRewardsError,
    hint: str = "they must match",
) -> None:
    """``value`` has ``like``'s shape and device, else ``error`` naming both tensors.

    Raises:
        error (default InvalidRewardsError): a different shape (with ``hint``) or device.
    """
    if value.shape != like.shape:
        raise error(f"{name} has shape {tuple(value.shape)} but {like_name} has shape {tuple(like.shape)}; {hint}.")
    if value.device != like.device:
        raise error(f"{name} is on {value.device} but {like_name} is on {like.device}; move both to one device.")


def check_weights(weights: object, rewards: Tensor, *, read_values: bool) -> Tensor:
    """Per-trajectory weights shaped like ``rewards`` (e.g. response lengths, for OPO), as float
    values on the rewards' device; with ``read_values`` (one host sync) also finite and >= 0.

    Raises:
        InvalidRewardTypeError: not a tensor, or not of an integer or floating dtype.
        InvalidRewardsError: another shape or device, or (``read_values``) a negative, NaN or
            infinite weight, named by position.
    """
    if not isinstance(weights, Tensor):
        raise InvalidRewardTypeError(
            f"weights must be a torch.Tensor with one weight per trajectory, got {type(weights).__name__}."
        )
    if weights.dtype == torch.bool or weights.is_complex() or weights.dtype not in REWARD_DTYPES:
        raise InvalidRewardTypeError(f"weights must have an integer or floating dtype, got {weights.dtype}.")
    check_matches(weights, "weights", rewards, "rewards", hint="give one weight per trajectory")
    if read_values and weights.numel():
        bad = ~torch.isfinite(weights) | (weights < 0) if weights.is_floating_point() else weights < 0
        if bool(bad.any()):
            pos = tuple(int(i) for i in bad.nonzero()[0])
            where = pos[0] if len(pos) == 1 else pos
            raise InvalidRewardsError(
                f"weights[{where}] = {weights[pos].item()!r}; weights must be finite and >= 0 (e.g. response token counts)."
            )
    return weights


def check_reward_components(components: object, rewards: Tensor) -> Tensor:
    """Several rewards per trajectory, ``[*rewards.shape, R]`` with ``R >= 1`` (one column per
    reward function, for :func:`~rllm_torch.core.estimators.gdpo`), on the rewards' device. Values are
    not read (a NaN stays in its group, as a reward's does).

    Raises:
        InvalidRewardTypeError: not a tensor, or not of a bool, integer or floating dtype.
        InvalidRewardsError: another shape (naming the expected one) or device.
    """
    if not isinstance(components, Tensor):
        raise InvalidRewardTypeError(
            f"reward_components must be a torch.Tensor with one row of rewards per trajectory, got {type(components).__name__}."
        )
    if components.is_complex() or components.dtype not in REWARD_DTYPES:
        raise InvalidRewardTypeError(
            f"reward_components must have a bool, integer or floating dtype, got {components.dtype}."
        )
    expected = (*rewards.shape, "R")
    if components.dim() != rewards.dim() + 1 or components.shape[:-1] != rewards.shape or components.shape[-1] < 1:
        raise InvalidRewardsError(
            f"reward_components has shape {tuple(components.shape)}; expected {expected}: the rewards' shape and one "
            "column per reward function."
        )
    if components.device != rewards.device:
        raise InvalidRewardsError(
            f"reward_components is on {components.device} but rewards is on {rewards.device}; move both to one device."
        )
    return components

"""Token-level rewards and advantages over ``[B, T]`` with a response mask: the trainer's side of
an outcome estimator (:func:`sequence_scores`, :func:`broadcast_to_tokens`), and the input and
input of the token-level estimators (:class:`TokenRewards`; their building blocks, returns and
whitening, are in :mod:`rllm_torch.core.returns`).

The token-level path of an outcome estimator for a batch of ``B`` responses of ``T`` tokens::

    scores_B = sequence_scores(token_level_rewards_BT)             # one pass over [B, T]
    adv_B, _ = grpo(GroupedRewards.from_padded(scores_B.view(G, K)))  # the estimator: O(B)
    adv_BT = broadcast_to_tokens(adv_B, response_mask_BT, out=buffer) # one pass into a buffer

With a preallocated ``out`` the path costs about two passes over ``[B, T]`` and allocates
nothing per step (measured in ``benchmarks/bench_token_level.py``); allocating a fresh ``[B, T]``
output each step costs more than the arithmetic on CPU (page faults on first touch). No host
sync: the path runs on CUDA and inside ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.checks import check_matches
from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks, check_backend_carries, resolve_process_group
from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError, RLLMTorchError
from rllm_torch.core.segment import accumulation_dtype

__all__ = ["sequence_scores", "broadcast_to_tokens", "TokenRewards"]


def _check_out(out: Tensor | None, shape: tuple[int, ...], like: Tensor, name: str) -> None:
    if out is None:
        return
    if not isinstance(out, Tensor) or tuple(out.shape) != shape or not out.is_floating_point():
        raise InvalidRewardsError(
            f"out must be a floating-point tensor of shape {shape} (the {name}), got "
            f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}."
        )
    if out.device != like.device:
        raise InvalidRewardsError(f"out is on {out.device} but the inputs are on {like.device}; allocate it there.")


def sequence_scores(token_level_rewards: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Each response's score, the sum of its token rewards: ``s_b = sum_t r[b, t]``.

    Args:
        token_level_rewards: ``[B, T]`` float rewards, 0 outside the response (as verl's
            ``token_level_rewards``: the outcome reward on the last response token, or a
            per-token reward), any device.
        out: an optional ``[B]`` float tensor to write into.

    Returns:
        ``[B]``, accumulated in float32 (float64 for float64 rewards), or ``out``.

    Raises:
        InvalidRewardTypeError: not a floating-point tensor.
        InvalidRewardsError: not 2-D, or an ``out`` of the wrong shape or device.

    Examples:
        >>> sequence_scores(torch.tensor([[0.0, 1.0], [0.5, 0.0]]))
        tensor([1.0000, 0.5000])
    """
    if not isinstance(token_level_rewards, Tensor) or not token_level_rewards.is_floating_point():
        raise InvalidRewardTypeError(
            f"token_level_rewards must be a floating-point tensor, got {getattr(token_level_rewards, 'dtype', type(token_level_rewards).__name__)}."
        )
    if token_level_rewards.dim() != 2:
        raise InvalidRewardsError(f"token_level_rewards must be [B, T], got shape {tuple(token_level_rewards.shape)}.")
    _check_out(out, token_level_rewards.shape[:1], token_level_rewards, "one score per response")
    acc = torch.float64 if token_level_rewards.dtype == torch.float64 else torch.float32
    return torch.sum(token_level_rewards, dim=-1, dtype=acc, out=out)


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Token-level advantages: each response's advantage on its trained tokens,
    ``A[b, t] = a_b * m[b, t]`` (verl's and rLLM's broadcast of an outcome advantage).

    Args:
        advantages: ``[B]`` float, one per response (an estimator's output).
        response_mask: ``[B, T]`` float (0/1) or bool, 1 on trained tokens, same device.
        out: an optional preallocated ``[B, T]`` float tensor (e.g. reused every step): the
            product is written there in one pass, and nothing is allocated.

    Returns:
        ``[B, T]``: ``out``, or a new float32 tensor (the advantages are cast: a float64 estimator
        output gives float32 tokens, as a policy loss uses them).

    Raises:
        InvalidRewardTypeError: ``advantages`` is not floating point or the mask not float/bool.
        InvalidRewardsError: shapes or devices do not match.

    Examples:
        >>> broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        tensor([[ 2.,  0.],
                [-1., -1.]])
    """
    if not isinstance(advantages, Tensor) or not advantages.is_floating_point() or advantages.dim() != 1:
        raise InvalidRewardTypeError(
            f"advantages must be a 1-D floating-point tensor [B], got {getattr(advantages, 'dtype', type(advantages).__name__)} {tuple(getattr(advantages, 'shape', ()))}."
        )
    if not isinstance(response_mask, Tensor) or not (
        response_mask.is_floating_point() or response_mask.dtype == torch.bool
    ):
        raise InvalidRewardTypeError(
            f"response_mask must be a float (0/1) or bool tensor [B, T], got {getattr(response_mask, 'dtype', type(response_mask).__name__)}."
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != advantages.shape[0]:
        raise InvalidRewardsError(
            f"response_mask has shape {tuple(response_mask.shape)} for {advantages.shape[0]} advantages; it must be [B, T] with B = {advantages.shape[0]}."
        )
    if response_mask.device != advantages.device:
        raise InvalidRewardsError(
            f"response_mask is on {response_mask.device} but the advantages are on {advantages.device}."
        )
    _check_out(out, tuple(response_mask.shape), response_mask, "token-level advantages")
    dtype = out.dtype if out is not None else torch.float32
    mask = response_mask if response_mask.dtype == dtype else response_mask.to(dtype)
    return torch.mul(mask, advantages.to(dtype)[:, None], out=out)


def _check_token_tensor(value: object, name: str, like: Tensor | None, *, mask: bool = False) -> Tensor:
    kinds = "a float (0/1), bool or integer" if mask else "a floating-point"
    ok = isinstance(value, Tensor) and (
        value.is_floating_point() or (mask and (value.dtype == torch.bool or not value.is_complex()))
    )
    if not ok:
        raise InvalidRewardTypeError(
            f"{name} must be {kinds} tensor [B, T], got {getattr(value, 'dtype', type(value).__name__)}."
        )
    if like is None:
        if value.dim() != 2:
            raise InvalidRewardsError(f"{name} must be [B, T] (one row per response), got shape {tuple(value.shape)}.")
        return value
    check_matches(value, name, like, "token_level_rewards")
    return value


class TokenRewards:
    """The input of a token-level estimator: ``B`` responses of up to ``T`` tokens (verl's layout).

    Attributes:
        token_level_rewards: ``[B, T]`` float rewards per token (the outcome reward on each
            response's last trained token, minus a per-token KL penalty when KL is in the
            reward); rewards on untrained tokens are ignored.
        response_mask: ``[B, T]`` float (0/1), bool or integer: nonzero on the tokens the policy
            is trained on. Untrained tokens inside a response (a tool's output in a multi-turn
            row) are skipped: they neither discount nor carry reward or value.
        values: ``[B, T]`` float critic values ``V(s_t)`` (the value before token ``t``), or
            ``None``; needed by ``gae``.
        old_log_probs, sum_pi_squared: ``[B, T]`` float the old policy's log-prob of each token
            and ``Σ_v π_old(v)²`` of its distribution, or ``None``; needed by
            ``optimal_token_baseline``, with ``group_index``: ``[B]`` int64 the prompt group of each
            response (``0 .. num_groups - 1``), and optionally ``importance_weights`` ``[B, T]``
            (rollout correction's).
        process_group: the ``torch.distributed`` group whose ranks hold the rest of the batch,
            or ``None``: batch statistics (whitening) are over every rank's tokens.

    Args:
        token_level_rewards, response_mask, values: as above, on one device.
        old_log_probs, sum_pi_squared, group_index, importance_weights: as above, same device.
        process_group: ``ONE_PROCESS`` (default), ``None`` (WORLD) or a ``ProcessGroup``.
        validate: across ranks, one ``all_gather_object`` checks that every rank passes the same
            reward dtype and device type and raises any rank's input error on every rank;
            ``False`` skips it (mismatches are then undefined behaviour).

    Raises:
        InvalidRewardTypeError: a tensor of the wrong kind. InvalidRewardsError: shapes or devices
        that do not match. DistributedSetupError / DistributedBatchError: see
        :mod:`rllm_torch.core.distributed`.

    Examples:
        >>> batch = TokenRewards(torch.tensor([[0.0, 1.0], [0.5, 0.0]]), torch.tensor([[1, 1], [1, 0]]))
        >>> batch.shape
        (2, 2)
    """

    def __init__(
        self,
        token_level_rewards: Tensor,
        response_mask: Tensor,
        *,
        values: Tensor | None = None,
        old_log_probs: Tensor | None = None,
        sum_pi_squared: Tensor | None = None,
        group_index: Tensor | None = None,
        importance_weights: Tensor | None = None,
        process_group: object = ONE_PROCESS,
        validate: bool = True,
    ) -> None:
        group = resolve_process_group(process_group)
        error = None
        try:
            rewards = _check_token_tensor(token_level_rewards, "token_level_rewards", None)
            _check_token_tensor(response_mask, "response_mask", rewards, mask=True)
            for name, tensor in (
                ("values", values),
                ("old_log_probs", old_log_probs),
                ("sum_pi_squared", sum_pi_squared),
                ("importance_weights", importance_weights),
            ):
                if tensor is not None:
                    _check_token_tensor(tensor, name, rewards)
            if group_index is not None and (
                not isinstance(group_index, Tensor)
                or group_index.dtype.is_floating_point
                or group_index.shape != rewards.shape[:1]
                or group_index.device != rewards.device
            ):
                raise InvalidRewardsError(
                    f"group_index must be a [B] = [{rewards.shape[0]}] integer tensor on {rewards.device}, one group per "
                    f"response; got {group_index!r:.80}."
                )
            if group is not None:
                check_backend_carries(group, rewards.device)
        except RLLMTorchError as exc:
            if group is None or not validate:
                raise
            error = exc
        if group is not None and validate:
            facts = {} if error else {"reward dtype": rewards.dtype, "device type": rewards.device.type}
            agree_across_ranks(group, error, facts, must_match=("reward dtype", "device type"))
        self.token_level_rewards, self.response_mask, self.values = token_level_rewards, response_mask, values
        self.old_log_probs, self.sum_pi_squared, self.importance_weights = (
            old_log_probs,
            sum_pi_squared,
            importance_weights,
        )
        self.group_index = None if group_index is None else group_index.long()
        self.process_group, self.validated = group, validate and group is not None

    def __repr__(self) -> str:
        values = ", values" if self.values is not None else ""
        ranks = "" if self.process_group is None else ", over a process group"
        return f"TokenRewards(B={self.shape[0]}, T={self.shape[1]}{values}, dtype={self.token_level_rewards.dtype}, device={self.device}{ranks})"

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``."""
        return tuple(self.token_level_rewards.shape)

    @property
    def device(self) -> torch.device:
        return self.token_level_rewards.device

    def working(self) -> tuple[Tensor, Tensor]:
        """``(rewards, mask)`` in the accumulation dtype (float64 for float64 rewards, else
        float32), detached; ``mask`` is 1.0 on trained tokens and 0.0 elsewhere, and the rewards
        are 0 on untrained tokens."""
        dtype = accumulation_dtype(self.token_level_rewards.dtype)
        mask = (self.response_mask != 0).to(dtype)
        return self.token_level_rewards.detach().to(dtype) * mask, mask

"""One optimizer step of a trained model (the policy's and the critic's): the accumulated gradient
clipped, refused when it is not finite, one AdamW step, the gradient freed."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from rllm_torch.backends.torch_backend.micro_batches import release_host_memory
from rllm_torch.core.errors import NonFiniteGradientError

__all__ = ["clipped_step"]


def clipped_step(
    parameters: Iterable[Tensor], optimizer: torch.optim.Optimizer, grad_clip: float, *, what: str
) -> Tensor:
    """Clip the accumulated gradient of ``parameters`` to norm ``grad_clip``, take one step of
    ``optimizer`` and free the gradient (it would otherwise stay resident through the next
    sampling phase and checkpoint, the size of the trained weights).

    Args:
        parameters: the trained parameters (a list: they are read twice).
        optimizer: their optimizer.
        grad_clip: the largest gradient norm (``torch.nn.utils.clip_grad_norm_``).
        what: the model, for the error (``"policy"``, ``"critic"``).

    Returns:
        The gradient norm before clipping, a 0-d tensor (a DTensor under FSDP).

    Raises:
        NonFiniteGradientError: the norm is NaN or infinite: the step is not taken (the weights
            stay the last good step's) and the gradient is cleared. One host sync per step, and
            every rank of a process group sees the same norm, so all stop together.
    """
    norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    whole = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # the same on every rank
    if not bool(torch.isfinite(whole)):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteGradientError(
            f"the {what}'s gradient norm is {float(whole)} (rllm.algorithm.loss_fn and its options, "
            "backend.lr, rewards): the optimizer step was not taken, so the weights are the last good step's "
            "and no checkpoint holds a non-finite weight. A loss option at an extreme value, or rewards of "
            "enormous magnitude, make the loss overflow."
        )
    release_host_memory()  # what the backward freed, before AdamW's moments join the gradients
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

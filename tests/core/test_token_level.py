"""The token-level path: sequence scores from token rewards, and an outcome advantage broadcast
to the trained tokens, into a preallocated buffer."""

from __future__ import annotations

import pytest
import torch

from rllm_torch import (
    GroupedRewards,
    InvalidRewardsError,
    InvalidRewardTypeError,
    broadcast_to_tokens,
    grpo,
    sequence_scores,
)


def test_the_token_level_path_equals_a_per_row_reference_and_writes_into_the_buffer():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(16, 5, generator=g) < 0.6).float()
    rewards = torch.randn(16, 5, generator=g) * mask
    scores = sequence_scores(rewards)
    torch.testing.assert_close(scores, torch.tensor([float(row.sum()) for row in rewards]))
    adv, _ = grpo(GroupedRewards.from_padded(scores.view(4, 4)))
    buffer = torch.full((16, 5), 7.0)
    out = broadcast_to_tokens(adv, mask, out=buffer)
    assert out is buffer
    for b in range(16):
        for t in range(5):
            assert out[b, t] == (adv[b] if mask[b, t] else 0.0)


def test_float64_advantages_give_float32_tokens_and_a_bool_mask_works():
    out = broadcast_to_tokens(
        torch.tensor([0.5, -2.0], dtype=torch.float64), torch.tensor([[True, False], [True, True]])
    )
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.5, 0.0], [-2.0, -2.0]]
    assert sequence_scores(torch.ones(2, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: sequence_scores(torch.ones(3)), InvalidRewardsError, r"\[B, T\]"),
        (lambda: sequence_scores(torch.ones(2, 2, dtype=torch.long)), InvalidRewardTypeError, "floating-point"),
        (lambda: broadcast_to_tokens(torch.ones(3), torch.ones(2, 4)), InvalidRewardsError, "B = 3"),
        (
            lambda: broadcast_to_tokens(torch.ones(2), torch.ones(2, 4), out=torch.empty(2, 3)),
            InvalidRewardsError,
            r"shape \(2, 4\)",
        ),
        (
            lambda: broadcast_to_tokens(torch.ones(2, dtype=torch.long), torch.ones(2, 4)),
            InvalidRewardTypeError,
            "floating-point",
        ),
        (
            lambda: broadcast_to_tokens(torch.ones(2), torch.ones(2, 4, dtype=torch.long)),
            InvalidRewardTypeError,
            "float \\(0/1\\) or bool",
        ),
    ],
)
def test_bad_inputs_are_typed_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()

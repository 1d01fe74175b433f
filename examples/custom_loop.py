"""A hand-written policy-gradient loop that calls the estimators on tensors.

A tabular policy over 10 prompts (a digit d) and 10 answers learns to answer d + 1 (mod 10):
each step samples K answers per prompt, scores them, packs the rewards as [G, K] and calls
``grpo`` (or any registered estimator) with no Python loop over groups.
"""

from __future__ import annotations

import torch

from rllm_torch import GroupedRewards, compute_advantages


def train(estimator: str = "grpo", steps: int = 60, group_size: int = 8, seed: int = 0) -> tuple[float, float]:
    """Returns the policy's expected reward before and after training."""
    torch.manual_seed(seed)
    logits_GA = torch.zeros(10, 10, requires_grad=True)  # G prompts x A answers
    target_G = (torch.arange(10) + 1) % 10
    optimizer = torch.optim.Adam([logits_GA], lr=0.1)

    def expected_reward() -> float:
        return logits_GA.softmax(-1).gather(1, target_G[:, None]).mean().item()

    before = expected_reward()
    for _ in range(steps):
        dist = torch.distributions.Categorical(logits=logits_GA)
        answers_KG = dist.sample((group_size,))  # [K, G]
        rewards_GK = (answers_KG == target_G).float().T  # [G, K]: one row per prompt
        adv_N, _ = compute_advantages(GroupedRewards.from_padded(rewards_GK), estimator)
        logp_GK = dist.log_prob(answers_KG).T  # [G, K]
        loss = -(adv_N.view_as(logp_GK) * logp_GK).mean()  # flat order is row-major
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return before, expected_reward()


if __name__ == "__main__":
    print(train())

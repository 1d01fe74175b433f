"""The custom loop of ``custom_loop.py`` on several processes: ``torchrun`` + DDP + group statistics
across ranks.

    torchrun --standalone --nproc_per_node=2 examples/distributed_loop.py [estimator]

Every rank samples its own share of the rollouts of *every* prompt (``8 // world_size`` each),
so each group is split over all ranks: ``GroupedRewards.from_padded(..., process_group=WORLD)``
makes the estimator's group mean and std those of all 8 rollouts, as on one process. DDP
averages the gradients. Rank 0 prints the expected reward before and after; every rank checks
that its weights equal rank 0's.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rllm_torch import GroupedRewards, compute_advantages


def train(estimator: str = "grpo", steps: int = 60, group_size: int = 8, seed: int = 0) -> tuple[float, float]:
    """The policy's expected reward before and after training (the same on every rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)  # the same initial policy everywhere (DDP also broadcasts rank 0's)
    policy = torch.nn.Embedding(10, 10)  # prompt d -> logits over 10 answers
    torch.nn.init.zeros_(policy.weight)
    model = DistributedDataParallel(policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    prompts_G = torch.arange(10)
    target_G = (prompts_G + 1) % 10
    sampler = torch.Generator().manual_seed(seed + 1000 * rank)  # each rank its own rollouts

    def expected_reward() -> float:
        with torch.no_grad():
            return policy(prompts_G).softmax(-1).gather(1, target_G[:, None]).mean().item()

    before = expected_reward()
    for _ in range(steps):
        logits_GA = model(prompts_G)
        answers_GK = torch.multinomial(logits_GA.softmax(-1), group_size // world, replacement=True, generator=sampler)
        rewards_GK = (answers_GK == target_G[:, None]).float()  # this rank's rollouts of every prompt
        batch = GroupedRewards.from_padded(rewards_GK, process_group=dist.group.WORLD, validate=False)
        adv_N, _ = compute_advantages(batch, estimator)  # group statistics over all ranks' rollouts
        logp_GK = logits_GA.log_softmax(-1).gather(1, answers_GK)
        loss = -(adv_N.view_as(logp_GK) * logp_GK).mean()  # equal shares: DDP's mean is the global mean
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weights = policy.weight.detach().clone()
    reference = weights.clone()
    dist.broadcast(reference, src=0)
    if not torch.equal(weights, reference):
        raise RuntimeError(f"rank {rank}: weights differ from rank 0's after training")
    return before, expected_reward()


if __name__ == "__main__":
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, ...
    before, after = train(*sys.argv[1:2])
    if dist.get_rank() == 0:
        print(f"world size {dist.get_world_size()}: expected reward {before:.3f} -> {after:.3f}")
    gc.collect()  # the DDP model (a reference cycle) lets go of the group before it is destroyed
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()

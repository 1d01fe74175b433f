"""MaxRL (``maxrl``, prime-rl's ``max_rl``): a hand table, a float64 per-group loop on ragged and
equal groups, the documented 0 where a group's mean is not positive, 2 gloo ranks with split
groups, and compiled."""

from __future__ import annotations

import pytest
import rank_tasks
import torch
from rank_pool import RankPool

from rllm_torch import GroupedRewards, compute_advantages, maxrl


def reference(groups):
    out = []
    for g in groups:
        mean = sum(g) / len(g)
        out += [(r - mean) / mean if mean > 0 and len(g) > 1 else 0.0 for r in g]
    return out


def test_hand_table():
    # pass rates 1/4, 0, 1/2, 1; then a group of one and a group whose mean is 0 with nonzero rewards
    groups = [[1, 0, 0, 0], [0, 0, 0], [1, 0], [1, 1], [0.7], [-1.0, 1.0]]
    adv, ret = maxrl(GroupedRewards.from_groups(groups))
    assert adv.tolist() == [3.0, -1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert ret is adv


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_float64_loop_on_ragged_and_equal_groups(seed):
    gen = torch.Generator().manual_seed(seed)
    groups = [
        ((torch.rand(int(n), generator=gen) * 3).round() - (seed % 2)).tolist()
        for n in torch.randint(1, 7, (12,), generator=gen)
    ]
    got, _ = compute_advantages(GroupedRewards.from_groups(groups), "maxrl")
    torch.testing.assert_close(got, torch.tensor(reference(groups), dtype=got.dtype), rtol=1e-12, atol=1e-12)
    equal = (torch.rand(8, 4, generator=gen, dtype=torch.float64) > 0.6).double()
    got, _ = compute_advantages(GroupedRewards.from_padded(equal), "max_rl")
    torch.testing.assert_close(got, torch.tensor(reference(equal.tolist()), dtype=torch.float64))


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


def test_split_groups_on_two_ranks_equal_one_process(pool):
    rewards, index = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], [0, 1, 0, 2, 1, 2, 3, 3]
    want, _ = maxrl(GroupedRewards.from_flat(torch.tensor(rewards), torch.tensor(index), num_groups=4))
    common = dict(dtype="float32", kind="flat", num_groups=4, local=False, process_group=None)
    specs = [dict(common, rewards=rewards[:3], index=index[:3]), dict(common, rewards=rewards[3:], index=index[3:])]
    got = pool.run_ok(rank_tasks.estimate, [(s, "maxrl", {}) for s in specs])
    assert [v for r in got for v in r[0].tolist()] == pytest.approx(want.tolist())  # groups 0-2 split, 3 on rank 1


def test_compiled_with_fullgraph_it_gives_the_eager_numbers():
    rewards = (torch.rand(6, 4) > 0.5).float()
    compiled = torch.compile(lambda r: maxrl(GroupedRewards.from_padded(r, validate=False))[0], fullgraph=True)
    torch.testing.assert_close(compiled(rewards), maxrl(GroupedRewards.from_padded(rewards))[0])

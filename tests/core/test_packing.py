"""The packed layout: constructors, flat <-> padded, labels."""

import numpy as np
import torch

from rllm_torch import GroupedRewards, factorize_group_labels, segment_count, segment_mean, segment_sum


def test_from_groups_packs_ragged_lists_in_group_major_order():
    batch = GroupedRewards.from_groups([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]])
    assert batch.num_groups == 3 and batch.num_trajectories == 6 and batch.group_size is None
    assert batch.group_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert batch.slot_index.tolist() == [0, 1, 0, 0, 1, 2]
    assert batch.counts.tolist() == [2, 1, 3] and batch.max_group_size == 3
    assert batch.padded_rewards.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert batch.mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    assert batch.rewards.dtype == torch.float64


def test_equal_groups_are_a_free_view():
    rewards = torch.arange(12.0).view(3, 4)
    batch = GroupedRewards.from_padded(rewards)
    assert batch.group_size == 4 and batch.layout.is_dense
    assert batch.padded_rewards.data_ptr() == rewards.data_ptr()
    assert GroupedRewards.from_groups([[1, 2], [3, 4]]).group_size == 2


def test_flat_and_padded_round_trip_in_any_order():
    index = torch.tensor([2, 0, 2, 1, 0, 2])
    rewards = torch.tensor([10.0, 20.0, 11.0, 30.0, 21.0, 12.0])
    batch = GroupedRewards.from_flat(rewards, index)
    assert batch.slot_index.tolist() == [0, 0, 1, 0, 1, 2]
    padded = batch.padded_rewards
    assert padded.tolist() == [[20, 21, 0], [30, 0, 0], [10, 11, 12]]
    assert torch.equal(batch.to_flat(padded), rewards)
    assert [g.tolist() for g in batch.split(rewards)] == [[20, 21], [30], [10, 11, 12]]
    assert torch.equal(batch.merge(batch.split(rewards)), rewards)


def test_from_padded_with_mask_reads_only_real_entries():
    rewards = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    batch = GroupedRewards.from_padded(rewards, torch.tensor([[True, False], [True, True]]))
    assert batch.rewards.tolist() == [1.0, 2.0, 3.0] and batch.group_index.tolist() == [0, 1, 1]
    assert torch.equal(batch.to_flat(batch.to_padded(batch.rewards)), batch.rewards)


def test_numpy_and_tensor_groups_promote_to_one_dtype():
    batch = GroupedRewards.from_groups(
        [np.array([True, False]), torch.tensor([2], dtype=torch.int32), np.array([0.5], dtype=np.float32)]
    )
    assert batch.rewards.dtype == torch.float32 and batch.rewards.tolist() == [1.0, 0.0, 2.0, 0.5]


def test_factorize_numbers_labels_by_first_appearance():
    index, unique = factorize_group_labels(["task-b", "task-a", "task-b", ("t", 3), -7])
    assert index.tolist() == [0, 1, 0, 2, 3] and unique == ["task-b", "task-a", ("t", 3), -7]
    index, unique = factorize_group_labels(torch.tensor([40, -3, 40, 1000]))
    assert index.tolist() == [0, 1, 0, 2] and unique == [40, -3, 1000]
    index, unique = factorize_group_labels(np.array([5, 5, -1]))
    assert index.tolist() == [0, 0, 1] and unique == [5, -1]


def test_from_labels_groups_by_label():
    batch = GroupedRewards.from_labels(torch.tensor([1.0, 0.0, 1.0]), ["x", "y", "x"])
    assert batch.num_groups == 2 and batch.group_index.tolist() == [0, 1, 0]


def test_empty_groups_are_allowed_and_produce_nothing():
    batch = GroupedRewards.from_flat(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), num_groups=3)
    assert batch.counts.tolist() == [2, 0, 0]
    assert [g.numel() for g in batch.split(batch.rewards)] == [2, 0, 0]


def test_segment_reductions_accumulate_in_float32_or_float64():
    index = torch.tensor([0, 1, 1, 0])
    assert segment_count(index, 3).tolist() == [2, 2, 0]
    s = segment_sum(torch.tensor([True, True, False, True]), index, 2)
    assert s.dtype == torch.float32 and s.tolist() == [2.0, 1.0]
    m = segment_mean(torch.tensor([1.0, 2.0, 4.0, 3.0], dtype=torch.float64), index, 2)
    assert m.dtype == torch.float64 and m.tolist() == [2.0, 3.0]


def test_to_moves_every_tensor():
    batch = GroupedRewards.from_groups([[1.0], [2.0, 3.0]]).to("meta")
    assert batch.rewards.device.type == batch.group_index.device.type == "meta"


def test_validation_notices_group_major_order():
    sorted_batch = GroupedRewards.from_flat(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 2]))
    assert sorted_batch.group_major and sorted_batch.num_groups == 3
    assert not GroupedRewards.from_flat(torch.tensor([1.0, 2.0]), torch.tensor([1, 0])).group_major
    unchecked = GroupedRewards.from_flat(torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), num_groups=2, validate=False)
    assert not unchecked.group_major  # nothing was read, so nothing is assumed
    assert [g.tolist() for g in sorted_batch.split(sorted_batch.rewards)] == [[1.0, 2.0], [], [3.0]]

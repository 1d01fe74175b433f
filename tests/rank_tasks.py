"""What the ranks of a :class:`rank_pool.RankPool` run in the distributed tests (module-level, so the
spawned workers can import them). Each takes plain picklable arguments and returns numpy arrays,
numbers or strings."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from rllm_torch import GroupedRewards, compute_advantages, register_rllm_adv_estimator

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "bool": torch.bool}


def build_batch(spec: dict) -> GroupedRewards:
    """This rank's ``GroupedRewards`` from a spec made by the test (see ``test_distributed_estimators``)."""
    dtype = DTYPES[spec["dtype"]]
    pg = spec.get("process_group", None)
    common = dict(process_group=pg, local_groups=spec["local"])
    if spec["kind"] == "flat":
        rewards = torch.tensor(spec["rewards"], dtype=torch.float64).to(dtype)
        index = torch.tensor(spec["index"], dtype=torch.int64)
        components = spec.get("components")  # [N, R] rewards of R reward functions (gdpo)
        if components is not None:
            common["reward_components"] = torch.tensor(components, dtype=torch.float64).reshape(len(index), -1)
        return GroupedRewards.from_flat(
            rewards, index, num_groups=spec["num_groups"], validate=spec.get("validate", True), **common
        )
    if spec["kind"] == "groups":
        groups = [torch.tensor(g, dtype=torch.float64).to(dtype) for g in spec["groups"]]
        return GroupedRewards.from_groups(groups, **common)
    if spec["kind"] == "padded":
        rewards = torch.tensor(spec["padded"], dtype=torch.float64).to(dtype).reshape(spec["shape"])
        return GroupedRewards.from_padded(rewards, validate=spec.get("validate", True), **common)
    raise KeyError(spec["kind"])


def estimate(spec: dict, estimator: str, options: dict) -> tuple[np.ndarray, str, str]:
    """``(advantages as float64, their dtype, the layout's branch)`` of this rank's batch."""
    batch = build_batch(spec)
    adv, ret = compute_advantages(batch, estimator, **options)
    if not torch.equal(adv.nan_to_num(7.0), ret.nan_to_num(7.0)):
        raise AssertionError("returns differ from advantages")
    return adv.double().numpy(), str(adv.dtype), "dense" if batch.layout.is_dense else "ragged"


def count_collectives(spec: dict, estimator: str, options: dict) -> list[tuple[str, int, str]]:
    """``(collective, numel, dtype)`` of every ``torch.distributed`` call one estimator call makes,
    after the batch is built (its validation collective is not counted)."""
    batch = build_batch(spec)
    calls: list[tuple[str, int, str]] = []
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast")}

    def counting(name):
        def call(obj, *args, **kwargs):
            sent = args[0] if name == "all_gather" else obj  # all_gather(outputs, input)
            numel = sent.numel() if isinstance(sent, torch.Tensor) else -1
            calls.append(
                (name, numel, str(getattr(sent, "dtype", type(sent).__name__)))
                if name != "all_gather"
                else (name, numel, str(sent.dtype))
            )
            return originals[name](obj, *args, **kwargs)

        return call

    for name in originals:
        setattr(dist, name, counting(name))
    try:
        compute_advantages(batch, estimator, **options)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return calls


def build_only(spec: dict) -> str:
    """Build the batch (to test the input checks); its repr on success."""
    return repr(build_batch(spec))


# ---- custom estimators: registered on import, in the parent and in every worker ----------------


@register_rllm_adv_estimator("test_mean_abs_scaled", form="tensors")
def mean_abs_scaled(batch: GroupedRewards):
    """Group-mean baseline scaled by the batch's mean |centred reward|, written only with the
    layout's reductions: correct across ranks with no extra code."""
    layout = batch.layout
    centered_N = layout.flat(layout.center(layout.values(batch.rewards.double())).values)
    whole, c_1N = layout.whole_batch(centered_N)
    scale = whole.mean(c_1N.abs()).reshape(())
    adv_N = centered_N / (scale + 1e-6)
    return adv_N, adv_N


@register_rllm_adv_estimator("test_distributed_max_baseline")
def max_baseline(rewards, **kwargs):
    """rLLM form (per-group arrays): reward minus its group's best reward."""
    adv = [r - r.max() for r in rewards]
    return adv, adv


def make_groups(spec: list[dict]) -> list:
    """TrajectoryGroups from ``[{task_id, role, rewards, steps, precomputed, vary_steps}]``
    (``steps`` steps per trajectory, one more for every other one with ``vary_steps``; step ``t``
    has reward ``t / 4`` and observation ``(i + t) % 2``; ``precomputed``: each step carries
    advantage 0.5)."""
    from rllm_torch import Step, Trajectory, TrajectoryGroup

    groups = []
    for g in spec:
        trajs = []
        for i, reward in enumerate(g["rewards"]):
            steps = [
                Step(
                    prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1], reward=0.25 * t, observation=(i + t) % 2
                )
                for t in range(g.get("steps", 1) + (i % 2 if g.get("vary_steps") else 0))
            ]
            if g.get("precomputed"):
                for step in steps:
                    step.advantage = 0.5
            trajs.append(Trajectory(name=g["role"], reward=reward, steps=steps))
        groups.append(TrajectoryGroup(trajectories=trajs, group_id=f"{g['task_id']}:{g['role']}", task_id=g["task_id"]))
    return groups


def collect(spec: list[dict], config: dict, process_group: object = None) -> tuple[list, dict]:  # None: WORLD
    """``(per-step advantages, metrics)`` of the collector on this rank's groups."""
    from rllm_torch import AlgorithmConfig, collect_reward_and_advantage_from_trajectory_groups

    groups = make_groups(spec)
    metrics = collect_reward_and_advantage_from_trajectory_groups(
        groups, AlgorithmConfig(**config), process_group=process_group
    )
    return [[[s.advantage for s in t.steps] for t in g.trajectories] for g in groups], metrics


def collect_turns(spec: list[dict], config: dict) -> tuple[list, dict]:
    """:func:`collect` over WORLD (the turn modes' test)."""
    return collect(spec, config, process_group=None)


def compiled_matches_eager(estimator: str, local: bool) -> float:
    """Max difference between the estimator compiled with ``fullgraph=True`` (its collectives
    traced into the graph) and eager, on this rank's share of a 3-group batch."""
    import rllm_torch

    torch._dynamo.reset()
    fn = getattr(rllm_torch, estimator)

    def advantages(rewards_N, index_N):
        batch = GroupedRewards.from_flat(
            rewards_N, index_N, num_groups=3, validate=False, process_group=dist.group.WORLD, local_groups=local
        )
        return fn(batch)[0]

    rewards_N = torch.rand(7, generator=torch.Generator().manual_seed(dist.get_rank()))
    index_N = torch.tensor([0, 1, 0, 2, 1, 2, 2])
    eager = advantages(rewards_N, index_N)
    return float((torch.compile(advantages, fullgraph=True)(rewards_N, index_N) - eager).abs().max())


def not_a_process_group() -> str:
    """A string where a ProcessGroup belongs."""
    return build_only(
        dict(kind="flat", rewards=[1.0], index=[0], num_groups=1, dtype="float32", local=False, process_group="world")
    )


def estimate_with(spec: dict, estimator_by_rank: list[str]) -> str:
    """Each rank calls its own estimator (a caller's bug the validated check must catch)."""
    batch = build_batch(spec)
    compute_advantages(batch, estimator_by_rank[dist.get_rank()])
    return "ran"


def register_on_rank_0_only_and_estimate(spec: dict) -> str:
    if dist.get_rank() == 0:
        register_rllm_adv_estimator("test_only_on_rank_0", form="tensors")(
            lambda b: (b.rewards.float(), b.rewards.float())
        )
    compute_advantages(build_batch(spec), "test_only_on_rank_0")
    return "ran"


def build_in_a_group_without_this_rank(spec: dict) -> str:
    group = dist.new_group([0])  # every rank must call new_group; rank 1 gets the non-member placeholder
    return build_only(dict(spec, process_group=group))


def estimate_weighted(spec: dict, estimator: str, options: dict) -> np.ndarray:
    """Advantages of this rank's flat rewards with per-trajectory weights (OPO's lengths)."""
    batch = GroupedRewards.from_flat(
        torch.tensor(spec["rewards"], dtype=torch.float64),
        torch.tensor(spec["index"], dtype=torch.int64),
        num_groups=spec["num_groups"],
        weights=torch.tensor(spec["weights"], dtype=torch.float64),
        process_group=None,
        local_groups=spec["local"],
    )
    adv, _ = compute_advantages(batch, estimator, **options)
    return adv.numpy()


def estimate_tokens(rewards: list, mask: list, values: list, estimator: str, options: dict) -> tuple:
    """``(advantages, returns)`` of this rank's ``[B, T]`` token batch, whitened over every rank."""
    from rllm_torch import TokenRewards

    width = options.pop("width")
    shape = (-1, width)
    batch = TokenRewards(
        torch.tensor(rewards, dtype=torch.float64).reshape(shape),
        torch.tensor(mask, dtype=torch.float64).reshape(shape),
        values=torch.tensor(values, dtype=torch.float64).reshape(shape),
        process_group=None,
    )
    adv, returns = compute_advantages(batch, estimator, **options)
    return adv.numpy(), returns.numpy()


def whiten_tokens(values: list, mask: list, width: int, dtype: str) -> np.ndarray:
    """``masked_whiten`` of this rank's ``[B, T]`` values, over every rank's trained tokens."""
    from rllm_torch import masked_whiten

    values_BT = torch.tensor(values, dtype=torch.float64).to(DTYPES[dtype]).reshape(-1, width)
    mask_BT = torch.tensor(mask, dtype=torch.float64).to(DTYPES[dtype]).reshape(-1, width)
    return masked_whiten(values_BT, mask_BT, process_group=None).double().numpy()


def error_of(spec: dict, estimator: str, options: dict) -> str:
    """The type and message of what this rank raised (``""`` if nothing)."""
    try:
        compute_advantages(build_batch(spec), estimator, **options)
    except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
        return f"{type(exc).__name__}: {exc}"
    return ""


def turn_scheme(spec: dict, scheme: str) -> list:
    """This rank's per-turn advantages of a :mod:`rllm_torch.core.turns` scheme with ``rloo``, split groups."""
    from rllm_torch.core.estimators import rloo
    from rllm_torch.core.estimators.turns import (
        broadcast_advantages,
        gigpo_advantages,
        per_turn_index_advantages,
        turn_level_advantages,
    )
    from rllm_torch.core.turns import GroupedTurns

    turns = GroupedTurns.from_flat(
        torch.tensor(spec["rewards"], dtype=torch.float64),
        torch.tensor(spec["traj"], dtype=torch.int64),
        torch.tensor(spec["group"], dtype=torch.int64),
        num_groups=spec["num_groups"],
        observation_index=torch.tensor(spec["obs"], dtype=torch.int64),
        process_group=None,
    )
    fns = {
        "turn_level": turn_level_advantages,
        "mt_grpo": per_turn_index_advantages,
        "gigpo": gigpo_advantages,
        "broadcast": broadcast_advantages,
    }
    adv, _ = fns[scheme](turns, rloo)
    return adv.tolist()


def entropy_mask(entropy: list, mask: list, quantile: float) -> list:
    """This rank's high-entropy mask over every rank's tokens (WORLD)."""
    import torch.distributed as dist

    from rllm_torch.core.losses import high_entropy_mask

    return high_entropy_mask(
        torch.tensor(entropy), torch.tensor(mask), quantile, process_group=dist.group.WORLD
    ).tolist()

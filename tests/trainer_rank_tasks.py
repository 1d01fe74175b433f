"""What the ranks of a :class:`rank_pool.RankPool` run in the distributed trainer tests: the real
torch backend on fixed episodes (module-level, so spawned workers can import it)."""

from __future__ import annotations

import asyncio

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.schema import TrainConfig
from rllm_torch.trainer.state import TrainerState

ALPHABET = "0123456789+="


def fixed_groups(seed: int, num_groups: int, n: int, eos: int) -> list[dict]:
    """Deterministic groups of ``n`` completions of ``"a+b="``: 1-3 response tokens ending in eos
    or not, rewards 0/1 and sampling log-probs, as plain data (picklable)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(num_groups):
        prompt = (
            [int(v) for v in torch.randint(0, 10, (1,), generator=g)]
            + [10]
            + [int(torch.randint(0, 10, (1,), generator=g))]
            + [11]
        )
        members = []
        for _ in range(n):
            length = int(torch.randint(1, 4, (1,), generator=g))
            response = [int(v) for v in torch.randint(0, 10, (length,), generator=g)]
            if torch.rand(1, generator=g) < 0.5:
                response[-1] = eos
            members.append(
                {
                    "prompt": prompt,
                    "response": response,
                    "logprobs": (-torch.rand(length, generator=g) * 3).tolist(),
                    "reward": float(torch.rand(1, generator=g) < 0.4),
                }
            )
        groups.append({"task_id": f"task-{seed}-{i}", "members": members})
    return groups


def _groups(data: list[dict]) -> list[TrajectoryGroup]:
    out = []
    for group in data:
        trajs = [
            Trajectory(
                name="solver",
                reward=m["reward"],
                steps=[Step(prompt_ids=m["prompt"], response_ids=m["response"], logprobs=m["logprobs"])],
            )
            for m in group["members"]
        ]
        out.append(TrajectoryGroup(trajectories=trajs, group_id=f"{group['task_id']}:solver", task_id=group["task_id"]))
    return out


def backend_config(*dotlist: str):
    base = OmegaConf.structured(TrainConfig)
    base.backend.device = "cpu"
    return OmegaConf.merge(base, OmegaConf.from_dotlist(list(dotlist)))


def update_once(
    data: list[dict], dotlist: list[str], ranks: RunRanks | None = None
) -> tuple[TorchBackend, TrainerState]:
    """The real torch backend after one update on ``data``'s fixed groups, and its state."""
    config = backend_config(*dotlist)
    backend = TorchBackend(config, alphabet=ALPHABET, ranks=ranks)
    backend.init_rollout_engine()
    state = TrainerState(trajectory_groups=_groups(data), total_steps=1)
    state.backend_batch = backend.transform_to_backend_batch(state)
    last_grads = {}  # each step's gradient, before the step frees it

    def keep_grads(optimizer, args, kwargs):
        last_grads.update({p: p.grad.clone() for p in backend.actor.parameters if p.grad is not None})

    backend.actor.optimizer.register_step_pre_hook(keep_grads)

    async def step():
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, AlgorithmConfigFrom(config))
        await backend.update_policy(state)

    asyncio.run(step())
    for param, grad in last_grads.items():  # the last mini-batch's gradient, back in .grad
        param.grad = grad
    return backend, state


def one_update(data: list[dict], dotlist: list[str], distributed: bool) -> tuple[dict, dict]:
    """One real update of the torch backend on this rank's fixed groups: ``(weights, metrics)``,
    the metrics with ``"grads"``, the parameters' last gradient."""
    ranks = RunRanks(dist.get_rank(), dist.get_world_size(), 0, dist.group.WORLD) if distributed else RunRanks()
    backend, state = update_once(data, dotlist, ranks)
    weights = _weights(backend)
    grads = {k: _full(p.grad) for k, p in backend.model.named_parameters() if p.grad is not None}
    return weights, state.metrics | {"grads": grads}


def _weights(backend: TorchBackend) -> dict:
    """The policy's weights, and the critic's (``critic.``-prefixed) when there is one."""
    weights = {k: _full(v) for k, v in backend.model.state_dict().items()}
    if backend.critic is not None:
        weights |= {f"critic.{k}": _full(v) for k, v in backend.critic.model.state_dict().items()}
    return weights


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain copy of ``tensor``; an FSDP shard (DTensor) is gathered whole first."""
    tensor = tensor.detach()
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).clone()


def AlgorithmConfigFrom(config):  # noqa: N802 - reads like the class it builds
    from rllm_torch.rllm.config import AlgorithmConfig

    return AlgorithmConfig.from_config(config)


def eos_id() -> int:
    from rllm_torch.backends.torch_backend.tokenizer import load_tokenizer

    return load_tokenizer(None, ALPHABET).eos_token_id


def local_normaliser_update(data: list[dict]) -> tuple[dict, dict]:
    """:func:`one_update` with each rank's loss normalised by its own token count (no all-reduce
    of the normaliser): the per-rank-mean bug, to show the test above detects it."""
    import rllm_torch.backends.torch_backend.backend as backend_module

    original = backend_module.torch.distributed.all_reduce

    def skip_normaliser(tensor, *args, **kwargs):
        if tensor.dim() == 0:  # the loss normaliser is the only 0-d all-reduce of an update
            return None
        return original(tensor, *args, **kwargs)

    backend_module.torch.distributed.all_reduce = skip_normaliser
    try:
        return one_update(data, ["rllm.algorithm.loss_agg_mode=token-mean"], True)
    finally:
        backend_module.torch.distributed.all_reduce = original


def initial_weights(*dotlist: str) -> dict:
    """The policy's (and critic's) weights before any update (the same seed as :func:`one_update`)."""
    return _weights(TorchBackend(backend_config(*dotlist), alphabet=ALPHABET))

"""Fakes for trainer tests: a backend that records every call and a two-role workflow."""

from __future__ import annotations

from omegaconf import OmegaConf

from rllm_torch.rllm.types import Episode, Step, TerminationReason, Trajectory
from rllm_torch.trainer.pipeline.token_batch import build_token_batch
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.schema import TrainConfig
from rllm_torch.trainer.workflow import Workflow


def make_config(tmp_path, *dotlist: str):
    """The structured default config with ``dotlist`` overrides and the run dir in ``tmp_path``."""
    base = OmegaConf.structured(TrainConfig)
    base.rllm.trainer.default_local_dir = str(tmp_path)
    base.rllm.trainer.logger = ["jsonl"]
    return OmegaConf.merge(base, OmegaConf.from_dotlist(list(dotlist)))


class RecordingBackend(BackendProtocol):
    """Records the name of every method the trainer calls, in order, into ``calls``."""

    name = "recording"

    def __init__(self, config, **kwargs):
        super().__init__(config)
        self.kwargs = kwargs  # what the trainer built it with
        self.calls: list[str] = []
        self.batches = []

    def init_rollout_engine(self, **kwargs):
        self.calls.append("init_rollout_engine")
        return None

    def validate_config(self):
        self.calls.append("validate_config")

    def get_dataloader(self, dataset, trainer_state):
        size = self.config.data.train_batch_size
        return [
            [(f"t{i + j}", row) for j, row in enumerate(dataset[i : i + size])] for i in range(0, len(dataset), size)
        ]

    async def generate_episodes(self, batch, agent_workflow_engine, is_validation=False):
        self.calls.append("generate_episodes:val" if is_validation else "generate_episodes")
        n = self.config.rllm.rollout.n_val if is_validation else self.config.rllm.rollout.n
        tasks = [(tid, task, k) for tid, task in batch for k in range(n)]
        return await agent_workflow_engine.execute_tasks(
            [t for _, t, _ in tasks], [i for i, _, _ in tasks], [k for _, _, k in tasks]
        )

    def transform_to_backend_batch(self, trainer_state):
        self.calls.append("transform_to_backend_batch")
        return build_token_batch(trainer_state.trajectory_groups, pad_token_id=0)

    async def process_backend_batch(self, trainer_state):
        self.calls.append("process_backend_batch")

    async def compute_advantages(self, trainer_state, algorithm_config):
        self.calls.append("compute_advantages")
        await super().compute_advantages(trainer_state, algorithm_config)
        self.batches.append(trainer_state.backend_batch)

    async def update_policy(self, trainer_state):
        self.calls.append("update_policy")

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name.startswith("on_"):
            calls = object.__getattribute__(self, "calls")

            async def hook(state, _attr=attr, _name=name):
                calls.append(f"{_name}@{state.global_step}")
                return await _attr(state)

            return hook
        return attr


class TwoRoleWorkflow(Workflow):
    """Each episode: a ``solver`` trajectory with reward = rollout index, a ``judge`` with 1 - that.

    ``task["fail"] = k`` makes the first k attempts of every episode raise."""

    attempts: dict[str, int] = {}

    def __init__(self, rollout_engine, roles=("solver", "judge"), **kwargs):
        super().__init__(rollout_engine)
        self.roles = roles

    async def run(self, task, uid):
        TwoRoleWorkflow.attempts[uid] = TwoRoleWorkflow.attempts.get(uid, 0) + 1
        if TwoRoleWorkflow.attempts[uid] <= task.get("fail", 0):
            raise RuntimeError(f"flaky attempt {TwoRoleWorkflow.attempts[uid]}")
        k = int(uid.rsplit(":", 1)[1])
        reward = float(k % 2) if task.get("binary", True) else float(k)
        trajs = [
            Trajectory(
                name=role,
                reward=reward if role == "solver" else 1.0 - reward,
                steps=[Step(prompt_ids=[5, 6], response_ids=[7, 8, 9], logprobs=[-0.1, -0.2, -0.3])],
            )
            for role in self.roles
        ]
        return Episode(
            trajectories=trajs,
            is_correct=reward >= 1.0,
            termination_reason=TerminationReason.ENV_DONE,
            metrics={"reward": reward},
            info={"data_source": task.get("data_source", "fake")},
        )

"""A resume restores every generator the run draws from: python ``random``, numpy, torch's CPU
generator and the backend's own per-rank generator, checked by the numbers they draw next (the
SIGKILL test would see a missing restore only through a last-bit metric difference)."""

from __future__ import annotations

import random

import numpy as np
import torch
from trainer_fakes import make_config

from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.runtime.run_checkpoint import RunCheckpointer
from rllm_torch.trainer.state import TrainerState


class GeneratorBackend(BackendProtocol):
    """A backend with nothing but a sampling generator, saved per rank."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.generator = torch.Generator().manual_seed(123)

    def rank_state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_rank_state_dict(self, state):
        self.generator.set_state(state["generator"])

    def init_rollout_engine(self, **kwargs):
        return None

    def get_dataloader(self, dataset, trainer_state):
        return []

    async def generate_episodes(self, batch, agent_workflow_engine, is_validation=False):
        return []

    def transform_to_backend_batch(self, trainer_state):
        return None

    async def update_policy(self, trainer_state):
        return None


def _draws(backend) -> list[float]:
    return [
        random.random(),
        float(np.random.rand()),
        float(torch.rand(())),
        float(torch.rand((), generator=backend.generator)),
    ]


def test_resume_restores_every_generator_so_the_next_draws_are_the_same(tmp_path):
    config = make_config(tmp_path)
    backend = GeneratorBackend(config)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    _draws(backend)  # move every generator off its seed
    checkpointer = RunCheckpointer(backend, config, tmp_path)
    checkpointer.save(TrainerState(global_step=5), [])
    after_save = _draws(backend)

    random.seed(9), np.random.seed(9), torch.manual_seed(9)  # a new process starts elsewhere
    fresh = GeneratorBackend(config)
    resumed = RunCheckpointer(fresh, config, tmp_path).resume(TrainerState(), [])
    assert resumed is not None and resumed.step == 5
    assert _draws(fresh) == after_save

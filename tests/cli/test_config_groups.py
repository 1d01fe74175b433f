"""The Hydra group files (``configs/{backend,model,task}/*.yaml``) name only what differs from the
schema: every setting's default is declared once (``rllm_torch/trainer/schema.py``), so a group
file that repeats one can only drift from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rllm_torch.trainer.schema import TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUP_FILES = sorted(p for group in ("backend", "model", "task") for p in (CONFIGS / group).glob("*.yaml"))


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_there_are_group_files():
    assert {p.parent.name for p in GROUP_FILES} == {"backend", "model", "task"}


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_group_file_sets_only_what_differs_from_the_schema(path):
    schema = OmegaConf.to_container(OmegaConf.structured(TrainConfig), resolve=False)
    group = path.parent.name
    given = yaml.safe_load(path.read_text()) or {}
    repeated = [
        f"{group}.{key}: {value!r}"
        for key, value in _leaves(given)
        if OmegaConf.select(OmegaConf.create(schema[group]), key, default=object()) == value
    ]
    assert not repeated, f"{path.name} repeats the schema's default of {repeated}: drop them"

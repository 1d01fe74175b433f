"""Start-up checks of a composed training config: numeric settings inside their bounds, and no
task key the chosen task would ignore. Hydra's schema checks names and types; these check
values, so a bad one stops the run before anything is built, naming its key."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from rllm_torch.core.errors import ConfigError, DistributedSetupError
from rllm_torch.trainer.schema import TaskConfig, TrainConfig

__all__ = ["check_run_config", "check_world_size", "check_loss_options", "FILE_TASK_KEYS"]

# key -> (lower bound, whether the bound itself is allowed, upper bound or None); None values
# of optional keys are not checked.
_BOUNDS: dict[str, tuple[float, bool, float | None]] = {
    "rllm.rollout.n": (1, True, None),
    "rllm.rollout.n_val": (1, True, None),
    "rllm.rollout.max_new_tokens": (1, True, None),
    "rllm.rollout.temperature": (0, True, None),
    "rllm.rollout.val_temperature": (0, True, None),
    "rllm.rollout.top_p": (0, False, 1),
    "rllm.rollout.val_top_p": (0, False, 1),
    "rllm.trainer.total_epochs": (1, True, None),
    "rllm.trainer.total_batches": (1, True, None),
    "rllm.workflow.n_parallel_tasks": (1, True, None),
    "rllm.workflow.retry_limit": (1, True, None),
    "data.train_batch_size": (1, True, None),
    "backend.lr": (0, False, None),
    "backend.weight_decay": (0, True, None),
    "backend.grad_clip": (0, False, None),
    "backend.ppo_epochs": (1, True, None),
    "backend.mini_batch_size": (1, True, None),
    "backend.clip_ratio_low": (0, True, None),
    "backend.clip_ratio_high": (0, True, None),
    "backend.clip_ratio_c": (1, False, None),
    "backend.entropy_coeff": (0, True, None),
    "backend.micro_batch_tokens": (1, True, None),
    "backend.log_prob_chunk_tokens": (1, True, None),
    "model.lora.r": (0, True, None),
    "model.lora.alpha": (0, False, None),
    "model.lora.dropout": (0, True, 1),
    "backend.rollout_batch_size": (1, True, None),
    "backend.num_threads": (1, True, None),
    "backend.critic.lr": (0, False, None),
    "backend.critic.weight_decay": (0, True, None),
    "backend.critic.grad_clip": (0, False, None),
    "backend.critic.cliprange_value": (0, False, None),
    "backend.critic.loss_coef": (0, False, None),
    "rllm.algorithm.gamma": (0, True, 1),
    "rllm.algorithm.lam": (0, True, 1),
    "rllm.algorithm.kl_loss_coef": (0, True, None),
    "rllm.algorithm.kl_coef": (0, True, None),
    "rllm.algorithm.filter_groups.max_num_gen_batches": (1, True, None),
    "rllm.algorithm.rollout_correction.tis_cap": (1, True, None),
    "backend.rollout.max_model_len": (1, True, None),
    "backend.rollout.gpu_memory_utilization": (0, False, 1),
    "backend.rollout.kv_cache_memory_bytes": (1, True, None),
    "model.num_layers": (1, True, None),
    "model.hidden_size": (1, True, None),
    "model.num_heads": (1, True, None),
    "model.max_positions": (1, True, None),
    "task.train_size": (1, True, None),
    "task.val_size": (0, True, None),
    "task.turns": (1, True, None),
    "task.max_number": (1, True, 99),
    "task.max_turns": (1, True, None),
    "task.turn_cost": (0, True, None),
    "task.min_digits": (1, True, None),
    "task.max_digits": (1, True, None),
}

# Keys only one task reads; any other task would silently ignore them.
FILE_TASK_KEYS = ("train_path", "val_path", "prompt_key", "answer_key", "reward_fn")
DIGIT_KEYS = ("min_digits", "max_digits")
GUESS_KEYS = ("max_number", "max_turns", "turn_cost", "style")
TASK_ONLY_KEYS = {"file": FILE_TASK_KEYS, "reverse": DIGIT_KEYS, "word_addition": DIGIT_KEYS, "guess": GUESS_KEYS}


def _describe(low: float, inclusive: bool, high: float | None) -> str:
    if high is not None:
        return f"in {'[' if inclusive else '('}{low}, {high}]"
    return f"{'>=' if inclusive else '>'} {low}"


def check_bounds(config: Any) -> None:
    """Every key of the bounds table that the config has (and is not None) lies in its range
    (NaN lies in none).

    Raises:
        ConfigError: naming the first key out of range, its value and the range.
    """
    for key, (low, inclusive, high) in _BOUNDS.items():
        value = OmegaConf.select(config, key, default=None)
        if value is None:
            continue
        within = (value >= low if inclusive else value > low) and (high is None or value <= high)
        if not within:  # written so that NaN, which compares False, is out of every range
            raise ConfigError(
                f"{key}={value!r} is out of range; it must be {_describe(low, inclusive, high)} (e.g. {key}={_example(key)})."
            )


def _example(key: str) -> Any:
    """The schema default of ``key`` (a valid value to suggest; ``null`` where the default is
    None, which every such setting takes: automatic, or off)."""
    default = OmegaConf.select(OmegaConf.structured(TrainConfig), key, default=None)
    return default if default is not None else "null"


def check_task_keys(task_config: Any) -> None:
    """Keys of one task (:data:`TASK_ONLY_KEYS`: ``task=file``'s paths, column names and reward
    function; ``task=reverse``'s and ``task=word_addition``'s digit counts; ``task=guess``'s
    game) set to other than their defaults for another task.

    Raises:
        ConfigError: naming the key, the task and the fix.
    """
    defaults = TaskConfig()
    readers: dict[str, list[str]] = {}
    for owner, keys in TASK_ONLY_KEYS.items():
        for key in keys:
            readers.setdefault(key, []).append(owner)
    for key, owners in readers.items():
        value = task_config[key]
        if task_config.name in owners or value == getattr(defaults, key):
            continue
        hint = "to use your own data" if owners == ["file"] else f"for the {' or '.join(owners)} task"
        raise ConfigError(
            f"task.{key}={value!r} is not used by task.name={task_config.name!r} (only task={' or task='.join(owners)} "
            f"reads it); add task={owners[0]} {hint}, or drop task.{key}."
        )


def check_loss_options(config: Any) -> None:
    """``backend.clip_ratio_c`` (dual-clip PPO) set for a loss other than ``ppo``, which would ignore it.

    Raises:
        ConfigError: naming both keys and the fix.
    """
    loss_fn = config.rllm.algorithm.loss_fn or "ppo"
    if config.backend.clip_ratio_c is not None and loss_fn != "ppo":
        raise ConfigError(
            f"backend.clip_ratio_c={config.backend.clip_ratio_c} is dual-clip PPO's cap, and rllm.algorithm.loss_fn={loss_fn!r} "
            "has no such clip: drop backend.clip_ratio_c, or use rllm.algorithm.loss_fn=ppo."
        )


def check_world_size(config: Any, world_size: int) -> None:
    """Settings a run of ``world_size`` processes cannot honour (checked before the process group
    is set up, so every rank raises the same error and none waits for the others).

    Raises:
        DistributedSetupError: more ranks than prompts per step, a ``data.train_batch_size`` not
            divisible by the world size, episode-mode rejection sampling (it accumulates per
            rank, so the ranks would disagree on when a batch is released) or dynamic sampling
            (each rank would draw its own number of batches).
    """
    batch = config.data.train_batch_size
    if world_size > batch:
        raise DistributedSetupError(
            f"{world_size} processes for data.train_batch_size={batch} prompts per step: each rank needs at least one; "
            f"launch at most {batch} processes or raise data.train_batch_size."
        )
    if batch % world_size:
        raise DistributedSetupError(
            f"data.train_batch_size={batch} is not divisible by the world size {world_size}: every rank takes an equal "
            f"share of each step's prompts; use a multiple of {world_size} (e.g. {batch - batch % world_size or world_size})."
        )
    if world_size > 1 and config.rllm.algorithm.filter_groups.enable:
        raise DistributedSetupError(
            "rllm.algorithm.filter_groups.enable=true (dynamic sampling) is not supported on more than one process: each "
            "rank would draw its own number of extra batches. Run it on one process, or disable it."
        )
    if world_size > 1 and config.rllm.rejection_sample.enable:
        raise DistributedSetupError(
            "rllm.rejection_sample.enable=true is not supported on more than one process: it accumulates groups per rank, "
            "so the ranks would release batches at different steps. Run it on one process, or disable it."
        )
    if config.backend.dist_timeout_s <= 0:
        raise DistributedSetupError(f"backend.dist_timeout_s must be > 0 seconds, got {config.backend.dist_timeout_s}.")


def check_run_config(config: Any, world_size: int = 1) -> None:
    """All start-up checks of a composed ``rllm-torch-train`` config.

    Raises:
        ConfigError: a numeric setting out of range, a loss option the loss does not take, or a
            file-task key given to another task.
        DistributedSetupError: see :func:`check_world_size`.
    """
    check_bounds(config)
    check_loss_options(config)
    check_task_keys(config.task)
    check_world_size(config, world_size)

"""The typed schema of a training run's config: every setting declared once, as a field made with
:func:`~rllm_torch.rllm.settings.setting` (its type, default, one-line help, and what the rest
of the package reads from it: whether a resumed run may change it, its bounds or choices). The
``rllm.algorithm`` and ``rllm.stepwise_advantage`` settings rLLM has are :class:`~rllm_torch.rllm.config.AlgorithmConfig`'s
own declarations, taken from it (:func:`~rllm_torch.rllm.settings.schema_fields`), so each is written once for
both; the ``backend`` section is declared in :mod:`~rllm_torch.trainer.backend_schema`.

Read from here: the command line composes over it (a misspelled key or a value of the wrong type
stops the run at start-up; ``rllm_torch/configs`` gives each group's defaults); :func:`typed_run_config`
types a config over it; the start-up checks (:mod:`~rllm_torch.trainer.config_checks`) check each value
against its declaration; a resumed run may change the ``resumable`` ones (:mod:`~.runtime.fingerprint`)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import KL_ESTIMATORS
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.registry import builtin_estimator_options
from rllm_torch.rllm.settings import schema_fields, setting
from rllm_torch.trainer.backend_schema import COMPUTE_DTYPES, PARALLELISMS, ROLLOUT_ENGINES, BackendConfig
from rllm_torch.trainer.resolvers import register_resolvers
from rllm_torch.trainer.rllm_sections import (
    GROUP_SIGNAL_METRICS,
    STALE_GROUP_POLICIES,
    AsyncTrainingSection,
    EpisodeLoggingSection,
    RejectionSampleSection,
    StepwiseAdvantageSection,
    WorkflowSection,
)

__all__ = [
    "TrainConfig",
    "RllmConfig",
    "ModelConfig",
    "TaskConfig",
    "BackendConfig",
    "DataConfig",
    "CompactFilteringFlags",
    "typed_run_config",
    "run_schema",
    "schema_of",
    "backend_section",
    "prompts_per_step",
    "STALE_GROUP_POLICIES",
    "ARCHITECTURES",
    "COMPUTE_DTYPES",
    "PARALLELISMS",
    "ROLLOUT_ENGINES",
    "GROUP_SIGNAL_METRICS",
    "TASK_ONLY_KEYS",
]

ARCHITECTURES = ("gpt2", "llama")  # model.arch: a model built from scratch


@dataclass
class CompactFilteringFlags:
    """rLLM's ``rllm.compact_filtering`` switches: the schema's section, which
    :class:`~rllm_torch.trainer.pipeline.compact_filtering.CompactFilteringConfig` extends with
    ``mask_reasons`` and the checks."""

    enable: bool = setting(False, "leave out episodes that ended for the reasons switched on below")
    mask_max_prompt_length_exceeded: bool = setting(False, "an episode whose prompt ran past the context")
    mask_max_response_length_exceeded: bool = setting(False, "an episode cut at rllm.rollout.max_new_tokens")
    mask_env_done: bool = setting(False, "an episode the environment ended")
    mask_max_turns_exceeded: bool = setting(False, "an episode that ran out of turns")
    mask_timeout: bool = setting(False, "an episode whose reward timed out")
    mask_unknown: bool = setting(False, "an episode without a termination reason")
    mask_error: bool = setting(False, "an episode whose workflow failed")
    mask_verifier_timeout: bool = setting(False, "rLLM terminal-rl's sandbox reason: no episode here ends for it")
    mask_grading_error: bool = setting(False, "rLLM terminal-rl's sandbox reason: no episode here ends for it")
    mask_sandbox_error: bool = setting(False, "rLLM terminal-rl's sandbox reason: no episode here ends for it")
    mask_agent_setup_timeout: bool = setting(False, "rLLM terminal-rl's sandbox reason: no episode here ends for it")
    mask_env_start_timeout: bool = setting(False, "rLLM terminal-rl's sandbox reason: no episode here ends for it")
    mask_model_error: bool = setting(False, "rLLM terminal-rl's agent-flow reason: no episode here ends for it")


@dataclass
class CompactFilteringSection(CompactFilteringFlags):
    """The run config's ``rllm.compact_filtering``: with ``enable``, the reasons rLLM's run config
    masks (``rllm/trainer/config/rllm/base.yaml``: prompt or response too long, out of turns, timed
    out, failed) are masked here too; rLLM's dataclass, as ours, masks none by default."""

    mask_max_prompt_length_exceeded: bool = setting(True, "an episode whose prompt ran past the context")
    mask_max_response_length_exceeded: bool = setting(True, "an episode cut at rllm.rollout.max_new_tokens")
    mask_max_turns_exceeded: bool = setting(True, "an episode that ran out of turns")
    mask_timeout: bool = setting(True, "an episode whose reward timed out")
    mask_error: bool = setting(True, "an episode whose workflow failed")


@dataclass
class FilterGroupsSection:
    enable: bool = setting(
        False, "DAPO's dynamic sampling: draw batches until every step has data.train_batch_size prompts with signal"
    )
    metric: str = setting(
        "reward",
        "reward (raw rewards not all equal) | is_correct (not all right or all wrong)",
        choices=GROUP_SIGNAL_METRICS,
        note="verl's 'acc' is 'is_correct'",
    )
    max_num_gen_batches: int = setting(
        10, "batches a step may draw, the first included; reached: train on what was found, warn", minimum=1
    )


_ALGORITHM_OPTIONS = schema_fields(AlgorithmConfig, "rllm.algorithm", {"estimator_options": builtin_estimator_options})


@dataclass
class AlgorithmSection(make_dataclass("AlgorithmOptions", _ALGORITHM_OPTIONS)):
    loss_agg_horizon: int | None = setting(
        None, "H of seq-mean-token-sum-norm; None: rllm.rollout.max_new_tokens", minimum=1
    )
    use_kl_loss: bool = setting(False, "a KL(policy || reference) term in the loss (DeepSeekMath's GRPO)")
    kl_loss_coef: float = setting(0.001, "the KL term's coefficient", minimum=0)
    kl_loss_type: str = setting("low_var_kl", "kl (k1) | abs | mse (k2) | low_var_kl (k3)", choices=KL_ESTIMATORS)
    use_bias_correction_kl: bool = setting(
        False, "the KL loss term times pi / pi_old, for tokens sampled from pi_old (TRL's; DeepSeek-V3.2)"
    )
    use_kl_in_reward: bool = setting(False, "subtract kl_coef * KL per token from the rewards (RLHF's penalty)")
    kl_penalty: str = setting(
        "kl", "the KL estimator in the reward: kl (k1) | abs | mse (k2) | low_var_kl (k3)", choices=KL_ESTIMATORS
    )
    kl_coef: float = setting(0.001, "the KL penalty's coefficient", minimum=0)
    filter_groups: FilterGroupsSection = field(default_factory=FilterGroupsSection)


@dataclass
class RolloutSection:
    n: int = setting(8, "rollouts per training prompt", minimum=1)
    n_val: int = setting(4, "rollouts per validation prompt (pass@1 and pass@n_val)", minimum=1)
    temperature: float = setting(1.0, "sampling temperature (0: greedy)", minimum=0)
    top_p: float = setting(1.0, "nucleus sampling's top-p", minimum=0, maximum=1, exclusive_minimum=True)
    val_temperature: float = setting(1.0, "validation's temperature", minimum=0)
    val_top_p: float = setting(1.0, "validation's top-p", minimum=0, maximum=1, exclusive_minimum=True)
    max_new_tokens: int | None = setting(
        None,
        "the most tokens of a response; None: the task's own, else twice the longest answer's tokens (the start-up "
        "summary says which)",
        minimum=1,
    )


@dataclass
class TrainerSection:
    total_epochs: int = setting(4, "passes over the training data", minimum=1, resumable=True)
    total_batches: int | None = setting(
        None, "stop after this many steps (None: run every epoch)", minimum=1, resumable=True
    )
    test_freq: int = setting(32, "validate every test_freq steps and at the end (<= 0: neither; rLLM)", resumable=True)
    val_before_train: bool = setting(True, "validate before the first step", resumable=True)
    val_only: bool = setting(False, "validate the weights and train nothing", resumable=True)
    save_freq: int = setting(
        32,
        "resumable checkpoint every save_freq steps, and one at the end (<= 0: only at the end)",
        resumable=True,
    )
    max_checkpoints_to_keep: int | None = setting(
        3, "older step checkpoints are removed (None or <= 0: keep all)", resumable=True
    )
    resume_mode: str = setting(
        "auto",
        "auto: newest complete checkpoint of the run dir | disable | resume_path | a checkpoint dir",
        resumable=True,
    )
    resume_from_path: str | None = setting(
        None, "the checkpoint directory of resume_mode=resume_path (verl's spelling)", resumable=True
    )
    log_table_every: int = setting(
        32, "the console logger prints a metrics table every this many steps (<= 0: never)", resumable=True
    )
    project_name: str = setting("rllm_torch", "the run directory's parent", resumable=True)
    experiment_name: str = setting(
        "${rllm_torch_default_experiment:${task.name},${task.train_path},${task.dataset}}",
        "the run's name (default: the task's, see resolvers.default_experiment_name)",
        resumable=True,
    )
    logger: list[str] = setting(
        help="where metrics go: console, jsonl, tensorboard, wandb (offline)",
        factory=lambda: ["console", "jsonl"],
        resumable=True,
    )
    default_local_dir: str | None = setting(
        None, "the run directory (set to Hydra's output dir by the CLI)", resumable=True
    )


@dataclass
class RllmConfig:
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    stepwise_advantage: StepwiseAdvantageSection = field(default_factory=StepwiseAdvantageSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    workflow: WorkflowSection = field(default_factory=WorkflowSection)
    rejection_sample: RejectionSampleSection = field(default_factory=RejectionSampleSection)
    compact_filtering: CompactFilteringSection = field(default_factory=CompactFilteringSection)
    episode_logging: EpisodeLoggingSection = field(default_factory=EpisodeLoggingSection)
    async_training: AsyncTrainingSection = field(default_factory=AsyncTrainingSection)


@dataclass
class LoraSection:
    r: int = setting(0, "LoRA rank (peft; pip install rllm_torch[lora]); 0: no LoRA, the whole model trains", minimum=0)
    alpha: int = setting(16, "scaling alpha / r of the adapters' update", minimum=0, exclusive_minimum=True)
    dropout: float = setting(0.0, "the adapters' dropout", minimum=0, maximum=1)
    target_modules: list[str] = setting(help="module names, or all-linear", factory=lambda: ["all-linear"])


@dataclass
class ModelConfig:
    path: str | None = setting(
        None, "a local save_pretrained directory or a .gguf file; None: build from the fields below"
    )
    name: str | None = setting(None, "rLLM's name of model.path (the two must agree)")
    gguf_cache_dir: str = setting(
        "~/.cache/rllm_torch/gguf",
        "where a .gguf model.path is converted once into a plain directory",
        resumable=True,  # a cache: the same file converts to the same weights wherever it lives
    )
    ref_path: str | None = setting(
        None, "the reference policy of the KL terms; None: a frozen copy of the initial policy"
    )
    pad_token: str | None = setting(None, "the pad token of a model.path tokenizer that has none (e.g. its eos token)")
    arch: str = setting("gpt2", "gpt2 | llama", choices=ARCHITECTURES)
    num_layers: int = setting(2, "layers of a model built from scratch", minimum=1)
    hidden_size: int = setting(64, "its width", minimum=1)
    num_heads: int = setting(4, "its attention heads", minimum=1)
    max_positions: int = setting(32, "its context, in tokens", minimum=1)
    lora: LoraSection = field(default_factory=LoraSection)


# Keys only some tasks read; any other task would silently ignore them.
_FILE_TASK_KEYS = ("train_path", "val_path", "prompt_key", "answer_key", "reward_fn")
_DIGIT_KEYS = ("min_digits", "max_digits")
_GUESS_KEYS = ("max_number", "max_turns", "turn_cost", "style")
TASK_ONLY_KEYS = {
    "file": _FILE_TASK_KEYS,
    "reverse": _DIGIT_KEYS,
    "word_addition": _DIGIT_KEYS,
    "guess": (*_GUESS_KEYS, "env_latency_ms"),
    "chain": ("env_latency_ms",),
}


@dataclass
class TaskConfig:
    name: str = setting(
        "arithmetic", "arithmetic | chain | guess | distill | reverse | word_addition | file | reasoning_gym"
    )
    seed: int = setting(0, "the seed of the generated tasks (validation: seed + 1)")
    train_size: int = setting(4096, "training tasks", minimum=1)
    val_size: int = setting(64, "validation tasks", minimum=0)
    max_sum: int = setting(9, "arithmetic: the largest sum")
    turns: int = setting(2, "chain: turns per episode", minimum=1)
    max_number: int = setting(9, "guess: the secret is in 0..max_number", minimum=1, maximum=99)
    max_turns: int = setting(4, "guess: the most guesses per episode", minimum=1)
    turn_cost: float = setting(0.1, "guess: the reward of each wrong guess before the last turn (negated)", minimum=0)
    env_latency_ms: list[float] = setting(
        help="chain, guess: each environment reply waits uniform [low, high] ms (a tool call's latency)",
        factory=lambda: [0.0, 0.0],
        resumable=True,
    )
    style: str = setting("symbols", "guess: symbols (the tiny model: '?5<') | words (a chat model)")
    min_digits: int = setting(6, "reverse: shortest digit string", minimum=1)
    max_digits: int = setting(6, "reverse: longest digit string", minimum=1)
    mix_rl: bool = setting(False, "distill: also an RL 'solver' role in every episode")
    dataset: str = setting("leg_counting", "reasoning_gym: the dataset name")
    train_path: str | None = setting(None, "file: the training JSONL or Parquet file")
    val_path: str | None = setting(None, "file: the validation file")
    prompt_key: str = setting("prompt", "file: the prompt's column")
    answer_key: str = setting("answer", "file: the answer's column")
    reward_fn: str = setting("exact_match", "file: the reward, or 'package.module:function'")
    apply_chat_template: bool = setting(
        False, "format each prompt as a user message with the tokenizer's chat template"
    )


def _val_batch_size(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise ValueError(f"{value!r} is not a batch size: give one of at least 1, or -1 for the whole validation set.")
    return value


@dataclass
class DataConfig:
    train_batch_size: int = setting(64, "prompts per training step", minimum=1)
    shuffle: bool = setting(True, "shuffle the training data each epoch")
    val_batch_size: int | None = setting(
        None,
        "validation prompts per sampling call (rLLM's; -1: the whole set at once); null: data.train_batch_size",
        check=_val_batch_size,
        resumable=True,  # how validation is batched: the same episodes' settings
    )
    max_prompt_length: int | None = setting(
        None,
        "the longest prompt in tokens: a longer one stops the run at start-up (rLLM's); null: the model's context",
        minimum=1,
    )
    max_response_length: int | None = setting(
        None, "rLLM's name of rllm.rollout.max_new_tokens (the two must agree)", minimum=1
    )


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rllm: RllmConfig = field(default_factory=RllmConfig)
    seed: int = setting(0, "python, numpy and torch's global generators (backend.seed: the model and sampler)")
    imports: list[str] = setting(help="modules imported at start-up, e.g. ones registering estimators", factory=list)


def prompts_per_step(config: Any) -> int:
    """Prompts a training step takes: ``rllm.async_training.mini_batch_size`` in async mode when
    set, else ``data.train_batch_size`` (over every rank)."""
    async_training = config.rllm.async_training
    if async_training.enable and async_training.mini_batch_size is not None:
        return int(async_training.mini_batch_size)
    return int(config.data.train_batch_size)


@cache
def run_schema(settings: type = BackendConfig) -> type:
    """The run's schema with its ``backend`` section typed by ``settings``, a backend's settings
    dataclass (:mod:`~rllm_torch.trainer.backend_registry`): :class:`TrainConfig` itself for the
    torch backend's :class:`BackendConfig`, else a subclass of it whose one new declaration is
    that section (the same class for the same ``settings``)."""
    if settings is BackendConfig:
        return TrainConfig
    schema = make_dataclass(
        f"TrainConfig_{settings.__name__}",
        [("backend", settings, field(default_factory=settings))],
        bases=(TrainConfig,),
    )
    schema.__module__ = __name__
    _SECTIONS[schema] = settings
    return schema


_SECTIONS: dict[type, type] = {}  # each run_schema's backend settings


def backend_section(schema: type) -> type:
    """The settings dataclass that types ``schema``'s ``backend`` section (:func:`run_schema`)."""
    return _SECTIONS.get(schema, BackendConfig)


def schema_of(config: Any) -> type:
    """The schema ``config`` is typed over (:class:`TrainConfig` or a :func:`run_schema` of it);
    :class:`TrainConfig` for an untyped config."""
    kind = OmegaConf.get_type(config) if isinstance(config, DictConfig) else None
    return kind if isinstance(kind, type) and issubclass(kind, TrainConfig) else TrainConfig


def typed_run_config(config: Any = None, *, settings: type | None = None) -> DictConfig:
    """``config`` over the run's schema: every setting present with the schema's type and
    default (a config composed over the schema is returned as it is). A plain dict or an untyped
    ``DictConfig`` (e.g. ``OmegaConf.create``) may give any subset of the settings.

    Args:
        config: the run config.
        settings: the backend's settings dataclass, which types the ``backend`` section
            (:func:`run_schema`); None: the config's own schema, else the torch backend's.

    Raises:
        ConfigError: a key the schema does not know, or a value of the wrong type (OmegaConf's
            message, which names the key); a config typed for another backend's settings.
    """
    schema = None if settings is None else run_schema(settings)
    kind = OmegaConf.get_type(config) if isinstance(config, DictConfig) else None
    if isinstance(kind, type) and issubclass(kind, TrainConfig):  # typed already
        if schema is None or kind is schema:
            return config
        section = OmegaConf.get_type(config, "backend").__name__
        raise ConfigError(
            f"the run config's backend section is typed {section} and this backend's settings are {settings.__name__}: "
            f"type the config for it (typed_run_config(config, settings={settings.__name__})), or choose the backend with "
            "backend.name=... on the command line (the section is typed before the config files compose)."
        )
    try:
        return OmegaConf.merge(OmegaConf.structured(schema or TrainConfig), config if config is not None else {})
    except OmegaConfBaseException as exc:
        raise ConfigError(f"the run config does not fit the schema (rllm_torch/trainer/schema.py): {exc}") from exc


register_resolvers()  # OmegaConf.structured(TrainConfig) resolves without Hydra too

"""What ``rllm-torch-train`` says about itself: ``--version`` (the program and the libraries it runs
on), ``--help`` (how a run is started, the shipped experiments and config groups, the most used
settings with their defaults and help, read from the settings' declarations), and the one line
for a ``--flag`` in the argparse style, naming the ``key=value`` it meant (``--lr 0.01`` ->
``backend.lr=0.01``). Hydra's own flags keep their meaning (``--cfg job``, ``--hydra-help``, ...)."""

from __future__ import annotations

import difflib
import importlib.metadata
import platform
import textwrap

from omegaconf import OmegaConf

from rllm_torch.core.errors import ConfigError

__all__ = ["MOST_USED", "FLAG_ALIASES", "version_text", "help_text", "check_flags"]

PROGRAM = "rllm-torch-train"

#: The settings ``--help`` lists, in this order (their defaults and help come from the schema).
MOST_USED = (
    "rllm.algorithm.adv_estimator",
    "rllm.rollout.n",
    "rllm.rollout.max_new_tokens",
    "data.train_batch_size",
    "backend.lr",
    "rllm.trainer.total_epochs",
    "rllm.trainer.total_batches",
    "rllm.trainer.experiment_name",
    "task.train_path",
    "task.val_path",
    "task.reward_fn",
    "model.path",
    "backend.device",
    "rllm.trainer.test_freq",
    "rllm.trainer.save_freq",
    "seed",
)

#: argparse-style names (TRL's and Hugging Face's among them) and the key each means here.
FLAG_ALIASES = {
    "lr": "backend.lr",
    "learning_rate": "backend.lr",
    "epochs": "rllm.trainer.total_epochs",
    "num_epochs": "rllm.trainer.total_epochs",
    "num_train_epochs": "rllm.trainer.total_epochs",
    "steps": "rllm.trainer.total_batches",
    "max_steps": "rllm.trainer.total_batches",
    "total_steps": "rllm.trainer.total_batches",
    "batch_size": "data.train_batch_size",
    "per_device_train_batch_size": "data.train_batch_size",
    "num_generations": "rllm.rollout.n",
    "group_size": "rllm.rollout.n",
    "max_completion_length": "rllm.rollout.max_new_tokens",
    "max_tokens": "rllm.rollout.max_new_tokens",
    "estimator": "rllm.algorithm.adv_estimator",
    "model": "model.path",
    "model_name_or_path": "model.path",
    "output_dir": "hydra.run.dir",
    "out_dir": "hydra.run.dir",
    "beta": "rllm.algorithm.kl_loss_coef",
}


def version_text() -> str:
    """``rllm-torch-train 0.1.0 (torch 2.13.0+cpu, transformers 5.25.0, hydra-core 1.3.8, Python 3.11.9)``."""
    versions = []
    for name in ("rllm_torch", "torch", "transformers", "hydra-core"):
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    own, rest = versions[0][1], ", ".join(f"{n} {v}" for n, v in versions[1:])
    return f"{PROGRAM} {own} ({rest}, Python {platform.python_version()})"


def _settings() -> dict[str, tuple[object, str]]:
    """``{key: (default, help)}`` of every setting, from the declarations."""
    from rllm_torch.rllm.settings import walk
    from rllm_torch.trainer.schema import TrainConfig

    defaults = OmegaConf.structured(TrainConfig)
    out = {}
    for key, declaration, _ in walk(TrainConfig):
        value = OmegaConf.select(defaults, key, default=None, throw_on_resolution_failure=False)
        out[key] = ("null" if value is None else value, declaration.help if declaration is not None else "")
    return out


def help_text(experiments: list[str], groups: dict[str, list[str]]) -> str:
    """The ``--help`` text.

    Args:
        experiments: the shipped experiments (``--config-name``).
        groups: each config group and its options (``model: smollm2, tiny, tiny_llama``).
    """
    settings = _settings()
    width = max(len(f"{key}={settings[key][0]}") for key in MOST_USED)
    lines = [
        f"usage: {PROGRAM} [--config-name EXPERIMENT] [group=option ...] [key=value ...]",
        "",
        "RL training with rLLM's UnifiedTrainer and advantage estimators on the embedded PyTorch backend. With no",
        "arguments: GRPO on single-digit additions with a tiny model built from scratch (about a minute on a CPU).",
        "The run directory is outputs/<project>/<experiment> (hydra.run.dir); the same command again resumes the",
        "run from its newest checkpoint, and one run at a time may use a directory.",
        "",
        *textwrap.wrap("experiments (--config-name NAME): " + ", ".join(experiments), 110, subsequent_indent="  "),
        "config groups (group=option):",
        *(f"  {group}: {', '.join(options)}" for group, options in sorted(groups.items())),
        "",
        "most used settings (key=value, shown with its default):",
        *(f"  {f'{key}={settings[key][0]}':<{width}}  {settings[key][1]}" for key in MOST_USED),
        "",
        "every setting, its default and help: docs/settings.md; the composed config: rllm-torch-train --cfg job;",
        "Hydra's own flags: rllm-torch-train --hydra-help.",
        "exit status: 0 trained (or already complete); 2 a setting, data, checkpoint or run-directory error (one",
        "line); 130 Ctrl-C, 143 SIGTERM (each after the trained weights' checkpoint; a second Ctrl-C: at once).",
    ]
    return "\n".join(lines)


def _meant_key(name: str, keys: list[str]) -> str | None:
    """The key a ``--name`` flag most likely meant: an alias, a key ending in the name, or the
    nearest key ending."""
    name = name.lower().replace("-", "_")
    if name in FLAG_ALIASES:
        return FLAG_ALIASES[name]
    if name in keys:
        return name
    ending = [key for key in keys if key.rsplit(".", 1)[-1] == name]
    if ending:
        return ending[0]
    leaves = {key.rsplit(".", 1)[-1]: key for key in reversed(keys)}
    close = difflib.get_close_matches(name, list(leaves), n=1, cutoff=0.75)
    return leaves[close[0]] if close else None


def check_flags(argv: list[str], hydra_flags: dict[str, bool]) -> None:
    """Refuse an argparse-style ``--flag`` that is not one of Hydra's.

    Args:
        argv: the command line.
        hydra_flags: Hydra's option strings, each with whether it takes a value (``--config-name``: True).

    Raises:
        ConfigError: naming the flag and the ``key=value`` it likely meant (``--lr 0.01`` ->
            ``backend.lr=0.01``), or ``--help`` when no key is near.
    """
    keys = list(_settings())
    skip = False
    for position, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if not arg.startswith("-") or arg in ("-", "--"):
            continue
        flag, equals, value = arg.partition("=")
        if flag in hydra_flags:
            skip = hydra_flags[flag] and not equals
            continue
        following = argv[position + 1] if position + 1 < len(argv) else None
        if not equals and following is not None and "=" not in following and not following.startswith("-"):
            value = following
        shown = arg if equals or value == "" else f"{arg} {value}"
        key = _meant_key(flag.lstrip("-"), keys)
        meant = f"did you mean {key}={value or '...'}?" if key else f"{PROGRAM} --help lists the most used keys."
        raise ConfigError(
            f"`{shown}`: {PROGRAM} takes settings as key=value, not as --flags; {meant} (every setting: docs/settings.md)"
        )

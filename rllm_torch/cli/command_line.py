"""The command line of ``rllm-torch-train`` before and around Hydra: every key a run is given must
be one the schema (:mod:`~rllm_torch.trainer.schema`) knows, whichever way it came (``key=v``,
``+key=v``, a YAML file), with the nearest known key suggested; an experiment that does not exist
lists the ones that do; the package's own errors print as one block, without a traceback."""

from __future__ import annotations

import difflib
import importlib.resources
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from rllm_torch.cli.backend_choice import chosen_settings
from rllm_torch.cli.run_directory import check_run_directory, remove_empty_run_dir, resume_point
from rllm_torch.cli.usage import check_flags
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.backend_schema import BackendConfig
from rllm_torch.trainer.resolvers import register_resolvers
from rllm_torch.trainer.rllm_settings import backend_key_places, key_hint
from rllm_torch.trainer.schema import TrainConfig, backend_section, run_schema, schema_of

__all__ = [
    "register_configs",
    "known_keys",
    "experiment_names",
    "config_groups",
    "check_command_line",
    "check_known_keys",
    "remove_empty_run_dir",
    "resume_point",
]

CONFIG_PACKAGE = "rllm_torch.configs"
#: The exit status of ``rllm-torch-train`` after one of the package's errors (printed as one block).


def register_configs(settings: type = BackendConfig) -> None:
    """Register the run's schema in Hydra's ConfigStore as ``train_schema`` (the first entry of
    ``configs/train.yaml``'s defaults list, so every group merges into typed fields): :class:`~rllm_torch.trainer.schema.TrainConfig`
    with its ``backend`` section typed by the backend's ``settings`` (:func:`~rllm_torch.trainer.schema.run_schema`;
    the torch backend's by default), the places of rLLM's backend keys as ``rllm_backend_keys``
    (:func:`~rllm_torch.trainer.rllm_settings.backend_key_places`, first in the compatibility package's
    ``unified`` and ``agent_ppo_trainer``), and the resolver the configs use: ``rllm_torch_default_experiment``."""
    schema = OmegaConf.structured(run_schema(settings))
    for key in ("rllm.algorithm.estimator_map", "rllm.algorithm.loss_fn_map"):
        OmegaConf.set_struct(OmegaConf.select(schema, key), False)  # a map: `key={role: value}` adds its keys
    ConfigStore.instance().store(name="train_schema", node=schema)
    # the compatibility package's configs start from these: a ported script's rLLM backend key gets the hint
    ConfigStore.instance().store(name="rllm_backend_keys", node=backend_key_places())
    register_resolvers()


def _walk(node: Any, prefix: str, out: set[str], open_prefixes: set[str] | None) -> None:
    """Every dotted key under ``node`` into ``out``. With ``open_prefixes`` (walking the schema),
    a dict-typed field is recorded there and not walked: any key may go below it."""
    for key in node:
        path = f"{prefix}{key}"
        out.add(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if open_prefixes is not None and OmegaConf.get_type(child) is dict:  # e.g. estimator_map
                open_prefixes.add(path)
            else:
                _walk(child, f"{path}.", out, open_prefixes)


def known_keys(schema: type = TrainConfig) -> tuple[set[str], set[str]]:
    """``(keys, open_prefixes)``: every dotted key of ``schema`` (:class:`TrainConfig`, or a
    backend's :func:`~rllm_torch.trainer.schema.run_schema`), and the dict-typed ones under which
    any key is allowed (e.g. ``rllm.algorithm.estimator_map``)."""
    keys: set[str] = set()
    open_prefixes: set[str] = set()
    _walk(OmegaConf.structured(schema), "", keys, open_prefixes)
    return keys, open_prefixes


def _is_known(key: str, keys: set[str], open_prefixes: set[str]) -> bool:
    return key in keys or any(key.startswith(f"{prefix}.") for prefix in open_prefixes)


def _unknown_key_error(key: str, keys: set[str], how: str, schema: type = TrainConfig) -> ConfigError:
    close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
    hint = f"; did you mean `{close[0]}`?" if close else ""
    if rllm_hint := key_hint(key):  # a key of rLLM's verl / tinker backends: the one that does the same here
        hint = rllm_hint
    section = backend_section(schema)
    where = "rllm_torch/trainer/schema.py"
    if section is not BackendConfig:  # a backend's own settings type the backend section
        where += f"; its backend section: {section.__module__}.{section.__qualname__}"
    return ConfigError(
        f"`{key}` ({how}) is not a setting of rllm-torch-train{hint} A run reads only the keys of its schema "
        f"({where}), so an unknown one would be ignored: `+` does not add a setting."
    )


def experiment_names() -> list[str]:
    """The example experiments shipped in ``configs/`` (names for ``--config-name``)."""
    root = importlib.resources.files(CONFIG_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def _config_groups() -> set[str]:
    root = importlib.resources.files(CONFIG_PACKAGE)
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")}


def _group_options(group: str) -> list[str]:
    return sorted(
        p.name[: -len(".yaml")]
        for p in importlib.resources.files(CONFIG_PACKAGE).joinpath(group).iterdir()
        if p.name.endswith(".yaml")
    )


def config_groups() -> dict[str, list[str]]:
    """Each shipped config group and its options (``{"model": ["smollm2", "tiny", "tiny_llama"], ...}``)."""
    return {group: _group_options(group) for group in sorted(_config_groups())}


def check_command_line(argv: list[str]) -> None:
    """Check ``rllm-torch-train``'s arguments before Hydra composes them. First the backend:
    ``imports=`` imported and ``backend.name=`` resolved, its settings registered as the type of
    the ``backend`` section of the schema Hydra composes over (:mod:`~rllm_torch.cli.backend_choice`).

    Raises:
        UnknownBackendError, BackendRegistrationError: ``backend.name`` selects no backend.
        ConfigError: ``--config-name`` names no shipped experiment (the message lists them); an
            override names a key the schema does not know (``key=v`` or ``+key=v``; the message
            suggests the nearest known key), gives it a value of another type
            (``rllm.rollout.n=abc``), or chooses a config-group option that is not shipped
            (``model=tiny_gpt``; the message lists those that are). Keys under ``hydra.`` are
            Hydra's to check. With ``--config-path``/``--config-dir`` (your own configs) only
            the keys and their types are checked. ``hydra.run.dir`` cannot be made or written
            (:func:`check_run_directory`). A ``--flag`` that is not one of Hydra's names
            the ``key=value`` it likely meant (:func:`~rllm_torch.cli.usage.check_flags`).
    """
    from hydra._internal.utils import get_args_parser  # Hydra's own command-line grammar
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = get_args_parser()
    check_flags(argv, {flag: action.nargs != 0 for action in parser._actions for flag in action.option_strings})
    try:
        args, _ = parser.parse_known_args(argv)
    except SystemExit:  # argparse's own usage error: Hydra reports it itself
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException as exc:  # Hydra's grammar: its lexer's exception and exit 1, else
        raise _parse_error(args.overrides, exc) from exc
    own_configs = bool(args.config_path or args.config_dir)
    if args.config_name and not own_configs and args.config_name not in experiment_names():
        raise ConfigError(
            f"--config-name {args.config_name}: no such experiment; the shipped ones are {', '.join(experiment_names())} "
            "(configs/ in the repository), or give your own with --config-dir."
        )
    settings = chosen_settings(overrides)  # imports=, then backend.name=: the backend section's type
    register_configs(settings)
    schema_cls = run_schema(settings)
    keys, open_prefixes = known_keys(schema_cls)
    groups = _config_groups()
    schema = OmegaConf.structured(schema_cls)
    for override in overrides:
        key = override.key_or_group
        if override.is_delete() or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if "." not in key and "/" not in key and (key in groups or own_configs):
            if not own_configs:  # a config-group choice, e.g. model=tiny_llama
                _check_group_option(key, override)
            continue
        if not _is_known(key, keys, open_prefixes):
            how = "added with +" if override.is_add() or override.is_force_add() else "given on the command line"
            raise _unknown_key_error(key, keys, how, schema_cls)
        if not override.is_sweep_override():
            _check_type(schema, key, override)
    if not own_configs and not args.multirun:
        _check_composes(
            args.config_name or "train", [o for o in overrides if not o.key_or_group.startswith("hydra")], settings
        )
    for override in overrides:  # Hydra makes hydra.run.dir before the run starts: its own traceback
        if override.key_or_group == "hydra.run.dir" and isinstance(override.value(), str):
            check_run_directory(override.value(), "hydra.run.dir")


def _check_composes(config_name: str, overrides: list[Any], settings: type = BackendConfig) -> None:
    """Hydra composes the shipped ``config_name`` with ``overrides`` (what it would otherwise refuse
    in its own words, over several lines and with exit status 1: a comma list without
    ``--multirun``, ``~key`` of a setting the schema needs, an option Hydra cannot merge)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    texts = [o.input_line for o in overrides]
    register_configs(settings)  # the schema the shipped configs name first (train_schema), whoever calls this
    try:
        with initialize_config_module(config_module=CONFIG_PACKAGE, version_base=None):
            compose(config_name=config_name, overrides=texts)
    except (HydraException, OmegaConfBaseException) as exc:
        detail = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
        reason = " ".join(str(exc).split()) + (f" ({str(detail).splitlines()[0]})" if detail is not None else "")
        raise ConfigError(f"Hydra cannot compose the config with {' '.join(texts)}: {reason}") from exc


def _parse_error(overrides: list[str], exc: Exception) -> ConfigError:
    """Hydra's parse error of the first override it cannot read, as one line naming it and the form
    an override takes (a space after ``=`` splits one override into two arguments)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    bad, before = overrides[-1] if overrides else "", ""
    for index, text in enumerate(overrides):
        try:
            parser.parse_override(text)
        except Exception:  # noqa: BLE001 - the first one Hydra's grammar refuses
            bad, before = text, overrides[index - 1] if index else ""
            break
    split = (
        f" (a space after `{before}` made `{bad}` an argument of its own: write `{before}{bad}`)"
        if before.endswith("=")
        else ""
    )
    reason = " ".join(str(exc).split())
    return ConfigError(
        f"cannot read the override `{bad}`{split}: {reason}. Each override is key=value with no space around `=` "
        "(quote a value with spaces: 'key=\"a b\"'); rllm-torch-train --help lists the settings."
    )


def _check_group_option(group: str, override: Any) -> None:
    options = _group_options(group)
    value = override.value()
    if isinstance(value, str) and value not in options:
        raise ConfigError(
            f"{group}={value}: no such {group} config; the shipped ones are {', '.join(options)} "
            f"(configs/{group}/ in the repository), or set its keys one by one ({group}.<key>=...)."
        )


def _check_type(schema: DictConfig, key: str, override: Any) -> None:
    """The override's value fits the schema's type of ``key`` (Hydra would refuse it later, in its
    own words and with exit status 1)."""
    default = OmegaConf.select(schema, key, default=None)
    try:
        OmegaConf.update(schema, key, override.value(), merge=True)
    except ValidationError as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(
            f"{key}={override.get_value_element_as_str()}: {reason} (default {default}); give a value of that type."
        ) from exc


def check_known_keys(config: DictConfig) -> None:
    """Every key of a composed config is one the schema knows (keys a YAML file or ``+`` put there).

    Raises:
        ConfigError: naming the first unknown key and the nearest known one.
    """
    schema = schema_of(config)
    keys, open_prefixes = known_keys(schema)
    found: set[str] = set()
    _walk(config, "", found, None)
    unknown = [k for k in sorted(found) if k.split(".")[0] != "hydra" and not _is_known(k, keys, open_prefixes)]
    leaves = [k for k in unknown if not any(other.startswith(f"{k}.") for other in unknown)]
    if leaves:  # name the whole key (rllm.rolout.n), not its first unknown node
        raise _unknown_key_error(leaves[0], keys, "in the composed config", schema)

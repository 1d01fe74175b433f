"""One declaration per setting: a dataclass field made with :func:`setting`, which carries its
default, a one-line help and what the rest of the package reads from it (:class:`Setting`):
where a run config sets it, whether a resumed run may change it, the values it may take, how it
is checked, and whether every estimator call gets it.

:class:`~rllm_torch.rllm.config.AlgorithmConfig` declares rLLM's algorithm options this way, and
the trainer's typed run config (``rllm_torch.trainer.schema``) declares every other setting, and
builds its ``rllm.algorithm`` and ``rllm.stepwise_advantage`` sections from ``AlgorithmConfig``'s
declarations (:func:`schema_fields`). Read from the declarations: the typed config's fields and
defaults, ``AlgorithmConfig.from_config`` and its checks, the estimators' run-wide options
(``rllm_torch.rllm.registry.RUN_OPTIONS``), the start-up checks of a run config
(:func:`check_value`) and which settings a resumed run may change.

Examples:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Section:
    ...     n: int = setting(8, "rollouts per prompt", minimum=1)
    >>> check_value(0, declared(Section)["n"], "rllm.rollout.n")
    Traceback (most recent call last):
    ...
    rllm_torch.core.errors.ConfigError: rllm.rollout.n=0 is out of range; it must be >= 1.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass
from typing import Any

from rllm_torch.core.errors import ConfigError

__all__ = [
    "Setting",
    "setting",
    "declared",
    "check_value",
    "schema_fields",
    "default_of",
    "walk",
    "UNSET",
    "schema_section",
    "with_schema_defaults",
]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # "not given" where None is a value


@dataclass(frozen=True)
class Setting:
    """What a setting's declaration says beyond its type and default.

    Attributes:
        help: one line: what it does (the start-up summary, the docs and ``--help`` read it).
        key: the run config's dotted key (``AlgorithmConfig``'s fields; a schema field's key is
            its place in the schema); ``aliases``: other keys read for it (rLLM's older places).
        resumable: a resumed run may change it (it applies from the resumed step on); otherwise
            it is in the checkpoint's fingerprint.
        choices: the values it may take (``None`` is always allowed for an optional setting);
            ``note``: a hint added to the error of a value outside them.
        minimum, maximum: bounds (``exclusive_minimum``: the minimum itself is out); ``None``
            values are not checked.
        finite: the value must be a finite number.
        check: ``check(value) -> value`` raising ``ValueError`` / ``TypeError`` with its own
            message (the run-wide estimator options' checks, shared with ``compute_advantages``).
        run_wide: an estimator option the trainer gives every estimator call (each estimator
            takes those its signature names).
        schema_type, schema_default: how the typed run config declares it, where that differs from
            the dataclass (an enum or ``None`` there, a plain value here); a default computed above
            this layer is given to :func:`schema_fields` as a factory.
    """

    help: str
    key: str | None = None
    aliases: tuple[str, ...] = ()
    resumable: bool = False
    choices: tuple | None = None
    note: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    finite: bool = False
    check: Callable[[Any], Any] | None = None
    run_wide: bool = False
    schema_type: Any = None
    schema_default: Any = UNSET


def setting(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, **facts: Any) -> Any:
    """A dataclass field declaring a setting: ``default`` (or ``factory`` for a mutable one), its
    ``help`` and the :class:`Setting` facts given as keywords."""
    metadata = {"setting": Setting(help, **facts)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared(cls: type) -> dict[str, Setting]:
    """``{field name: Setting}`` of the fields of dataclass ``cls`` made with :func:`setting`."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(cls) if "setting" in f.metadata}


def default_of(field: Field) -> Any:
    """A dataclass field's default value (its factory called)."""
    return field.default_factory() if field.default_factory is not MISSING else field.default


def _bounds(s: Setting) -> str:
    if s.maximum is not None:
        return f"in {'(' if s.exclusive_minimum else '['}{s.minimum}, {s.maximum}]"
    return f"{'>' if s.exclusive_minimum else '>='} {s.minimum}"


def check_value(value: Any, s: Setting, key: str, example: Any = UNSET) -> Any:
    """Check ``value`` of the setting ``key`` against its declaration; returns it (as ``check``
    returns it, for a setting with a ``check``).

    Raises:
        ConfigError: a value outside ``choices``, out of its bounds (NaN is out of every range),
            not finite, or refused by ``check`` (its message, with the key); ``None`` passes.
    """
    if value is None:
        return value
    if s.choices is not None and value not in s.choices:
        raise ConfigError(f"{key}={value!r} is not one of {s.choices}{f' ({s.note})' if s.note else ''}.")
    if s.minimum is not None:
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        low_ok = number and (value > s.minimum if s.exclusive_minimum else value >= s.minimum)
        if not (low_ok and (s.maximum is None or value <= s.maximum)):  # NaN compares False: out
            hint = "" if example is UNSET else f" (e.g. {key}={'null' if example is None else example})"
            raise ConfigError(f"{key}={value!r} is out of range; it must be {_bounds(s)}{hint}.")
    if s.finite and (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)):
        raise ConfigError(f"{key} must be a finite number, got {value!r}.")
    if s.check is not None:
        try:
            return s.check(value)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{key}: {exc}") from exc
    return value


def schema_fields(
    cls: type, section: str, factories: Mapping[str, Callable[[], Any]] | None = None
) -> list[tuple[str, Any, Field]]:
    """``make_dataclass`` fields of the typed run config's ``section`` (e.g.
    ``"rllm.algorithm"``) for the settings of ``cls`` whose key is ``section.<name>``: named by
    the key's last part, typed and defaulted by ``schema_type`` / ``schema_default`` /
    ``factories[field name]`` where given (a default read from above this layer: the built-in
    estimators' options), the declaration's metadata kept."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        s = f.metadata.get("setting")
        if s is None or s.key is None or s.key.rpartition(".")[0] != section:
            continue
        kind = s.schema_type if s.schema_type is not None else hints[f.name]
        if factories and f.name in factories:
            field = dataclasses.field(default_factory=factories[f.name], metadata=f.metadata)
            out.append((s.key.rpartition(".")[2], kind, field))
            continue
        default = s.schema_default if s.schema_default is not UNSET else default_of(f)
        if dataclasses.is_dataclass(default):  # a section (rollout_correction): its own dataclass
            section_cls = schema_section(type(default))
            out.append((s.key.rpartition(".")[2], section_cls, dataclasses.field(default_factory=section_cls)))
        elif isinstance(default, (dict, list)):
            value = default
            out.append(
                (
                    s.key.rpartition(".")[2],
                    kind,
                    dataclasses.field(default_factory=lambda v=value: type(v)(v), metadata=f.metadata),
                )
            )
        else:
            out.append((s.key.rpartition(".")[2], kind, dataclasses.field(default=default, metadata=f.metadata)))
    return out


def schema_section(cls: type) -> type:
    """The typed run config's class of the section dataclass ``cls``: ``cls`` itself, or where a
    field declares a ``schema_default`` (rLLM's ``RolloutCorrectionConfig.tis_cap``: 5.0 in its
    dataclass, 2.0 in its ``base.yaml``), a subclass with those defaults."""
    changed = [
        (f.name, f.type, dataclasses.field(default=f.metadata["setting"].schema_default, metadata=f.metadata))
        for f in dataclasses.fields(cls)
        if "setting" in f.metadata and f.metadata["setting"].schema_default is not UNSET
    ]
    return dataclasses.make_dataclass(f"{cls.__name__}Section", changed, bases=(cls,)) if changed else cls


def with_schema_defaults(cls: type, section: Any) -> Any:
    """A section read from a config (a dict, or None when absent) with the ``schema_default`` of
    each field of dataclass ``cls`` it leaves out (what the run config would hold); an instance
    of ``cls`` is returned as it is."""
    if section is not None and not isinstance(section, dict):
        return section
    filled = dict(section or {})
    for name, s in declared(cls).items():
        if s.schema_default is not UNSET and name not in filled:
            filled[name] = s.schema_default
    return filled


def walk(cls: type, prefix: str = "") -> list[tuple[str, Setting | None, Field]]:
    """Every setting of the dataclass tree ``cls`` as ``(dotted key, Setting or None, field)``,
    depth first in declaration order; a field whose default is a dataclass is a section, walked
    into (it is not a setting itself)."""
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if f.default_factory is not MISSING and dataclasses.is_dataclass(section := f.default_factory):
            out += walk(section, key + ".")
        else:
            out.append((key, f.metadata.get("setting"), f))
    return out

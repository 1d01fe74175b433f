"""The training backends by name: ``backend.name`` picks one, and :func:`register_backend` adds
one, as ``register_rllm_adv_estimator`` and ``register_loss`` add estimators and losses.

A backend is a class implementing :class:`~rllm_torch.trainer.protocol.BackendProtocol`; its
settings are a dataclass with a ``name`` field, which types the run's ``backend`` section
(:func:`~rllm_torch.trainer.schema.run_schema`): ``backend.<key>=...`` on the command line is
checked against it like any other setting (a misspelt key stops the run at start-up, naming the
nearest one), and the backend reads it typed, as ``self.config.backend``. The built-in ``torch``
backend's settings are :class:`~rllm_torch.trainer.backend_schema.BackendConfig`; its class is
imported on first use (``rllm_torch.backends`` is the layer above this one).

``backend.name`` is a registered name, or an import path ``package.module:Class`` (the Python
entry-point convention): the module is imported, and may register the class itself under any
name; a class it does not register is registered under the path, with its ``settings`` class
attribute as its settings. A class with neither takes a registered base class's settings, else
the torch backend's section.

Example (``PYTHONPATH=. rllm-torch-train backend.name=mine imports=[my_backend] backend.lr=0.01``)::

    @dataclass
    class MySettings:
        name: str = "mine"
        lr: float = 1e-3

    @register_backend("mine", settings=MySettings)
    class MyBackend(BackendProtocol): ...
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rllm_torch.core.errors import BackendRegistrationError, RLLMTorchError, UnknownBackendError
from rllm_torch.trainer.backend_schema import BackendConfig
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.schema import typed_run_config

__all__ = [
    "register_backend",
    "backend_class",
    "backend_settings",
    "settings_of",
    "registered_backend_names",
    "typed_backend_config",
]

#: The methods the trainer calls on a backend: every public method of the protocol.
_PROTOCOL_METHODS = tuple(n for n, v in vars(BackendProtocol).items() if callable(v) and not n.startswith("_"))


@dataclasses.dataclass(frozen=True)
class _Entry:
    target: type | str  # the class, or its import path (a built-in, loaded on first use)
    settings: type


_BACKENDS: dict[str, _Entry] = {
    "torch": _Entry("rllm_torch.backends.torch_backend.backend:TorchBackend", BackendConfig)
}


def register_backend(
    name: str, cls: type | None = None, *, settings: type | None = None
) -> type | Callable[[type], type]:
    """Register a backend class under ``name``, the value of ``backend.name`` that selects it;
    as a decorator, ``@register_backend("mine", settings=MySettings)``.

    Args:
        name: a non-empty string.
        cls: a class implementing every public method of
            :class:`~rllm_torch.trainer.protocol.BackendProtocol` (subclass it: the hooks have
            defaults); None: return a decorator.
        settings: the dataclass that types the run's ``backend`` section; it must have a ``name``
            field. None: the class's ``settings`` class attribute, a registered base class's
            settings, else the torch backend's :class:`~rllm_torch.trainer.backend_schema.BackendConfig`.

    Returns:
        ``cls`` (or the decorator, which returns the class it is given).

    Raises:
        BackendRegistrationError: ``name`` is not a non-empty string or is registered to another
            class; ``cls`` is not a class or leaves a protocol method unimplemented; ``settings``
            is not a dataclass with a ``name`` field OmegaConf can type. Registering the same
            class again (also after its module is reloaded) replaces its entry.
    """
    if not isinstance(name, str) or not name:
        raise BackendRegistrationError(
            f"register_backend needs a non-empty name, e.g. @register_backend('mine', settings=MySettings); got {name!r}."
        )

    def add(backend_cls: type) -> type:
        _check_class(name, backend_cls)
        chosen = settings_of(backend_cls) if settings is None else settings
        _check_settings(name, chosen)
        old = _BACKENDS.get(name)
        if old is not None and _path(old.target) != _path(backend_cls):
            raise BackendRegistrationError(
                f"register_backend({name!r}, {backend_cls.__qualname__}): {name!r} is registered already, to "
                f"{_path(old.target)}; register {backend_cls.__qualname__} under another name."
            )
        _BACKENDS[name] = _Entry(backend_cls, chosen)
        return backend_cls

    return add if cls is None else add(cls)


def registered_backend_names() -> list[str]:
    """The names ``backend.name`` may take, sorted (import paths resolved so far included)."""
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[BackendProtocol]:
    """The backend class ``name`` selects: a registered name or an import path
    ``package.module:Class`` (module docstring).

    Raises:
        UnknownBackendError: ``name`` is neither; an import path whose module cannot be imported
            or has no such class. The message names the closest registered name and lists them.
        BackendRegistrationError: the class an import path names is not a backend.
    """
    entry = _entry(name)
    if isinstance(entry.target, type):
        return entry.target
    cls = _load(name, entry.target)  # a built-in, on first use
    _check_class(name, cls)
    _BACKENDS[name] = _Entry(cls, entry.settings)
    return cls


def backend_settings(name: str) -> type:
    """The settings dataclass of the backend ``name`` selects (a built-in's class is not imported).

    Raises:
        UnknownBackendError, BackendRegistrationError: as :func:`backend_class`.
    """
    return _entry(name).settings


def settings_of(backend_cls: type) -> type:
    """The settings dataclass of ``backend_cls``: its registration's, else its ``settings`` class
    attribute, else a base class's (the nearest first), else the torch backend's
    :class:`~rllm_torch.trainer.backend_schema.BackendConfig`."""
    for klass in getattr(backend_cls, "__mro__", ()):
        for entry in _BACKENDS.values():
            if _path(entry.target) == _path(klass):
                return entry.settings
        if isinstance(own := vars(klass).get("settings"), type):
            return own
    return BackendConfig


def typed_backend_config(config: Any, backend_cls: type) -> DictConfig:
    """``config`` typed over the run's schema with ``backend_cls``'s settings as its ``backend``
    section (:func:`~rllm_torch.trainer.schema.typed_run_config`).

    Raises:
        ConfigError: a key that section (or the schema) does not know, a value of the wrong
            type, or a config typed already for another backend's settings.
    """
    return typed_run_config(config, settings=settings_of(backend_cls))


def _path(target: type | str) -> str:
    """``package.module:Class`` of a class (an import path as it is)."""
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def _entry(name: str) -> _Entry:
    if isinstance(name, str) and name in _BACKENDS:
        return _BACKENDS[name]
    if isinstance(name, str) and ":" in name:
        return _from_import_path(name)
    names = registered_backend_names()
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise UnknownBackendError(
        f"backend.name={name!r} is not a registered backend{hint} Registered: {', '.join(names)}. A backend of your "
        "own: backend.name=package.module:Class (PYTHONPATH=. for ./package/module.py), or a module given to "
        "imports=[...] that calls register_backend."
    )


def _from_import_path(path: str) -> _Entry:
    """The entry of the class ``path`` names: the one its module registered, else a new one under ``path``."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise UnknownBackendError(
            f"backend.name={path!r}: an import path is package.module:Class, e.g. "
            "backend.name=examples.minimal_backend:MinimalBackend."
        )
    cls = _load(path, path)
    for entry in _BACKENDS.values():
        if _path(entry.target) == _path(cls):  # its module registered it (under any name)
            return _Entry(cls, entry.settings)
    register_backend(path, cls)
    return _BACKENDS[path]


def _load(name: str, path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except RLLMTorchError:  # the module's own registration failed: that error says why
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the module stops the start-up, with its reason
        raise UnknownBackendError(
            f"backend.name={name!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); put it on the "
            f"Python path (PYTHONPATH=. for ./{module_name.replace('.', '/')}.py) or install its package."
        ) from exc
    for part in attr.split("."):
        found = getattr(found, part, None)
    if found is None:
        raise UnknownBackendError(
            f"backend.name={name!r}: module {module_name!r} has no {attr!r}; name a class defined in it "
            f"(package.module:Class)."
        )
    return found


def _check_class(name: str, cls: Any) -> None:
    if not isinstance(cls, type):
        raise BackendRegistrationError(
            f"backend {name!r} needs a class implementing BackendProtocol; got {cls!r} ({type(cls).__name__})."
        )
    missing = [
        method
        for method in _PROTOCOL_METHODS
        if not callable(found := getattr(cls, method, None)) or getattr(found, "__isabstractmethod__", False)
    ]
    if missing:
        raise BackendRegistrationError(
            f"backend {name!r}: {cls.__qualname__} does not implement {', '.join(missing)} of BackendProtocol; "
            "subclass rllm_torch.trainer.protocol.BackendProtocol (its hooks have defaults) and define them."
        )


def _check_settings(name: str, settings: Any) -> None:
    fields = dataclasses.fields(settings) if isinstance(settings, type) and dataclasses.is_dataclass(settings) else ()
    if "name" not in {f.name for f in fields}:
        raise BackendRegistrationError(
            f"backend {name!r}: settings={settings!r} must be a dataclass with a `name` field (the run's "
            "backend section: backend.name and the backend's own settings), e.g. "
            "@dataclass class MySettings: name: str = 'mine'; lr: float = 1e-3."
        )
    try:
        OmegaConf.structured(settings)
    except OmegaConfBaseException as exc:
        raise BackendRegistrationError(
            f"backend {name!r}: settings {settings.__qualname__} cannot type a config section: "
            f"{str(exc).splitlines()[0]}"
        ) from exc

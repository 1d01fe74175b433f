"""The backend a command line chooses, decided before Hydra composes: the modules of ``imports=``
are imported (what they register exists, a backend among it), then ``backend.name=`` is resolved
(:mod:`~rllm_torch.trainer.backend_registry`: a registered name, or ``package.module:Class``), and
its settings dataclass types the run's ``backend`` section
(:func:`~rllm_torch.trainer.schema.run_schema`), so every ``backend.<key>`` is composed and
checked against that backend's own settings."""

from __future__ import annotations

import importlib
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.backend_registry import backend_settings

__all__ = ["import_user_modules", "chosen_settings"]


def import_user_modules(names: list[str]) -> None:
    """Import each module of ``imports`` (``imports=[my_pkg.estimators]``), so what it registers
    (``@register_rllm_adv_estimator``, ``@register_backend``) exists before the config is checked.

    Raises:
        ConfigError: a module that cannot be imported, with the reason.
    """
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module stops the start-up
            raise ConfigError(
                f"imports: cannot import {name!r} ({type(exc).__name__}: {exc}); give a module on the Python path, e.g. "
                "PYTHONPATH=. rllm-torch-train imports=[my_estimators] for ./my_estimators.py."
            ) from exc


def chosen_settings(overrides: list[Any]) -> type:
    """The settings dataclass of the backend Hydra's parsed ``overrides`` choose (``backend.name=``;
    the torch backend without one), once the modules of ``imports=`` are imported.

    Raises:
        ConfigError: ``backend.name`` or ``imports`` given as a sweep (one backend types the
            section of every job), or a module of ``imports`` that cannot be imported.
        UnknownBackendError, BackendRegistrationError: ``backend.name`` selects no backend
            (:func:`~rllm_torch.trainer.backend_registry.backend_class`).
    """
    name, imports = "torch", []
    for override in overrides:
        key = override.key_or_group
        if key not in ("backend.name", "imports") or override.is_delete():
            continue
        if override.is_sweep_override():
            raise ConfigError(
                f"{override.input_line}: {key} takes one value per command line (it types the backend section before "
                "the jobs compose); launch one command per backend."
            )
        value = override.value()
        if key == "backend.name":
            name = str(value)
        else:
            imports = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    import_user_modules(imports)
    return backend_settings(name)

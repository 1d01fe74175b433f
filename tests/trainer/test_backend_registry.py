"""The backend registry (issue 51, item 4): backends registered by name like estimators and losses,
or named by an import path ``package.module:Class``; each with its own settings dataclass, which types
the run's ``backend`` section (checked, fingerprinted and resumed by its own declarations). Every
message below is written out by hand from the rule it states."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
from omegaconf import OmegaConf

import rllm_torch
from rllm_torch.core.errors import BackendRegistrationError, ConfigError, UnknownBackendError
from rllm_torch.rllm.settings import setting
from rllm_torch.trainer import backend_registry
from rllm_torch.trainer.backend_registry import (
    backend_class,
    backend_settings,
    register_backend,
    registered_backend_names,
    settings_of,
    typed_backend_config,
)
from rllm_torch.trainer.backend_schema import BackendConfig
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.runtime.fingerprint import config_fingerprint, resumable_settings
from rllm_torch.trainer.schema import TrainConfig, run_schema, typed_run_config


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Each test registers into its own copy of the registry (the built-in torch backend in it)."""
    monkeypatch.setattr(backend_registry, "_BACKENDS", dict(backend_registry._BACKENDS))


@dataclasses.dataclass
class FakeSettings:
    name: str = setting("fake", "the backend")
    lr: float = setting(0.001, "its learning rate", minimum=0, exclusive_minimum=True, resumable=True)
    momentum: float = setting(0.9, "its momentum (the torch backend has none)", minimum=0, maximum=1)
    optimizer: str = "adamw"  # declared without setting(): no bounds, fingerprinted


class FakeBackend(BackendProtocol):
    """Implements the protocol's abstract methods (never called here)."""

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


def test_the_torch_backend_is_registered_with_its_settings_and_its_class_loads_on_first_use():
    from rllm_torch.backends.torch_backend.backend import TorchBackend

    assert "torch" in registered_backend_names()
    assert backend_settings("torch") is BackendConfig
    assert backend_class("torch") is TorchBackend
    assert run_schema(BackendConfig) is TrainConfig  # every existing config keeps its schema


def test_the_decorator_registers_the_class_with_its_settings_and_returns_it():
    @register_backend("fake", settings=FakeSettings)
    class Decorated(FakeBackend):
        pass

    assert Decorated.__name__ == "Decorated"  # the class itself, not a wrapper
    assert backend_class("fake") is Decorated and backend_settings("fake") is FakeSettings
    assert registered_backend_names() == sorted(["torch", "fake"])
    register_backend("fake_too", FakeBackend, settings=FakeSettings)  # called with the class: the same
    assert backend_class("fake_too") is FakeBackend


def test_register_backend_is_exported_from_the_package_root_like_register_loss():
    assert rllm_torch.register_backend is register_backend
    assert rllm_torch.register_loss is not None and rllm_torch.register_adv_estimator is not None


def test_a_misspelt_name_names_the_closest_registered_one_and_lists_them_all():
    register_backend("minimal_fake", FakeBackend, settings=FakeSettings)
    with pytest.raises(UnknownBackendError) as raised:
        backend_class("minimall_fake")
    assert str(raised.value).startswith(
        "backend.name='minimall_fake' is not a registered backend; did you mean 'minimal_fake'? "
        "Registered: minimal_fake, torch. A backend of your own: backend.name=package.module:Class"
    )
    with pytest.raises(UnknownBackendError, match=r"^backend.name='jax' is not a registered backend\. Registered:"):
        backend_settings("jax")  # nothing close: no guess


def test_a_second_class_under_a_taken_name_is_refused_and_the_first_registration_stays():
    register_backend("fake", FakeBackend, settings=FakeSettings)
    register_backend("fake", FakeBackend, settings=FakeSettings)  # the same class again: fine

    class Other(FakeBackend):
        pass

    with pytest.raises(BackendRegistrationError) as raised:
        register_backend("fake", Other, settings=FakeSettings)
    assert f"'fake' is registered already, to {__name__}:FakeBackend; register" in str(raised.value)
    with pytest.raises(BackendRegistrationError, match="'torch' is registered already, to rllm_torch.backends"):
        register_backend("torch", Other)
    assert backend_class("fake") is FakeBackend


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_name_that_is_not_a_non_empty_string_is_refused(name):
    with pytest.raises(BackendRegistrationError, match="needs a non-empty name"):
        register_backend(name, FakeBackend, settings=FakeSettings)


def test_something_that_is_not_a_class_is_refused_at_registration():
    with pytest.raises(BackendRegistrationError, match=r"backend 'f' needs a class implementing BackendProtocol; got"):
        register_backend("f", lambda config: None, settings=FakeSettings)
    with pytest.raises(BackendRegistrationError, match=r"got .*\(FakeBackend\)\.$"):  # an instance is not a class
        register_backend("f", object.__new__(FakeBackend), settings=FakeSettings)
    assert "f" not in registered_backend_names()


def test_a_class_that_leaves_protocol_methods_unimplemented_is_refused_naming_them():
    class NoUpdate(BackendProtocol):  # update_policy still abstract
        init_rollout_engine = FakeBackend.init_rollout_engine
        get_dataloader = FakeBackend.get_dataloader
        generate_episodes = FakeBackend.generate_episodes
        transform_to_backend_batch = FakeBackend.transform_to_backend_batch

    with pytest.raises(BackendRegistrationError) as raised:
        register_backend("no_update", NoUpdate, settings=FakeSettings)
    assert "NoUpdate does not implement update_policy of BackendProtocol; subclass" in str(raised.value)

    class Duck:  # not a subclass: only the methods it defines count
        def update_policy(self, trainer_state): ...

    with pytest.raises(BackendRegistrationError) as raised:
        register_backend("duck", Duck, settings=FakeSettings)
    missing = str(raised.value).split("does not implement ")[1].split(" of BackendProtocol")[0].split(", ")
    # the protocol's public methods (trainer/protocol.py, read by hand) less Duck's one
    assert set(missing) == {
        "init_rollout_engine", "validate_config", "validate_prompts", "get_dataloader", "state_dict",
        "load_state_dict", "sharded_state_dict", "load_sharded_state_dict", "rank_state_dict",
        "load_rank_state_dict", "generate_episodes", "generate_baseline_episodes", "init_async_rollout_engine",
        "publish_weights", "transform_to_backend_batch", "process_backend_batch", "compute_advantages",
        "summary_rows", "on_train_start", "on_train_end", "train_end_complete", "on_epoch_start", "on_epoch_end",
        "on_batch_start", "on_batch_end", "on_validation_start", "on_validation_end", "shutdown",
    }  # fmt: skip


@dataclasses.dataclass
class NoName:
    lr: float = 0.1


@dataclasses.dataclass
class Unstructured:
    name: str = "x"
    ids: set = dataclasses.field(default_factory=set)  # OmegaConf cannot type a set


@pytest.mark.parametrize("settings", [dict, NoName, FakeSettings(), "FakeSettings"])
def test_settings_that_are_not_a_dataclass_with_a_name_field_are_refused(settings):
    with pytest.raises(BackendRegistrationError) as raised:
        register_backend("f", FakeBackend, settings=settings)
    assert f"backend 'f': settings={settings!r} must be a dataclass with a `name` field" in str(raised.value)
    assert "f" not in registered_backend_names()


def test_settings_omegaconf_cannot_type_are_refused_at_registration_not_at_the_first_run():
    with pytest.raises(BackendRegistrationError, match="settings Unstructured cannot type a config section: "):
        register_backend("f", FakeBackend, settings=Unstructured)


def test_a_class_without_settings_takes_its_class_attribute_else_a_registered_base_class_else_the_torch_section():
    class Own(FakeBackend):
        settings = FakeSettings

    register_backend("own", Own)
    assert backend_settings("own") is FakeSettings

    class Child(Own):
        settings = None  # not a class: the registered base's

    assert settings_of(Child) is FakeSettings
    from rllm_torch.backends.torch_backend.backend import TorchBackend

    class SlowTorch(TorchBackend):
        pass

    assert settings_of(SlowTorch) is BackendConfig and settings_of(FakeBackend) is BackendConfig


MODULE = """
import dataclasses
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.backend_registry import register_backend
from {base} import FakeBackend, FakeSettings


@dataclasses.dataclass
class PathSettings:
    name: str = "by_path"
    momentum: float = 0.9


class ByPath(FakeBackend):
    settings = PathSettings


@register_backend("registers_itself", settings=FakeSettings)
class Registered(FakeBackend):
    pass


class NotABackend:
    pass
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A module of backends on the Python path (``backends_on_path``)."""
    (tmp_path / "backends_on_path.py").write_text(textwrap.dedent(MODULE.format(base=__name__)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "backends_on_path", raising=False)
    return "backends_on_path"


def test_an_import_path_imports_the_module_and_registers_the_class_under_the_path_with_its_settings(module):
    cls = backend_class(f"{module}:ByPath")
    assert cls.__name__ == "ByPath" and backend_settings(f"{module}:ByPath").__name__ == "PathSettings"
    assert f"{module}:ByPath" in registered_backend_names() and "registers_itself" in registered_backend_names()


def test_an_import_path_to_a_class_its_module_registered_takes_that_registration(module):
    assert backend_settings(f"{module}:Registered") is FakeSettings
    assert f"{module}:Registered" not in registered_backend_names()  # one registration, under its own name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module_zz:X", "backend.name='no_such_module_zz:X': cannot import 'no_such_module_zz' "
         "(ModuleNotFoundError: No module named 'no_such_module_zz'); put it on the Python path (PYTHONPATH=. for "
         "./no_such_module_zz.py) or install its package."),
        ("{module}:Missing", "backend.name='{module}:Missing': module '{module}' has no 'Missing'; name a class "
         "defined in it (package.module:Class)."),
        ("{module}:", "backend.name='{module}:': an import path is package.module:Class, e.g. "
         "backend.name=examples.minimal_backend:MinimalBackend."),
    ],
)  # fmt: skip
def test_an_import_path_that_names_no_class_says_which_part_and_how_to_fix_it(module, name, message):
    with pytest.raises(UnknownBackendError) as raised:
        backend_class(name.format(module=module))
    assert str(raised.value) == message.format(module=module)


def test_an_import_path_to_something_that_is_not_a_backend_is_a_registration_error(module):
    with pytest.raises(BackendRegistrationError, match="NotABackend does not implement init_rollout_engine"):
        backend_class(f"{module}:NotABackend")


def test_a_backends_settings_type_the_backend_section_and_refuse_a_misspelt_key():
    register_backend("fake", FakeBackend, settings=FakeSettings)
    config = typed_backend_config({"backend": {"name": "fake", "lr": 0.5}}, FakeBackend)
    assert OmegaConf.get_type(config, "backend") is FakeSettings and OmegaConf.get_type(config) is run_schema(
        FakeSettings
    )
    assert (config.backend.lr, config.backend.optimizer, config.rllm.rollout.n) == (0.5, "adamw", 8)
    assert typed_backend_config(config, FakeBackend) is config  # typed already: as it is
    with pytest.raises(ConfigError, match=r"Key 'lrr' not in 'FakeSettings'"):
        typed_backend_config({"backend": {"lrr": 0.5}}, FakeBackend)
    with pytest.raises(ConfigError) as raised:  # a config typed for the torch backend
        typed_backend_config(typed_run_config({}), FakeBackend)
    assert str(raised.value).startswith(
        "the run config's backend section is typed BackendConfig and this backend's settings are FakeSettings: "
        "type the config for it (typed_run_config(config, settings=FakeSettings)), or choose the backend with"
    )


def test_a_backends_own_declarations_are_checked_fingerprinted_and_resumable_as_declared():
    register_backend("fake", FakeBackend, settings=FakeSettings)
    config = typed_backend_config({"backend": {"name": "fake"}}, FakeBackend)
    check_run_config(config)  # the torch backend's rules (loss options, critic, FSDP) are not this backend's
    fingerprint, resumable = config_fingerprint(config), resumable_settings(config)
    backend_keys = sorted(k for k in [*fingerprint, *resumable] if k.startswith("backend."))
    assert backend_keys == ["backend.lr", "backend.momentum", "backend.name", "backend.optimizer"]  # no torch key
    assert fingerprint["backend.optimizer"] == "adamw" and resumable["backend.lr"] == 0.001  # lr: resumable=True
    with pytest.raises(
        ConfigError, match=r"^backend.lr=-1.0 is out of range; it must be > 0 \(e.g. backend.lr=0.001\)"
    ):
        check_run_config(typed_backend_config({"backend": {"lr": -1.0}}, FakeBackend))
    with pytest.raises(
        ConfigError,
        match=r"^backend.momentum=1.5 is out of range; it must be in \[0, 1\] \(e.g. backend.momentum=0.9\)\.$",
    ):
        check_run_config(typed_backend_config({"backend": {"momentum": 1.5}}, FakeBackend))  # a key torch lacks


def test_rllms_key_of_a_torch_setting_with_another_backends_section_says_so_instead_of_omegaconfs_error():
    register_backend("fake", FakeBackend, settings=FakeSettings)
    config = typed_backend_config({"rllm": {"algorithm": {"eps_clip": 0.3}}}, FakeBackend)
    with pytest.raises(ConfigError) as raised:
        check_run_config(config)
    assert str(raised.value) == (
        "rllm.algorithm.eps_clip=0.3 is rLLM's key of backend.clip_ratio_low, a setting of the torch backend, and "
        "backend.name=fake has no backend.clip_ratio_low: drop rllm.algorithm.eps_clip, and set that backend's own "
        "setting."
    )


def test_settings_that_extend_the_torch_section_type_the_backend_section_with_their_own_keys():
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    from rllm_torch.rllm.settings import setting
    from rllm_torch.trainer.backend_schema import BackendConfig
    from rllm_torch.trainer.schema import TrainConfig, run_schema

    @dataclass
    class TracedSettings(BackendConfig):
        trace_every: int = setting(0, "write a trace every N steps (0: never)")

    schema = run_schema(TracedSettings)
    assert schema is not TrainConfig and run_schema(TracedSettings) is schema  # one class per settings
    config = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(["backend.trace_every=3"]))
    assert (config.backend.trace_every, config.backend.lr) == (3, None)  # its own key, and the torch section's
    with pytest.raises(Exception, match="trace_every"):  # the torch backend's schema has no such key
        OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(["backend.trace_every=3"]))

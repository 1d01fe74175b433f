import json
import sys
from pathlib import Path

import pytest

import rllm_torch  # noqa: F401 - the built-in estimators and losses, registered before any test file
from rllm_torch.core.losses import registry as loss_registry
from rllm_torch.rllm import registry as estimator_registry

DATA = Path(__file__).parent / "data"
SHARED_CASES = Path(__file__).resolve().parents[2] / "shared" / "cases" / "estimators.json"


def load_cases() -> list[dict]:
    """The worked cases of ../shared/cases (a vendored copy when the checkout has no shared/)."""
    path = SHARED_CASES if SHARED_CASES.exists() else DATA / "estimators.json"
    return json.loads(path.read_text())["cases"]


@pytest.fixture(scope="session")
def cases() -> list[dict]:
    return load_cases()


# Registry isolation (issue 52): what a test file registers (estimators, losses) is its own. Its
# import-time registrations are taken out again once it is collected, so the next file's collection
# (a parametrize over registered_estimator_names()) does not see them, and are put back around its own
# tests; whatever its tests register is removed after them. Registrations by helper modules (rank_tasks.py,
# imported once by several test files) stay, as before.
REGISTRIES = (estimator_registry._REGISTRY, loss_registry._LOSSES)
OWN_REGISTRATIONS: dict[str, list[dict]] = {}  # a test file's node id -> its import's entries, per registry


def _snapshot() -> list[dict]:
    return [dict(registry) for registry in REGISTRIES]


def _restore(snapshot: list[dict]) -> None:
    for registry, saved in zip(REGISTRIES, snapshot, strict=True):
        registry.clear()
        registry.update(saved)


def _defined_in(fn: object, path: Path) -> bool:
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve() == Path(path).resolve()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    if not isinstance(collector, pytest.Module):
        yield
        return
    before = _snapshot()
    yield
    # a file is collected twice, for its doctests (which import it) and its tests: what either added
    own = OWN_REGISTRATIONS.setdefault(collector.nodeid, [{} for _ in REGISTRIES])
    for registry, saved, mine in zip(REGISTRIES, before, own, strict=True):
        added = {k: v for k, v in registry.items() if saved.get(k) is not v and _defined_in(v.fn, collector.path)}
        for key in added:
            if key in saved:
                registry[key] = saved[key]
            else:
                del registry[key]
        mine.update(added)


@pytest.fixture(autouse=True, scope="module")
def registrations_of_this_file(request):
    """The registries as the test file's import left them, for its tests only."""
    saved = _snapshot()
    for registry, own in zip(REGISTRIES, OWN_REGISTRATIONS.get(request.node.nodeid, ({}, {})), strict=True):
        registry.update(own)
    yield
    _restore(saved)

"""The package's layers and what each may import (every ``import`` statement, read with ``ast``,
function bodies included): the core (torch and numpy only) ← the rLLM surface ← the training
framework ← the backends and the rollouts (side by side: neither imports the other) ← the
programs ← the compatibility packages. ``import rllm_torch`` loads no config, model or plotting library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rllm_torch"

#: Each layer's packages, bottom first; a module may import its own layer and those below.
LAYERS = [
    ("core", ("rllm_torch.core",)),
    ("rLLM surface", ("rllm_torch.rllm", "rllm_torch")),  # `rllm_torch` itself: the core and the surface
    ("training framework", ("rllm_torch.trainer",)),
    ("backends and rollouts", ("rllm_torch.backends", "rllm_torch.rollouts")),
    ("programs", ("rllm_torch.cli", "rllm_torch.train", "rllm_torch.configs")),
    ("compatibility", ("rllm_torch.compat",)),  # other libraries' import paths over everything below
]
#: Inside a package, its folders and top-level modules in ranks, bottom first: a module may import
#: its own rank and those below, never one above (nor, outside a package's ``__init__``, the
#: package's ``__init__``). A package not listed has no order inside it.
UNITS = {
    "rllm_torch.core": [
        ("errors", "checks", "labels", "distributed", "moments", "centring", "segment"),
        ("grouping", "packing", "tokens", "returns", "turns"),
        ("estimators", "losses"),
    ],
    "rllm_torch.trainer": [
        ("backend_schema",),
        (
            "schema",
            "resolvers",
            "model_defaults",
            "ranks",
            "rllm_settings",
            "rllm_sections",
            "backend_args",
            "user_errors",
            "trainer_arguments",
        ),
        ("pipeline",),
        ("config_checks",),
        ("state",),
        ("runtime",),
        ("reward_threads", "rollout_engine", "workflow", "workflow_engine"),
        ("logs",),
        ("protocol",),
        ("backend_registry",),
        ("batches", "step"),
        ("unified_trainer",),
    ],
}
#: Packages of one layer that must not import each other.
SIDE_BY_SIDE = ("rllm_torch.backends", "rllm_torch.rollouts")
#: Third-party libraries each layer may import (the standard library is always allowed).
THIRD_PARTY = {
    "core": {"torch", "numpy"},
    "rLLM surface": {"torch", "numpy", "omegaconf"},  # omegaconf: AlgorithmConfig.from_config only (see below)
}
#: The upward imports, with their reason: rLLM's ``UnifiedTrainer`` is importable from
#: ``rllm_torch`` as in rLLM, and ``register_backend`` beside ``register_loss``, each loaded on
#: first use (module ``__getattr__``), never by ``import rllm_torch``.
ALLOWED_UPWARD = {
    ("rllm_torch", "rllm_torch.trainer.unified_trainer"),
    ("rllm_torch", "rllm_torch.trainer.backend_registry"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """The longest package of :data:`LAYERS` that holds ``module``."""
    owners = [p for _, packages in LAYERS for p in packages if module == p or module.startswith(p + ".")]
    return max(owners, key=len)


def _layer(module: str) -> int:
    package = _package(module)
    return next(i for i, (_, packages) in enumerate(LAYERS) if package in packages)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; ``from a import b`` gives ``a``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the layer test reads absolute ones)"
            found.append(node.module)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    assert MODULES and all(_package(_module_name(p)) for p in MODULES)


def _violations(path: Path) -> list[str]:
    module = _module_name(path)
    layer, package = _layer(module), _package(module)
    layer_name = LAYERS[layer][0]
    found = []
    for imported in _imports(path):
        top = imported.split(".")[0]
        if top == "rllm_torch":
            if (module, imported) in ALLOWED_UPWARD:
                continue
            if _layer(imported) > layer:
                found.append(f"{module} ({layer_name}) imports {imported} ({LAYERS[_layer(imported)][0]})")
            other = _package(imported)
            if package in SIDE_BY_SIDE and other in SIDE_BY_SIDE and other != package:
                found.append(f"{module} imports {imported}: backends and rollouts do not import each other")
        elif layer_name in THIRD_PARTY and top not in sys.stdlib_module_names and top not in THIRD_PARTY[layer_name]:
            found.append(f"{module} ({layer_name}) imports {imported}")
    return found


def _unit_rank(package: str, module: str) -> int | None:
    """The rank in ``UNITS[package]`` of the unit holding ``module`` (None: the package's ``__init__``)."""
    if module == package:
        return None
    unit = module[len(package) + 1 :].split(".")[0]
    ranks = [i for i, units in enumerate(UNITS[package]) if unit in units]
    assert ranks, f"{module}: {unit!r} has no rank in UNITS[{package!r}] (tests/test_layers.py); give it one"
    return ranks[0]


def _unit_violations(path: Path) -> list[str]:
    module = _module_name(path)
    found = []
    for package in UNITS:
        if not module.startswith(package + ".") or module == package:
            continue
        rank = _unit_rank(package, module)
        for imported in _imports(path):
            if not (imported == package or imported.startswith(package + ".")):
                continue
            other = _unit_rank(package, imported)
            if other is None or other > rank:
                what = "the package's __init__" if other is None else f"rank {other}"
                found.append(f"{module} (rank {rank} of {package}) imports {imported} ({what}): an upward import")
    return found


def test_no_module_imports_a_folder_or_module_above_its_own_inside_a_layer():
    violations = [v for path in MODULES for v in _unit_violations(path)]
    assert not violations, "\n".join(violations)


def test_the_folder_order_catches_an_upward_import(tmp_path):
    # the same check on a planted module: the state importing the trainer loop is refused
    planted = PACKAGE / "trainer" / "state.py"
    text = planted.read_text() + "\nfrom rllm_torch.trainer.unified_trainer import UnifiedTrainer\n"
    copy = tmp_path / "state.py"
    copy.write_text(text)
    original = _imports
    try:
        globals()["_imports"] = lambda path: original(copy if path == planted else path)
        assert any("unified_trainer" in v for v in _unit_violations(planted))
    finally:
        globals()["_imports"] = original


def test_no_module_imports_a_layer_above_its_own():
    violations = [v for path in MODULES for v in _violations(path)]
    assert not violations, "\n".join(violations)


def test_the_rllm_surface_imports_omegaconf_only_inside_algorithm_config_from_config():
    for path in (PACKAGE / "rllm").rglob("*.py"):
        tree = ast.parse(path.read_text())
        at_module_level = [
            node
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and any(n.startswith("omegaconf") for n in _imports_of(node))
        ]
        assert not at_module_level, f"{path} imports omegaconf at module level"


def _imports_of(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]


def test_import_rllm_torch_loads_no_config_model_or_plotting_library():
    names = "{'omegaconf', 'hydra', 'transformers', 'matplotlib'}"
    code = f"import rllm_torch, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {names}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    # the rLLM trainer's name is still there, on first use
    code = "import rllm_torch, sys; rllm_torch.UnifiedTrainer; print('omegaconf' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"


def test_no_module_is_over_400_lines_nor_apologises_for_its_length():
    """A module over 400 lines is split where its concerns part (issue 41: six carried a
    "Length." paragraph instead, five misstating their own size)."""
    too_long = []
    for path in MODULES:
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > 400 or "**Length.**" in text:
            too_long.append(
                f"{_module_name(path)}: {lines} lines{', a Length paragraph' if '**Length.**' in text else ''}"
            )
    assert not too_long, "\n".join(too_long)


def test_the_backend_holds_its_parts_and_inherits_only_the_protocol():
    # parts held, not mixed in: every class the backend is built from is a base it names in its
    # MRO on purpose (the protocol), and its passes and update are objects it holds
    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.backends.torch_backend.passes import BatchPasses
    from rllm_torch.backends.torch_backend.update import PolicyUpdater
    from rllm_torch.trainer.protocol import BackendProtocol

    assert [c.__name__ for c in TorchBackend.__mro__] == ["TorchBackend", "BackendProtocol", "ABC", "object"]
    assert BackendProtocol in TorchBackend.__bases__
    source = (PACKAGE / "backends" / "torch_backend" / "backend.py").read_text()
    assert "BatchPasses(" in source and "PolicyUpdater(" in source
    assert BatchPasses.__bases__ == (object,) and PolicyUpdater.__bases__ == (object,)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, anywhere in it (function bodies and ``TYPE_CHECKING``
    blocks included: a cycle held by a late import is still a cycle); ``from a import b`` is the
    module ``a.b`` when there is one, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
    return found & modules


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def _import_graph(text_of=lambda path: path) -> dict[str, set[str]]:
    modules = {_module_name(p) for p in MODULES}
    return {_module_name(p): _module_imports(text_of(p), modules) - {_module_name(p)} for p in MODULES}


def test_no_modules_import_each_other_even_through_a_late_import():
    cycles = _import_cycles(_import_graph())
    assert not cycles, "import cycles (each a set of modules that import each other): " + "; ".join(map(str, cycles))


def test_the_cycle_check_catches_a_cycle_held_by_a_function_level_import(tmp_path):
    # a planted late import back: the segment module is imported by centring, which it imports
    planted = PACKAGE / "core" / "centring.py"
    copy = tmp_path / "centring.py"
    copy.write_text(planted.read_text() + "\n\ndef _late():\n    from rllm_torch.core.segment import SegmentLayout\n")
    cycles = _import_cycles(_import_graph(lambda path: copy if path == planted else path))
    assert ["rllm_torch.core.centring", "rllm_torch.core.segment"] in cycles

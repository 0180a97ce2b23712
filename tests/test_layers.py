"""The package layout: no import cycle between packages and no import of a higher layer (docs/architecture.md).

Imports are read from the source (every ``import`` / ``from ... import`` statement, also inside functions);
those under ``if TYPE_CHECKING:`` are type annotations only, never executed, and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlflow"

LAYERS: dict[str, int] = {
    # 0: leaves
    "utils": 0,
    "protocol": 0,
    # 1: pure algorithms, models, parallelism, data, rewards, logging, the single controller
    "algos": 1,
    "parallel": 1,
    "models": 1,
    "data": 1,
    "reward": 1,
    "logging": 1,
    "single_controller": 1,
    # 2: the typed config (its validation reads the registries of layer 1)
    "config": 2,
    # 3: what runs on one rank without Ray
    "engine": 3,
    "rollout": 3,
    # 4: Ray-facing workers
    "workers": 4,
    # 5: the driver
    "trainer": 5,
    "model_merger": 5,
}
"""Package (first component under ``rlflow``) -> layer. A module may import its own layer or lower."""


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "rlflow" and len(parts) > 1 else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> set[str]:
    """Modules imported by the file at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {m for m in out if m == "rlflow" or m.startswith("rlflow.")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()} - {None}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_no_module_imports_a_higher_layer():
    bad = []
    for module, path in _modules().items():
        own = _package(module)
        if own is None:
            continue
        for imported in _imports(path):
            other = _package(imported)
            if other is not None and LAYERS[other] > LAYERS[own]:
                bad.append(
                    f"{module} ({own}, layer {LAYERS[own]}) imports {imported} (layer {LAYERS[other]})"
                )
    assert not bad, "\n".join(bad)


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in LAYERS}
    for module, path in _modules().items():
        own = _package(module)
        if own is None:
            continue
        for imported in _imports(path):
            other = _package(imported)
            if other is not None and other != own:
                graph[own].add(other)
    return graph


def test_no_import_cycle_between_packages():
    graph = _package_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("package import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_verl_module_names_keep_working():
    """verl-style imports: ``trainer.ppo.core_algos``, ``trainer.ppo.ray_trainer``, ``utils.torch_functional``."""
    from rlflow.trainer.ppo import core_algos, ray_trainer
    from rlflow.utils import torch_functional

    assert core_algos.compute_gae_advantage_return.__module__ == "rlflow.algos.advantages"
    assert core_algos.register_adv_est is not None and core_algos.agg_loss is not None
    assert ray_trainer.RayPPOTrainer.__module__ == "rlflow.trainer.ray_trainer"
    assert torch_functional.masked_whiten is not None


def test_files_stay_small():
    """Files of the package under ~600 lines (STYLE: one file per role, each small)."""
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 620
    }
    assert not long, long

"""The house runs one way: no import cycle in lit_compute (function-level imports included), every module imports
alone, no grab-bag module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lit_compute"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every lit_compute module ``name`` imports, at any depth of the file (inside functions too)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_has_no_cycle_even_counting_imports_inside_functions():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    # a package's __init__ re-exporting its own modules is the one edge that points back up by design
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"
    # and the floors the architecture page states
    assert graph["lit_compute.timeline"] <= {
        "lit_compute._batch",
        "lit_compute._compat",
        "lit_compute.collective_clock",
    }
    assert graph["lit_compute.collective_clock"] == set()
    assert graph["lit_compute._batch"] <= {"lit_compute._validate"}
    for ground in (
        "lit_compute._compat",
        "lit_compute.formatting",
        "lit_compute.tensorboard_layout",
        "lit_compute.figures",
    ):
        assert graph[ground] == set(), ground
    assert "lit_compute.monitoring.prometheus_logger" not in graph["lit_compute.writer"]
    report = set().union(*(graph[m] for m in MODULES if m.startswith("lit_compute.report")))
    assert {m for m in report if not m.startswith("lit_compute.report")} == {
        "lit_compute.formatting",
        "lit_compute.run_record",
    }


#: The floors, lowest first: a module imports only from floors below its own (or from its own package). The
#: components share floor 5 and never import each other; the commands are ordered among themselves.
FLOORS = [
    {
        "_compat",
        "_validate",
        "formatting",
        "files",
        "figures",
        "tensorboard_layout",
        "collective_clock",
        "cpu_load",
        "packaged_configs",
        "warm_start",
    },
    {"hardware", "run_record", "_batch", "model_state", "agreement"},
    {"timeline"},
    {"writer"},
    {"callback"},
    {"flops", "memory", "monitoring", "profiling", "precision", "distributed", "data", "models", "speedup"},
    {"_lightning_cli", "report"},
    {"planning"},
    {"tuning"},
    {"bench"},
    {"cli", "(root)"},
]


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _floor(module: str) -> int:
    room = _room(module)
    return next(i for i, rooms in enumerate(FLOORS) if room in rooms)


def test_every_import_runs_down_a_floor():
    """0 upward imports: every module of lit_compute has a floor, and each import goes to a lower one (or stays in its
    own package). Tuning and planning never import the benches; nothing below the commands imports planning; figure
    headers come from the ground floor."""
    unplaced = sorted({_room(m) for m in MODULES if not any(_room(m) in rooms for rooms in FLOORS)})
    assert not unplaced, f"modules with no floor (add them to FLOORS and docs/architecture.md): {unplaced}"
    upward = [
        f"{name} -> {target}"
        for name, path in MODULES.items()
        for target in _imports(name, path)
        if _room(name) != _room(target) and _floor(target) >= _floor(name) and not name.startswith(target + ".")
    ]  # the package re-exporting its modules: by design
    assert upward == []
    for name, path in MODULES.items():
        targets = {_room(t) for t in _imports(name, path)}
        if _room(name) in ("tuning", "planning"):
            assert "bench" not in targets, name
        if _floor(name) < _floor("lit_compute.planning"):
            assert "planning" not in targets, name
    assert "def figure_header" not in (PACKAGE / "bench" / "_common.py").read_text()
    assert "def figure_header" in (PACKAGE / "figures.py").read_text()


def test_the_floor_check_finds_an_upward_import():
    assert _floor("lit_compute.hardware.chips") < _floor("lit_compute.writer") < _floor("lit_compute.flops.peaks")
    assert _floor("lit_compute.tuning.tune") < _floor("lit_compute.bench._common")


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.slow
def test_every_module_imports_alone(tmp_path):
    """Each module imported first in a clean set of lit_compute modules (one interpreter, torch kept loaded)."""
    script = (
        "import importlib, sys, traceback\n"
        "import torch, lightning.pytorch  # noqa: F401 - heavy and cycle-free: loaded once\n"
        f"names = {sorted(MODULES)!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m == 'lit_compute' or m.startswith('lit_compute.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed.append(name + ': ' + traceback.format_exc().splitlines()[-1])\n"
        "print('FAILED', failed)\n"
    )
    from .conftest import run_script  # a process of its own that has not imported lit_compute

    result = run_script(tmp_path, script, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "FAILED []" in result.stdout, result.stdout[-3000:]


def test_no_grab_bag_module():
    assert not [p for p in PACKAGE.rglob("*.py") if p.stem in {"_utils", "utils", "helpers", "misc"}]

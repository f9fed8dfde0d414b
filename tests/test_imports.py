"""The house runs one way: no import cycle in lit_compute (function-level imports included), every module imports
alone, no grab-bag module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
                return [*stack[stack.index(nxt):], nxt]
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
    assert graph["lit_compute.timeline"] <= {"lit_compute._batch", "lit_compute._compat", "lit_compute.collective_clock"}
    assert graph["lit_compute.collective_clock"] == set()
    assert graph["lit_compute._batch"] <= {"lit_compute._validate"}
    for ground in ("lit_compute._compat", "lit_compute.formatting", "lit_compute.tensorboard_layout"):
        assert graph[ground] == set(), ground
    assert "lit_compute.monitoring.prometheus_logger" not in graph["lit_compute.writer"]
    report = set().union(*(graph[m] for m in MODULES if m.startswith("lit_compute.report")))
    assert {m for m in report if not m.startswith("lit_compute.report")} == {"lit_compute.formatting"}


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_imports_alone():
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
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILED []" in result.stdout, result.stdout[-3000:]


def test_no_grab_bag_module():
    assert not [p for p in PACKAGE.rglob("*.py") if p.stem in {"_utils", "utils", "helpers", "misc"}]

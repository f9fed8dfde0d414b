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
        "intervals",
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


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
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


#: the rooms whose modules grew by branches until they were split part by part (#67): a module past this many lines
#: there is split the same way (docs/architecture.md), not grown
SPLIT_ROOMS, MAX_LINES = ("planning", "bench"), 450


def test_no_module_in_the_split_rooms_grows_past_its_limit():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for room in SPLIT_ROOMS
        for p in sorted((PACKAGE / room).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}; split by part (docs/architecture.md)"


# -- private names of other packages ------------------------------------------------------------------------------
#: Every private torch, Lightning or CPython name reached outside ``_compat.py``, as data: (file, name) -> why it
#: cannot move behind ``_compat.py``. A new one fails the test below; move it into ``_compat.py`` (one wrapper, one
#: docstring) unless it is one of these kinds: a subclass reading its parent's own attributes, torch's profiler
#: internals in the reference measurement, the collectives the clock wraps, or what an exiting interpreter runs.
ALLOWED_PRIVATE = {
    ("lit_compute/_lightning_cli.py", "_parser"): "LightningCLI's own subcommand parser, read by our subclass of it",
    ("lit_compute/bench/memory_reference.py", "_memory_profile"): "the reference: torch's memory profiler's timeline",
    ("lit_compute/bench/memory_reference.py", "_coalesce_timeline"): "the reference: torch's memory profiler's "
    "timeline, as torch's own memory-profile tests read it",
    ("lit_compute/bench/memory_reference.py", "torch.profiler._memory_profiler.MemoryProfileTimeline"): "the "
    "reference: the class torch.profiler's export_memory_timeline builds",
    ("lit_compute/collective_clock.py", "_broadcast_coalesced"): "DDP's parameter broadcast, wrapped to be clocked",
    ("lit_compute/collective_clock.py", "torch.distributed._functional_collectives"): "DTensor's collectives (tensor "
    "parallelism), wrapped to be clocked",
    ("lit_compute/distributed/tuned_ddp.py", "_ddp_kwargs"): "a DDPStrategy subclass reading its parent's own",
    ("lit_compute/distributed/tuned_ddp.py", "_ddp_comm_hook"): "a DDPStrategy subclass reading its parent's own",
    ("lit_compute/distributed/tuned_ddp.py", "_process_group_backend"): "a DDPStrategy subclass reading its parent's",
    ("lit_compute/distributed/tuned_ddp.py", "_start_method"): "a DDPStrategy subclass reading its parent's own",
    ("lit_compute/flops/counting.py", "_FlopCounterMode"): "the dispatch mode torch's FlopCounterMode enters, which "
    "SafeFlopCounterMode extends (torch >= 2.5)",
    ("lit_compute/flops/counting.py", "_overloadpacket"): "the key torch.utils.flop_counter's registry is keyed on",
    ("lit_compute/flops/counting.py", "_ops"): "torch._ops.OpOverload, the type the flop_counter registry holds",
    ("lit_compute/flops/counting.py", "_getframe"): "CPython: which frame runs the recomputed forward of a checkpoint",
    ("lit_compute/flops/module_tracker.py", "_get_mod_name"): "a ModuleTracker subclass calling its parent's own",
    ("lit_compute/precision/fp32_batchnorm_precision.py", "_desired_input_dtype"): "a MixedPrecision subclass reading "
    "its parent's own",
    ("lit_compute/precision/fp32_batchnorm_precision.py", "_module_classes_to_ignore"): "a field of torch FSDP's "
    "MixedPrecision, which FP32 norms extend as torch's docs say",
    ("lit_compute/precision/fp32_batchnorm_precision.py", "_buffers"): "nn.Module's buffers, cast in place (what "
    "Module._apply does) so the norm's running statistics stay the same objects",
    ("lit_compute/warm_start.py", "_shutdown"): "CPython: a forked child runs at exit what an interpreter would",
    ("lit_compute/warm_start.py", "_run_exitfuncs"): "CPython: a forked child runs at exit what an interpreter would",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _our_names() -> set[str]:
    """Every name lit_compute defines anywhere (functions, classes, attributes it assigns, arguments): a private
    attribute among them is ours, not another package's."""
    own: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif _attribute_call(node, "setattr"):
                own.add(node.args[1].value)  # type: ignore[attr-defined]
    return own


def _attribute_call(node: ast.AST, *functions: str) -> bool:
    """``getattr(x, "name", ...)`` and the like, with the name as a string constant."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in functions
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def private_names(path: Path, own: set[str]) -> set[str]:
    """The private names of other packages ``path`` reaches: imported from a private module or by a private name,
    or a private attribute (``x._name``, ``getattr(x, "_name")``) that lit_compute defines nowhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if not a.name.startswith("lit_compute") and _dotted_private(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("lit_compute"):
            module = node.module or ""
            found |= {f"{module}.{a.name}" for a in node.names if _dotted_private(module) or _private(a.name)}
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            found.add(node.attr)
        elif _attribute_call(node, "getattr", "hasattr", "setattr", "delattr"):
            name = node.args[1].value  # type: ignore[attr-defined]
            if _private(name) and name not in own:
                found.add(name)
    return found


def _dotted_private(module: str) -> bool:
    return any(_private(part) for part in module.split("."))


def test_private_names_of_other_packages_stay_in_compat_or_on_the_list():
    own = _our_names()
    found = {
        (str(path.relative_to(PACKAGE.parent)), name)
        for module, path in MODULES.items()
        if module != "lit_compute._compat"
        for name in private_names(path, own)
    }
    new = sorted(found - ALLOWED_PRIVATE.keys())
    assert not new, (
        f"private names outside _compat.py (move them behind a _compat function, or list them with why): {new}"
    )
    stale = sorted(ALLOWED_PRIVATE.keys() - found)
    assert not stale, f"listed private names no longer used (take them off ALLOWED_PRIVATE): {stale}"


def test_the_private_name_finder_sees_each_way_of_reaching_one(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "import torch._dynamo\n"
        "from torch.utils._pytree import tree_map\n"
        "from torch.nn.modules.batchnorm import _BatchNorm\n"
        "from lit_compute._compat import tree_leaves\n"
        "x = trainer._checkpoint_connector\n"
        "y = getattr(model, '_orig_mod', None)\n"
        "z = self._table_logged\n"  # lit_compute's own: not reported
        "w = obj.__class__\n"
    )
    assert private_names(source, _our_names()) == {
        "torch._dynamo",
        "torch.utils._pytree.tree_map",
        "torch.nn.modules.batchnorm._BatchNorm",
        "_checkpoint_connector",
        "_orig_mod",
    }


# -- data files ---------------------------------------------------------------------------------------------------
def _anchor(expr: ast.expr, here: Path) -> Path | None:
    """The path an expression built from ``Path(__file__)`` names (``.resolve()``, ``.parent``, ``.parents[k]``,
    ``.with_name("x")``), with ``here`` as ``__file__``; None for any other expression."""
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Name) and func.id == "Path" and len(expr.args) == 1:
            arg = expr.args[0]
            return here if isinstance(arg, ast.Name) and arg.id == "__file__" else None
        if isinstance(func, ast.Attribute) and func.attr == "resolve":
            return _anchor(func.value, here)
        if isinstance(func, ast.Attribute) and func.attr == "with_name" and expr.args:
            base, name = _anchor(func.value, here), expr.args[0]
            ok = isinstance(name, ast.Constant) and isinstance(name.value, str)
            return base.with_name(name.value) if base is not None and ok else None  # type: ignore[union-attr]
    if isinstance(expr, ast.Attribute) and expr.attr == "parent":
        base = _anchor(expr.value, here)
        return base.parent if base is not None else None
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "parents":
        base, index = _anchor(expr.value.value, here), expr.slice
        ok = isinstance(index, ast.Constant) and isinstance(index.value, int)
        return base.parents[index.value] if base is not None and ok else None  # type: ignore[union-attr]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        base, name = _anchor(expr.left, here), expr.right
        if base is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
            return base / name.value
    return None


def data_reads_across_rooms(path: Path, package: Path) -> list[str]:
    """The files and folders of ``package`` that ``path`` names through ``Path(__file__)`` outside its own folder: a
    module reads the data of its own room only (a file another room keeps is that room's to read and hand over)."""
    found = []
    own = path.resolve().parent
    for node in ast.walk(ast.parse(path.read_text())):
        target = _anchor(node, path.resolve()) if isinstance(node, ast.expr) else None
        if target is None or package not in (target, *target.parents):
            continue
        if own != target and own not in target.parents and target not in own.parents:
            found.append(f"{path.relative_to(package.parent)}:{node.lineno} reads {target.relative_to(package.parent)}")
    return sorted(set(found))


@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_no_module_reads_a_data_file_another_room_keeps():
    found = [line for path in MODULES.values() for line in data_reads_across_rooms(path, PACKAGE)]
    assert not found, f"data files read across rooms (move the file beside its reader, or pass it in): {found}"


def test_the_data_file_finder_sees_a_read_across_rooms(tmp_path):
    package = tmp_path / "lit_compute"
    (package / "planning").mkdir(parents=True)
    probe = package / "planning" / "probe.py"
    probe.write_text(
        "from pathlib import Path\n"
        "ACROSS = Path(__file__).resolve().parents[1] / 'bench' / 'published.json'\n"
        "OWN = Path(__file__).with_name('mine.json')\n"
        "ROOT = Path(__file__).resolve().parents[2] / 'docs'\n"  # outside the package: the repository's
    )
    assert data_reads_across_rooms(probe, package) == [
        "lit_compute/planning/probe.py:2 reads lit_compute/bench",
        "lit_compute/planning/probe.py:2 reads lit_compute/bench/published.json",
    ]

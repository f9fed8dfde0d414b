"""No test can fail because the machine is slow or busy (#48): read every test file's syntax tree and find

- an ``assert`` that compares a clock reading (``time.perf_counter``, ``monotonic``, ``time.time``, ``process_time``,
  called in the assertion or earlier in the same function and carried through variables): timings are measured by
  ``lit-compute bench``, and a test drives the clock (``DrivenClock``) instead;
- an ``assert`` that puts a wall-clock figure (a name or a logged tag in ms or seconds, a step time) under an upper
  bound given as a number: a sleep guarantees at least its length, never at most.

Waiting loops (``while time.monotonic() < deadline``) and timeouts are not assertions and are left alone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}
# a wall-clock figure by its name: step_ms, wall_s, elapsed, seconds, "time/step_ms", "rank/1/forward_ms"
TIMED_NAME = re.compile(r"(_ms|_s|_sec|_secs|seconds|elapsed|duration|wall)$|^time/.*_(ms|s)$")
# a share of wall-clock time (data wait, communication, the profiler's data loading): capped below 1 it is a threshold
TIME_SHARE = re.compile(r"(wait|data|dataloader|comm|stall|exposed)_fraction$")


def _is_clock_call(node: ast.AST) -> bool:
    """``time.perf_counter()``, ``perf_counter()`` and the like (not a driven clock object called as ``clock()``)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _clock_names(function: ast.AST) -> set[str]:
    """Names in ``function`` bound to a clock reading, or to anything computed from one (to a fixed point)."""
    tainted: set[str] = set()
    assigns = [n for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    changed = True
    while changed:
        changed = False
        for node in assigns:
            value = node.value
            if value is None or not (any(_is_clock_call(n) for n in ast.walk(value)) or _names(value) & tainted):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in set().union(*(_names(t) for t in targets)) - tainted:
                tainted.add(name)
                changed = True
    return tainted


def _timed_figure(node: ast.AST, share_cap_is_one: bool = False) -> str | None:
    """The wall-clock figure ``node`` reads by name, if any: a variable, an attribute or a logged tag string (a share
    of time only when its bound is not 1, which every share meets by definition)."""
    for sub in ast.walk(node):
        name = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else sub.value
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
            else None
        )
        if name and (TIMED_NAME.search(name) or (TIME_SHARE.search(name) and not share_cap_is_one)):
            return name
    return None


def _is_number(node: ast.AST) -> bool:
    return all(
        isinstance(n, (ast.Constant, ast.UnaryOp, ast.BinOp, ast.operator, ast.unaryop))
        and (not isinstance(n, ast.Constant) or isinstance(n.value, (int, float)))
        for n in ast.walk(node)
    )


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 1


def _upper_bounds(compare: ast.Compare) -> list[tuple[ast.AST, ast.AST]]:
    """(bounded, bound) pairs of a comparison chain: ``a < b`` bounds a by b, ``a > b`` bounds b by a."""
    pairs = []
    left = compare.left
    for op, right in zip(compare.ops, compare.comparators):
        if isinstance(op, (ast.Lt, ast.LtE)):
            pairs.append((left, right))
        elif isinstance(op, (ast.Gt, ast.GtE)):
            pairs.append((right, left))
        left = right
    return pairs


def wall_clock_thresholds(source: str, filename: str = "<test>") -> list[str]:
    """Every assertion in ``source`` that compares a clock reading or bounds a wall-clock figure from above by a
    number, as "file:line: why"."""
    found = []
    tree = ast.parse(source, filename)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:
        tainted = _clock_names(function)
        for node in ast.walk(function):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                if any(_is_clock_call(n) for n in ast.walk(compare)) or _names(compare) & tainted:
                    found.append(f"{filename}:{node.lineno}: compares a clock reading")
                    break
                figure = next(
                    (
                        name
                        for a, bound in _upper_bounds(compare)
                        if _is_number(bound)
                        for name in [_timed_figure(a, _is_one(bound))]
                        if name
                    ),
                    None,
                )
                if figure:
                    found.append(f"{filename}:{node.lineno}: puts {figure!r} under a fixed upper bound")
                    break
    return found


def test_no_test_asserts_on_a_clock_reading_or_caps_a_wall_clock_figure():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        found += wall_clock_thresholds(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, (
        "wall-clock thresholds in tests (drive the clock with DrivenClock, or compare two figures of "
        "one run):\n" + "\n".join(found)
    )


def test_the_search_finds_each_kind_of_threshold():
    """The finder itself: each shape a wall-clock threshold takes is found, and honest assertions are not."""
    caught = """
import time
def test_a():
    start = time.perf_counter()
    work()
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0
def test_b():
    assert time.monotonic() - t0 <= 1
def test_c(acc):
    time.sleep(0.5)
    assert last(acc, "time/step_ms") < 900
def test_d(result):
    assert 0 < result.wall_s <= 30
def test_f(acc):
    assert last(acc, "profiler/dataloader_fraction") <= 0.3
"""
    assert [line.split(": ", 1)[1] for line in wall_clock_thresholds(caught)] == [
        "compares a clock reading",
        "compares a clock reading",
        "puts 'time/step_ms' under a fixed upper bound",
        "puts 'wall_s' under a fixed upper bound",
        "puts 'profiler/dataloader_fraction' under a fixed upper bound",
    ]
    honest = """
import time
def test_e(acc, clock, result):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
    assert last(acc, "rank/1/data_wait_ms") > 10 * last(acc, "rank/0/data_wait_ms")
    assert result.wall_s >= 8.0
    assert last(acc, "time/data_wait_ms") == 2.0
    assert last(acc, "rank/0/comm_wait_ms") < last(acc, "rank/1/step_ms")
    assert 0 < fraction <= 1
    assert 0 < last(acc, "profiler/comm_fraction") <= 1
"""
    assert wall_clock_thresholds(honest) == []

"""The suite's tiers (CONTRIBUTING.md): CI runs the command README.md names for the tests, and that command runs
every tier, so a test marked ``heavy`` (left out of ``make test``) still runs on every push."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_targets() -> dict[str, list[str]]:
    """Each Makefile target's recipe lines (tab-indented), by target name."""
    targets: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
            continue
        match = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)
        current = targets.setdefault(match.group(1), []) if match else None
    return targets


def readme_test_command() -> str:
    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| **tests**")]
    return row.rstrip(" |").rsplit("|", 1)[1].strip().strip("`")


def test_ci_runs_the_readme_test_command_and_it_runs_every_tier():
    command = readme_test_command()
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [command]
    target = command.removeprefix("make ")
    recipe = " ; ".join(make_targets()[target])
    assert "make --no-print-directory test" in recipe.replace("$(MAKE)", "make")
    assert "make --no-print-directory test-heavy" in recipe.replace("$(MAKE)", "make")


def test_the_tiers_split_the_suite_by_marker():
    targets = make_targets()
    pytest_line = {
        name: next(line for line in targets[name] if "-m pytest" in line)
        for name in ("test", "test-fast", "test-heavy")
    }
    assert '-m "not heavy"' in pytest_line["test"]
    assert '-m "not slow and not heavy"' in pytest_line["test-fast"]
    assert pytest_line["test-heavy"].endswith("-m heavy")
    markers = (ROOT / "pyproject.toml").read_text()
    assert '"heavy: ' in markers
    assert '"slow: ' in markers

"""Every ``>>>`` example in lit_compute's docstrings runs, as the standard library's doctest runs it (#66): an example
that raises, or prints other than it shows, fails here and names the module and the line. Run in the fast tier.

A test, not pytest's ``--doctest-modules``: that flag imports every ``.py`` file under the paths it is given, and
``tests/`` holds scripts that train when imported."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lit_compute"


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text():
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_package_has_examples_to_run():
    assert len(MODULES) >= 20, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_docstring_example_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes (a Trainer's logs) writes here, not into the checkout
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    # an example the finder misses (``>>>x``, an example in a comment) is one nobody runs
    found = sum(len(t.examples) for t in tests)
    assert found == module_prompt_count(module), f"{name}: {found} example(s) found, the source has more '>>> '"
    lines: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test, out=lines.append)
    assert runner.failures == 0, "".join(lines)


def module_prompt_count(module: object) -> int:
    """``>>> `` prompts in the module's own source file (examples start with one; continuation lines use ``...``)."""
    source = Path(str(getattr(module, "__file__", ""))).read_text()
    return sum(line.lstrip().startswith(">>> ") for line in source.splitlines())

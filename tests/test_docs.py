"""The docs as a reader meets them (#38): the site builds with --strict, README.md fits on a screen and its links
resolve, every figure file says which command wrote it at which commit, and no measured number in README.md or a
docs page lacks one of those files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = sorted((ROOT / "docs" / "figures").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

# What a measurement looks like in prose: a number with a unit of time, rate, size or share, or a ratio (2.02x).
UNITS = (
    r"ms|us|s|sec|seconds|min|minutes|h|hours|[GMT]?FLOP/s|[KMG]i?B|samples/s|tokens/s|images/s|"
    r"device-hours|%"
)
MEASURE = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?(?:\s?(?:" + UNITS + r")(?![\w/])|x(?![\w]))")
HEADER = re.compile(
    r"<!-- written by `(lit-compute [^`]+|scripts/[^`]+)` at commit ([0-9a-f]{7,40})( with uncommitted "
    r"changes)? on (\d{4}-\d\d-\d\d \d\d:\d\d UTC); machine: (.+) -->"
)

# Numbers that are not measurements (defaults, thresholds and tolerances the code or a test states), each excused
# only where it stands: the page and a snippet of its prose around the number (an entry whose snippet is gone fails)
#: the threshold of the heavy marker: a rule (pyproject.toml, CONTRIBUTING.md), not a measurement
HEAVY_RULE = "the rule for the heavy marker"
NOT_MEASURED = {
    ("docs/distributed.md", "a 25x step among"): "the driven-clock spike the layouts test sets up "
    "(tests/distributed/scripts/parallel_layouts.py), not a measurement",
    ("docs/guarantees.md", "0.2 s of metric computing"): "the driven-clock test's set-up (tests/test_timeline.py)",
    ("docs/memory.md", "within 5%"): "the Mixtral test's tolerance (tests/planning/test_estimate.py), not a figure",
    ("docs/tune.md", "95% interval is within +-3%"): "the trial's confidence interval and its target width "
    "(TrialRecorder)",
    (
        "docs/tune.md",
        "the ratio's 95% interval",
    ): "the confidence level of the tune's paired intervals (tuning/search.py)",
    ("docs/tune.md", "(3%), rejected"): "--min-gain's default (tuning/tune.py)",
    ("docs/tune.md", "3% until it has"): "the tune's prior run-to-run spread (tuning/search.py Options.run_noise)",
    ("docs/tune.md", "(+5% at most"): "the budget's allowance for the last trial (tuning/tune.py)",
    ("docs/tune.md", "(5%) of the baseline"): "--loss-tolerance's default (tuning/tune.py)",
    ("docs/tune.md", "(35%: early"): "--trajectory-tolerance's default (tuning/tune.py)",
    ("docs/tune.md", "at least 1.2x"): "the bf16 rule's threshold (hardware/this_machine.py BF16_FAST_RATIO)",
    ("docs/distributed.md", "(25%) of the step"): "StepTimeMonitor's comm_fraction default",
    ("docs/metrics.md", "(25%) of the step"): "StepTimeMonitor's comm_fraction default",
    ("docs/benchmarks.md", "with a 95% interval"): "the confidence level of bench configs' paired intervals",
    ("CHANGELOG.md", "pair's 95% interval"): "the confidence level of the tune's paired intervals (tuning/search.py)",
    ("CHANGELOG.md", "with a 95% interval"): "the confidence level of bench configs' paired intervals",
    ("CHANGELOG.md", "A100 40GB device name"): "part of a device's name (NVIDIA A100-SXM4-40GB)",
    ("docs/flops.md", "under 1 TFLOP/s"): "the rate below which FLOP/s are also written in GFLOP/s (writer.py)",
    ("docs/memory.md", "all within 10%"): "the tolerance tests/planning/test_estimate.py asserts",
    ("docs/memory.md", "and 300 seconds"): "the CPU build's time limit (planning/estimate/pieces.py BUILD_SECONDS)",
    ("docs/memory.md", "pools, 2 MiB and 20 MiB segments"): "the CUDA caching allocator's segment sizes "
    "(memory/caching_allocator.py)",
    ("docs/whatif.md", "at 80% of the"): "the link efficiency whatif assumes (whatif/calibration.py)",
    ("docs/whatif.md", "links: 80%"): "the link efficiency whatif assumes (whatif/calibration.py)",
    ("docs/whatif.md", "bandwidth: 85%"): "the memory-bandwidth efficiency whatif assumes (DEFAULT_EFFICIENCY)",
    ("docs/whatif.md", "bytes at 85% of the"): "the memory-bandwidth efficiency whatif assumes (DEFAULT_EFFICIENCY)",
    ("docs/whatif.md", "two counted steps (within 15%"): "the transposes check's goal (TRANSPOSES_GOAL, bench gpu)",
    ("docs/whatif.md", "(within 15% for this CPU's"): "the issue's goal the table is read against",
    ("docs/whatif.md", "25% for the collectives"): "the issue's goal the table is read against",
    ("docs/whatif.md", "two ranks, 30% for"): "the issue's goal the table is read against",
    ("docs/whatif.md", "against the 30% goal"): "the issue's goal the table is read against",
    ("docs/guarantees.md", "write of 0.3 s"): "a driven clock's logger write in tests/test_timeline.py (an input)",
    ("docs/guarantees.md", "data wait 2.0 ms"): "what tests/test_timeline.py asserts on its driven clock (4 x 0.5 ms)",
    ("docs/guarantees.md", "step 52 ms"): "what tests/test_timeline.py asserts on its driven clock",
    ("docs/guarantees.md", "real step within 10%"): "the tolerance tests/planning/test_estimate.py asserts",
    ("docs/guarantees.md", "at 60 MB and 10 MB"): "capacities tests/planning/test_estimate.py gives (inputs)",
    ("docs/guarantees.md", "with 40 MB free"): "the free memory tests/planning/test_estimate.py drives (an input)",
    ("docs/guarantees.md", "scale at most 2x"): "the bound tests/planning/test_whatif.py asserts for two nodes",
    ("docs/memory.md", "more than 2% under it"): "a test tolerance (tests/planning/test_estimate.py)",
    ("CHANGELOG.md", "within the issue's 5%"): "#69's goal, which tests/planning/test_estimate.py asserts",
    ("CHANGELOG.md", "than its 2% under"): "#69's goal, which tests/planning/test_estimate.py asserts",
    ("docs/metrics.md", "(the lower end of a 95% Student"): "the straggler confidence (rank_skew.py)",
    (
        "docs/distributed.md",
        "1.3-1.6x either way",
    ): "the driven-clock test's inputs (tests/monitoring/test_rank_skew.py)",
    (
        "docs/distributed.md",
        "about 2x slower at every",
    ): "the driven-clock test's input (tests/monitoring/test_rank_skew.py)",
    ("docs/distributed.md", "(the lower end of a 95% Student"): "the straggler confidence (rank_skew.py)",
    ("README.md", "about 10 s of CPU"): HEAVY_RULE,
    ("CHANGELOG.md", "about 10 s of CPU"): HEAVY_RULE,
}
# a page cites a figure file by including it (--8<--), linking it or naming it; README.md's commands lines are
# commands.md's (scripts/time_commands.py writes both)
CITES = re.compile(r"figures/([\w.-]+\.md)")


def _prose(text: str) -> str:
    """The text a reader reads as prose: fenced blocks, inline code, HTML comments and link targets removed."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_the_measurement_pattern_finds_measurements_and_leaves_words_alone():
    found = [
        m.group(0)
        for m in MEASURE.finditer(
            "took 8.4 minutes (503 s), 1.016 ratio, 2.02x faster, +-2.9%, "
            "45.49 ms, 8,325 tokens/s, 2.14 GB, 777 GFLOP/s"
        )
    ]
    assert found == ["8.4 minutes", "503 s", "2.02x", "-2.9%", "45.49 ms", "8,325 tokens/s", "2.14 GB", "777 GFLOP/s"]
    assert not MEASURE.findall("ResNet-50 v1.5, layer4, 2 x 1 nodes, bf16, x86, H100, step 20, batch 32")


def test_every_figure_file_names_its_command_commit_date_and_machine():
    assert FIGURES, "docs/figures/ holds no figure file"
    for figure in FIGURES:
        first = figure.read_text().splitlines()[0] if figure.read_text() else ""
        assert HEADER.fullmatch(first), f"{figure.relative_to(ROOT)} lacks the figure header: {first[:200]!r}"


def _cited(page: Path) -> dict[str, str]:
    """The figure files ``page`` cites, by name, with their text."""
    text = page.read_text()
    names = set(CITES.findall(text)) | ({"commands.md"} if "<!-- commands:start -->" in text else set())
    return {f.name: f.read_text() for f in FIGURES if f.name in names}


def _as_written(number: str) -> re.Pattern[str]:
    """``number`` with its unit as a whole figure: "8.4 minutes" is not found in "18.4 minutes" or "8.4 minutes/s"."""
    return re.compile(r"(?<![\w.])[+-]?" + re.escape(number) + r"(?![\w/]|\.\d)")


def _unsourced(name: str, prose: str, cited: dict[str, str]) -> tuple[list[str], set[tuple[str, str]]]:
    """The measured numbers of one page's prose found in none of the figure files it cites (with their unit), and the
    NOT_MEASURED entries that excused one."""
    unsourced, used = [], set()
    for number in MEASURE.finditer(prose):
        text = number.group(0).lstrip("+-")
        excuse = next(
            (
                (page, snippet)
                for page, snippet in NOT_MEASURED
                if page == name
                for at in [m.start() for m in re.finditer(re.escape(snippet), prose)]
                if at <= number.start() and number.end() <= at + len(snippet)
            ),
            None,
        )
        if excuse:
            used.add(excuse)
        elif not any(_as_written(text).search(figure) for figure in cited.values()):
            unsourced.append(f"{name}: {text} (cites {sorted(cited) or 'no figure file'})")
    return unsourced, used


def test_a_figure_written_with_a_changed_script_says_its_commit_has_uncommitted_changes(tmp_path, monkeypatch):
    """The header's commit is the package's and scripts/'s: a figure scripts/straggler_runs.py wrote while that
    script differed from the commit said "at commit d43a675" alone."""
    from lit_compute import figures

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    monkeypatch.delenv("LIT_COMPUTE_COMMIT", raising=False)
    monkeypatch.setattr(figures, "__file__", str(clone / "lit_compute" / "figures.py"))
    assert "uncommitted" not in figures.commit_description()
    script = clone / "scripts" / "straggler_runs.py"
    script.write_text(script.read_text() + "\n# changed\n")
    assert figures.commit_description().endswith(" with uncommitted changes")


def test_every_measured_number_in_readme_and_docs_comes_from_a_figure_file_it_cites():
    unsourced, used = [], set()
    for page in PAGES:
        missing, excused = _unsourced(str(page.relative_to(ROOT)), _prose(page.read_text()), _cited(page))
        unsourced += missing
        used |= excused
    assert not unsourced, (
        "numbers with their unit in none of the figure files their page cites (write them with the "
        "command's --markdown and include or link that file, or say in NOT_MEASURED what they "
        "are):\n" + "\n".join(unsourced)
    )
    stale = sorted(set(NOT_MEASURED) - used)
    assert not stale, f"NOT_MEASURED entries whose snippet no longer holds the number on its page: {stale}"


def test_a_number_is_checked_with_its_unit_against_the_file_its_page_cites():
    figures = {"a.md": "took 8.4 minutes (503 s); 2.02x faster", "b.md": "18.4 minutes; 777 GFLOP/s"}
    prose = "took 8.4 minutes, 503 s, 503 ms, 2.02x, 777 GFLOP/s; a tolerance of 5% (the test's)"
    missing, _ = _unsourced("p.md", prose, {"a.md": figures["a.md"]})
    assert missing == [
        "p.md: 503 ms (cites ['a.md'])",
        "p.md: 777 GFLOP/s (cites ['a.md'])",
        "p.md: 5% (cites ['a.md'])",
    ]
    assert [m.split(": ")[1] for m in _unsourced("p.md", "8.4 minutes", {"b.md": figures["b.md"]})[0]] == [
        "8.4 minutes (cites ['b.md'])"
    ]  # "18.4 minutes" is another figure


def test_every_snippet_a_page_includes_exists():
    for page in PAGES:
        for include in re.findall(r'--8<-- "([^"]+)"', page.read_text()):
            assert (ROOT / include).is_file(), f"{page.relative_to(ROOT)} includes {include}, which does not exist"


def test_the_readme_fits_on_a_screen_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


@pytest.mark.skipif(
    shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
    reason="mkdocs is not installed: pip install -e '.[dev]'",
)
def test_the_docs_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    page = (tmp_path / "site" / "flops" / "index.html").read_text()
    assert "lit_compute.flops.FlopsLogger" in page  # the API reference rendered from the docstrings

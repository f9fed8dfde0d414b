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
UNITS = (r"ms|us|s|sec|seconds|min|minutes|h|hours|[GMT]?FLOP/s|[KMG]i?B|samples/s|tokens/s|images/s|"
         r"device-hours|%")
MEASURE = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?(?:\s?(?:" + UNITS + r")(?![\w/])|x(?![\w]))")
HEADER = re.compile(r"<!-- written by `(lit-compute [^`]+|scripts/[^`]+)` at commit ([0-9a-f]{7,40})( with uncommitted "
                    r"changes)? on (\d{4}-\d\d-\d\d \d\d:\d\d UTC); machine: (.+) -->")

# Numbers that are not measurements: defaults, thresholds and tolerances the code or a test states, each with where.
NOT_MEASURED = {
    ("docs/tune.md", "95%"): "the trial's confidence interval (TrialRecorder)",
    ("docs/tune.md", "3%"): "--min-gain's default and the interval's target width (tuning/tune.py)",
    ("docs/tune.md", "5%"): "--loss-tolerance's default and the budget's allowance for the last trial (tuning/tune.py)",
    ("docs/tune.md", "35%"): "--trajectory-tolerance's default (tuning/tune.py)",
    ("docs/distributed.md", "25%"): "StepTimeMonitor's comm_fraction default (monitoring/step_time_monitor.py)",
    ("docs/metrics.md", "25%"): "StepTimeMonitor's comm_fraction default (monitoring/step_time_monitor.py)",
    ("CHANGELOG.md", "95%"): "the confidence level of the tune's paired intervals (tuning/search.py)",
    ("docs/flops.md", "1 TFLOP/s"): "the rate below which FLOP/s are also written in GFLOP/s (writer.py)",
    ("docs/memory.md", "5%"): "the tolerance tests/memory/test_memory_monitor.py asserts",
    ("docs/memory.md", "10%"): "the tolerance tests/planning/test_estimate.py asserts",
    ("docs/whatif.md", "80%"): "the link efficiency whatif assumes (planning/whatif.py DEFAULT_EFFICIENCY)",
    ("docs/whatif.md", "85%"): "the memory-bandwidth efficiency whatif assumes (planning/whatif.py DEFAULT_EFFICIENCY)",
    ("docs/whatif.md", "5 us"): "the kernel launch cost whatif assumes (planning/whatif.py)",
    ("docs/whatif.md", "1,200 images/s"): "a published result, cited with its source (NVIDIA DeepLearningExamples)",
    ("docs/whatif.md", "15%"): "the issue's goal the table is read against",
    ("docs/whatif.md", "25%"): "the issue's goal the table is read against",
    ("docs/whatif.md", "30%"): "the issue's goal the table is read against",
    ("CHANGELOG.md", "40GB"): "part of a device's name (NVIDIA A100-SXM4-40GB)",
    ("docs/guarantees.md", "0.3 s"): "a driven clock's logger write in tests/test_timeline.py (an input, not a measurement)",
    ("docs/guarantees.md", "2.0 ms"): "what tests/test_timeline.py asserts on its driven clock (4 items x 0.5 ms)",
    ("docs/guarantees.md", "52 ms"): "what tests/test_timeline.py asserts on its driven clock",
    ("docs/guarantees.md", "10%"): "the tolerance tests/planning/test_estimate.py asserts",
    ("docs/guarantees.md", "60 MB"): "a capacity tests/planning/test_estimate.py gives (an input)",
    ("docs/guarantees.md", "10 MB"): "a capacity tests/planning/test_estimate.py gives (an input)",
    ("docs/guarantees.md", "40 MB"): "the free memory tests/planning/test_estimate.py drives (an input)",
    ("docs/tune.md", "1.2x"): "the bf16 rule's threshold (hardware/this_machine.py BF16_FAST_RATIO)",
}


def _prose(text: str) -> str:
    """The text a reader reads as prose: fenced blocks, inline code, HTML comments and link targets removed."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_the_measurement_pattern_finds_measurements_and_leaves_words_alone():
    found = [m.group(0) for m in MEASURE.finditer("took 8.4 minutes (503 s), 1.016 ratio, 2.02x faster, +-2.9%, "
                                                  "45.49 ms, 8,325 tokens/s, 2.14 GB, 777 GFLOP/s")]
    assert found == ["8.4 minutes", "503 s", "2.02x", "-2.9%", "45.49 ms", "8,325 tokens/s", "2.14 GB",
                     "777 GFLOP/s"]
    assert not MEASURE.findall("ResNet-50 v1.5, layer4, 2 x 1 nodes, bf16, x86, H100, step 20, batch 32")


def test_every_figure_file_names_its_command_commit_date_and_machine():
    assert FIGURES, "docs/figures/ holds no figure file"
    for figure in FIGURES:
        first = figure.read_text().splitlines()[0] if figure.read_text() else ""
        assert HEADER.fullmatch(first), f"{figure.relative_to(ROOT)} lacks the figure header: {first[:200]!r}"


def test_every_measured_number_in_readme_and_docs_comes_from_a_figure_file():
    figures = "\n".join(f.read_text() for f in FIGURES)
    unsourced = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for number in MEASURE.finditer(_prose(page.read_text())):
            text = number.group(0).lstrip("+-")
            if text not in figures and (name, text) not in NOT_MEASURED:
                unsourced.append(f"{name}: {text}")
    assert not unsourced, ("numbers with no figure file that measured them (write them with the command's "
                           "--markdown, or say in NOT_MEASURED what they are):\n" + "\n".join(unsourced))


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


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed: pip install -e '.[dev]'")
def test_the_docs_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                              "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    page = (tmp_path / "site" / "flops" / "index.html").read_text()
    assert "lit_compute.flops.FlopsLogger" in page  # the API reference rendered from the docstrings

"""Time README.md's two commands on a fresh clone and write what was measured where the docs quote it.

    python scripts/time_commands.py            (from the repository root; takes as long as both commands)

Clones the current commit into a temporary folder (a fresh clone: no .venv, no caches of the repository's own),
runs ``make test``, then ``make test-fast``, then ``make test-heavy`` there (``make check``, CI's command, is ``make
test`` then ``make test-heavy``), then ``make demo`` in a second fresh clone, and writes ``docs/figures/commands.md``
under the figure header (the command, the commit, the date, the machine) with the 20 slowest tests of ``make test``
and of ``make test-heavy``, and the same summary lines between README.md's ``commands`` markers. Exits with the first
failing command's status, writing nothing then.

Cold caches: every cache the commands fill points into new, empty folders of the temporary one (uv's and pip's
downloads and unpacked wheels, XDG's, the package's own and the tests' data caches, torch's compile caches), so the
install downloads and unpacks every wheel as a new machine's CI run does; ``make test`` and ``make demo`` each get
their own clone and their own empty caches (neither runs on what the other set up). ``make test-fast`` then runs as a
contributor's loop runs it: in the suite's clone, after ``make test``, with what that set up.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return f"{cpu}, {os.cpu_count()} cores, load average before {os.getloadavg()[0]:.2f}"


#: the caches the two commands fill, each pointed at a new empty folder (see the module docstring)
CACHE_VARIABLES = (
    "UV_CACHE_DIR",
    "PIP_CACHE_DIR",
    "XDG_CACHE_HOME",
    "LIT_COMPUTE_CACHE",
    "PYTEST_LIT_COMPUTE_CACHE",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)


def cold_environment(root: Path) -> dict[str, str]:
    """This process's environment with every cache of :data:`CACHE_VARIABLES` in a new empty folder under ``root``."""
    env = dict(os.environ)
    for name in CACHE_VARIABLES:
        folder = root / name.lower()
        folder.mkdir(parents=True)
        env[name] = str(folder)
    return env


def timed(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, float, str]:
    """Run ``command``; its whole output goes to a log file in the temporary folder (named on the last line)."""
    start = time.monotonic()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    log = Path(tempfile.gettempdir()) / f"time_commands_{'_'.join(command)}.log"
    log.write_text(result.stdout + result.stderr)
    sys.stdout.write(result.stdout[-2000:] + result.stderr[-2000:] + f"\n(whole output: {log})\n")
    return result.returncode, time.monotonic() - start, result.stdout + result.stderr


def pytest_summary(out: str) -> str:
    """pytest's closing line in ``out`` as ``N passed, ... in S s of pytest``."""
    summary = re.findall(r"^=* ?(\d+ passed.*?) in ([\d.]+)s", out, flags=re.M)  # -q prints it without the rule
    return f"{summary[-1][0]} in {float(summary[-1][1]):.0f} s of pytest" if summary else "pytest's summary not found"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes ({seconds:.0f} s)"


def _write_readme_lines(readme: Path, lines: str) -> None:
    """Put ``lines`` between README.md's ``commands`` markers."""
    text = readme.read_text()
    start, end = "<!-- commands:start -->", "<!-- commands:end -->"
    readme.write_text(text[: text.index(start) + len(start)] + "\n" + lines + text[text.index(end) :])


def slowest_table(out: str, command: str) -> str:
    """pytest's ``--durations`` block of ``command`` (the 20 slowest tests, set up and call timed apart) as a
    markdown table; a line saying so when the output has none."""
    block = out.split("slowest 20 durations", 1)
    rows = re.findall(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$", block[1], flags=re.M)[:20] if len(block) > 1 else []
    if not rows:
        return f"`{command}` printed no durations.\n"
    lines = [
        f"The 20 slowest tests of `{command}` (pytest's `--durations=20`):",
        "",
        "| s | phase | test |",
        "|---:|---|---|",
    ]
    lines += [f"| {float(seconds):.1f} | {phase} | `{test}` |" for seconds, phase, test in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    where = machine()
    with tempfile.TemporaryDirectory(prefix="lit_compute_clone_") as tmp:
        clone = Path(tmp) / "suite"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = cold_environment(Path(tmp) / "caches_suite")
        # the clone's suite checks every figure file, this one included: it holds a line without figures while the
        # suite (the command being timed) runs
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        interim = "`make test` is being timed on a fresh clone with cold caches.\n"
        (clone / "docs" / "figures" / "commands.md").write_text(
            f"<!-- written by `scripts/time_commands.py` at commit {commit} on {date}; machine: {where} -->\n\n"
            + interim
        )
        _write_readme_lines(clone / "README.md", interim)  # the README quotes only what that file holds
        status, test_s, out = timed(["make", "test"], clone, env)
        if status:
            return status
        status, fast_s, fast_out = timed(["make", "test-fast"], clone, env)
        if status:
            return status
        status, heavy_s, heavy_out = timed(["make", "test-heavy"], clone, env)
        if status:
            return status
        demo = Path(tmp) / "demo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(demo)], check=True)
        status, demo_s, _ = timed(["make", "demo"], demo, cold_environment(Path(tmp) / "caches_demo"))
        if status:
            return status
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = (
        f"*On fresh clones at commit `{commit}`, each with cold caches of its own, {date}; {where}:* `make test` took "
        f"{minutes(test_s)} (the install, lint, type check and docs build, then {pytest_summary(out)}); then "
        f"`make test-fast` in the same clone took {minutes(fast_s)} ({pytest_summary(fast_out)}); then "
        f"`make test-heavy` took {minutes(heavy_s)} ({pytest_summary(heavy_out)}), so `make check` (CI's command: "
        f"`make test`, then `make test-heavy`) took {minutes(test_s + heavy_s)}; `make demo` took "
        f"{minutes(demo_s)} (the install, 2 epochs of the demo, its report).\n"
    )
    figures = ROOT / "docs" / "figures" / "commands.md"
    figures.write_text(
        f"<!-- written by `scripts/time_commands.py` at commit {commit} on {date}; machine: {where} "
        f"-->\n\n{lines}\n{slowest_table(out, 'make test')}\n{slowest_table(heavy_out, 'make test-heavy')}"
    )
    _write_readme_lines(ROOT / "README.md", lines)
    sys.stdout.write(f"written: {figures} and README.md\n{lines}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The header every figure file in the docs carries: the command that wrote it, the commit, the date, the machine.
Ground floor: the benches and the tune write figures; nothing here imports lit_compute."""

from __future__ import annotations

import os

__all__ = ["commit_description", "figure_header"]


def commit_description() -> str:
    """The commit the package's code and scripts/ are at ("abc1234", "abc1234 with uncommitted changes", "unknown"), or
    the one ``$LIT_COMPUTE_COMMIT`` names (a copy on a borrowed machine: the commit its sender named wins, as the
    copy's own git, if any, can be stale)."""
    import subprocess as sp

    try:
        here = os.path.dirname(os.path.abspath(__file__))  # the package folder
        commit = (
            sp.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, cwd=here
            ).stdout.strip()
            or "unknown"
        )
        changed = sp.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", "../scripts"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=here,
        ).stdout.strip()
        # the package's own code, or a script that writes figures (scripts/), differs from the commit: say so
        if commit != "unknown" and changed:
            commit += " with uncommitted changes"
    except (OSError, sp.SubprocessError):
        commit = "unknown"
    return os.environ.get("LIT_COMPUTE_COMMIT") or commit


def figure_header(command: str, machine: str) -> str:
    """The header every figure file in the docs carries: the command that wrote it, the commit, the date, the
    machine (a figure without it is not quoted)."""
    import datetime

    commit = commit_description()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"<!-- written by `{command}` at commit {commit} on {date}; machine: {machine} -->\n\n"
        f"*Written by `{command}` at commit `{commit}` on {date}; {machine}.*\n\n"
    )

"""``lit-compute report``: runs read back from their event files (:mod:`.runs`), advice (:mod:`.advice`), plots
(:mod:`.plots`) and the Markdown document with the command (:mod:`.document`)."""

from lit_compute.report.advice import advice
from lit_compute.report.document import build_report, comparison, main, run_section
from lit_compute.report.plots import write_plots
from lit_compute.report.runs import OUR_PREFIXES, ReportError, Run, find_runs, load_run, name_runs

__all__ = [
    "OUR_PREFIXES",
    "ReportError",
    "Run",
    "advice",
    "build_report",
    "comparison",
    "find_runs",
    "load_run",
    "main",
    "name_runs",
    "run_section",
    "write_plots",
]

"""``lit-compute report LOG_DIR [LOG_DIR ...]``: a Markdown run report with plots, advice and comparisons.

Reads the TensorBoard event files with tensorboard's own reader. Runs are named by their path from the
common folder of all runs reported (``exp_a/version_0`` and ``exp_b/version_0`` stay apart); folders with event
files but none of lit_compute's tags are skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lit_compute.formatting import flops_rate, human, markdown_table, percent
from lit_compute.report.advice import advice
from lit_compute.report.plots import write_plots
from lit_compute.report.runs import ReportError, Run, find_runs, load_run, name_runs
from lit_compute.run_record import RunRecord

__all__ = ["build_report", "comparison", "main", "run_section"]


def run_section(run: Run, plots: list[Path], report_dir: Path) -> list[str]:
    memory = run.maximum("device/torch_max_memory_allocated_gb")
    memory_label = "GPU allocator peak"
    if memory is None:
        memory, memory_label = run.maximum("device/rss_gb"), "process RSS peak"
    lines = [f"## {run.name}", "", f"`{run.path}`", ""]
    stopped = run.stopped_early()
    if stopped is not None:
        lines += [
            f"**Stopped early: at step {stopped[0]} of {stopped[1]}** (interrupted, failed or still running): "
            "its figures cover the steps it trained.",
            "",
        ]
    for note in run.notes:
        lines += [f"**Read with a fault:** {note}.", ""]
    peak = run.last("compute/peak_tflops")
    record = run.record
    rows = [
        ("model forward GFLOPs per sample", human(run.forward_gflops, 4)),
        ("figures over", _span(run)),
        ("mean step time (ms)", human(run.mean_step_ms)),
        ("p90 step time (ms)", human(run.mean("time/step_ms_p90"))),
        ("samples/s", human(run.samples_per_sec)),
    ]
    if run.tokens:
        rows += [
            ("tokens/s", human(run.total("time/tokens_per_sec"))),
            ("padding fraction", percent(run.mean("compute/padding_fraction"))),
        ]
    rows += [
        ("achieved (all ranks)", flops_rate(run.total("compute/global_tflops_per_sec"))),
        ("MFU", f"{percent(run.total('compute/mfu'))} of {flops_rate(peak)} peak per device"),
        ("HFU", percent(run.total("compute/hfu"))),
        ("data-wait fraction", percent(run.total("time/data_wait_fraction"))),
        (f"peak memory ({memory_label}, GB)", human(memory)),
        ("step peak memory per device (GB): parameters, gradients, optimizer, activations, other", _memory_parts(run)),
        ("precision", f"{record.precision} ({record.precision_plugin or 'n/a'})" if record else "n/a"),
        ("skipped optimizer steps", human(run.last("amp/skipped_steps"))),
        ("device", f"{_device(record)} x {record.world_size} ({record.strategy or 'n/a'})" if record else "n/a"),
    ]
    if record:
        rows += [
            ("parallel layout", f"{record.layout()} on {record.nodes} x {record.devices_per_node} nodes x devices")
        ]
    comm = run.mean("profiler/comm_fraction")
    if comm is not None:
        overlap = run.mean("profiler/comm_overlap_fraction")
        rows += [
            (
                "collectives (share of profiled steps, overlapped by compute)",
                f"{percent(comm)}{f', {percent(overlap)} overlapped' if overlap is not None else ''}",
            )
        ]
    if run.values("time/global_samples_per_sec"):
        rows.insert(5, ("samples/s (all ranks, each replica once)", human(run.total("time/global_samples_per_sec"))))
    lines += [markdown_table(["figure", "value"], [list(r) for r in rows]), ""]
    lines += rank_section(run)
    for tag, title in (("ddp/config", "DDP / NCCL configuration"), ("profiler/top_ops", "Profiler windows")):
        for text in run.texts.get(tag, []):
            lines += [f"### {title}", "", text, ""]
    tips = advice(run)
    lines += ["### Advice", ""] + ([f"- {t}" for t in tips] or ["- Nothing stands out."]) + [""]
    for p in plots:
        rel = p.relative_to(report_dir) if p.is_relative_to(report_dir) else p
        lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    return lines


def _device(record: RunRecord) -> str:
    return f"{record.device} ({record.chip})" if record.chip else record.device


def _memory_parts(run: Run) -> str:
    """MemoryMonitor's largest step peak and its parts (at the logging step of that peak), the headroom."""
    peaks = run.scalars.get("memory/peak_gb", [])
    if not peaks:
        return "n/a (add MemoryMonitor)"
    step, peak = max(peaks, key=lambda p: p[1])
    parts = [
        dict(run.scalars.get(f"memory/{p}_gb", [])).get(step)
        for p in ("parameters", "gradients", "optimizer", "activations", "other")
    ]
    text = f"{human(peak)}: " + ", ".join(human(v) for v in parts)
    headroom = dict(run.scalars.get("memory/headroom_gb", [])).get(step)
    return text + (f" ({human(headroom)} left)" if headroom is not None else "")


def rank_section(run: Run) -> list[str]:
    """Per-rank means of step time, data wait, forward and time blocked in collectives (StepTimeMonitor's
    ``rank/<r>/*``), the slowest marked (the most own work: data wait and forward less the forward's collectives,
    as :func:`~lit_compute.monitoring.rank_skew.find_straggler` has it), and the straggler advice when it fired."""
    ranks = sorted(
        {int(tag.split("/")[1]) for tag in run.scalars if tag.startswith("rank/") and tag.endswith("/step_ms")}
    )
    if len(ranks) < 2:
        return []
    logged = run.values("time/slowest_rank")
    own = {r: (run.mean(f"rank/{r}/data_wait_ms") or 0.0) + (run.mean(f"rank/{r}/forward_ms") or 0.0) for r in ranks}
    slowest = int(round(logged[-1])) if logged else max(ranks, key=lambda r: own[r])

    def comm(r: int) -> str:
        value = run.mean(f"rank/{r}/comm_wait_ms")
        return "n/a" if value is None else human(value)

    rows = [
        [
            f"{r}{' (slowest)' if r == slowest else ''}",
            human(run.mean(f"rank/{r}/step_ms")),
            human(run.mean(f"rank/{r}/data_wait_ms")),
            human(run.mean(f"rank/{r}/forward_ms")),
            comm(r),
        ]
        for r in ranks
    ]
    lines = [
        "### Ranks",
        "",
        f"Rank skew (own work of the slowest / the others' median; own work is the data wait "
        f"and the forward less its time blocked in collectives): {human(run.mean('time/rank_skew'))}",
        "",
        markdown_table(["rank", "step (ms)", "data wait (ms)", "forward (ms)", "blocked in collectives (ms)"], rows),
        "",
    ]
    for text in run.texts.get("time/straggler_advice", []):
        lines += [text, ""]
    return lines


def _span(run: Run) -> str:
    span = run.timed_span()
    if span is None:
        return "the mean of the logging windows (this run did not log its timed steps)"
    steps, first, last = span
    return f"{steps} timed steps, logged at steps {first}-{last}: rates are total work / total timed time"


def comparison(runs: list[Run], price_per_hour: float | None) -> list[str]:
    """Ratios to the first run, like with like: runs of different workloads (data, model FLOPs per sample:
    :attr:`Run.workload`) get a table each, with the first run of each as its baseline; token runs compare
    tokens/s, the others samples/s."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.workload, []).append(run)
    lines = ["## Comparison (ratios to the first run of the same workload)", ""]
    if len(groups) > 1:
        lines += [
            f"These runs train {len(groups)} different workloads (different data or model FLOPs per sample): each "
            "is compared only with runs of its own workload, never across.",
            "",
        ]
    for (data, flops), group in groups.items():
        if len(groups) > 1:
            lines += [f"### {data}, {flops}", ""]
        lines += _comparison_table(group, price_per_hour)
    return lines


def _comparison_table(runs: list[Run], price_per_hour: float | None) -> list[str]:
    base = runs[0]
    tokens = all(r.tokens for r in runs)
    unit, item = ("tokens/s", "token") if tokens else ("samples/s", "sample")

    def rate(run: Run) -> float | None:
        return run.total("time/tokens_per_sec") if tokens else run.samples_per_sec

    header = ["run", f"time per {item} (ms)", unit, "MFU", f"time per {item} vs first", f"{unit} vs first"]
    if price_per_hour:
        header += [f"cost per 1M {item}s", "cost vs first"]
    table: list[list[str]] = []
    summary = []
    base_rate = rate(base)
    for run in runs:
        r = rate(run)
        per_item = 1e3 / r if r else None
        stopped = run.stopped_early()
        name = run.name + (f" (stopped at step {stopped[0]} of {stopped[1]})" if stopped else "")
        row = [
            name,
            human(per_item),
            human(r),
            percent(run.total("compute/mfu")),
            human(base_rate / r if r and base_rate else None),
            human(r / base_rate if r and base_rate else None),
        ]
        if price_per_hour:
            cost = price_per_hour / 3600 * 1e6 / r if r else None
            base_cost = price_per_hour / 3600 * 1e6 / base_rate if base_rate else None
            row += [human(cost, 4), human(cost / base_cost if cost and base_cost else None)]
            if run is not base and cost and base_cost:
                saved = 1 - cost / base_cost
                word = "less" if saved >= 0 else "more"
                summary.append(f"{run.name} costs {abs(saved):.1%} {word} per {item} than the baseline {base.name}.")
        table.append(row)
    return [markdown_table(header, table), ""] + summary + ([""] if summary else [])


def build_report(
    log_dirs: list[str],
    out: Path,
    plots_dir: Path | None,
    price_per_hour: float | None,
    latest: bool = False,
    plots: bool = True,
    skipped: list[str] | None = None,
) -> tuple[str, list[Run]]:
    """Write the report; the text and the runs in it. Runs without lit_compute's tags are left out (their reasons
    appended to ``skipped``); none left at all is an error."""
    paths = [p for d in log_dirs for p in find_runs(d, latest)]
    runs, reasons = [], []
    for p in paths:
        try:
            runs.append(load_run(p))
        except ReportError as err:
            reasons.append(str(err).removeprefix("lit-compute report: "))
    if skipped is not None:
        skipped.extend(reasons)
    if not runs:
        raise ReportError("lit-compute report: no run to report on: " + "; ".join(reasons))
    name_runs(runs)
    report_dir = out.parent
    plots_dir = plots_dir or report_dir / f"{out.stem}_plots"
    lines = ["# lit_compute run report", ""]
    if reasons:
        lines += [
            f"Skipped {len(reasons)} folder(s) without lit_compute's tags: "
            + ", ".join(f"`{r.split(' has none')[0]}`" for r in reasons),
            "",
        ]
    if len(runs) > 1:
        lines += comparison(runs, price_per_hour)
    for i, run in enumerate(runs, 1):
        try:
            drawn = write_plots(run, plots_dir, i) if plots else []
        except OSError as err:
            raise ReportError(
                f"lit-compute report: cannot write the plots to {plots_dir}: {err.strerror or err}; "
                "pass --plots DIR (a writable folder) or --no-plots"
            ) from None
        lines += run_section(run, drawn, report_dir)
    text = "\n".join(lines) + "\n"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except IsADirectoryError:
        raise ReportError(
            f"lit-compute report: --out {out} is a folder; name a file such as {out / 'report.md'}"
        ) from None
    except OSError as err:
        raise ReportError(f"lit-compute report: cannot write --out {out}: {err.strerror or err}") from None
    return text, runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute report", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("log_dirs", nargs="+", metavar="LOG_DIR", help="folders holding TensorBoard event files")
    parser.add_argument("--out", default="report.md", help="Markdown report path")
    parser.add_argument("--plots", default=None, help="folder for the PNG plots (default: <out>_plots/ next to it)")
    parser.add_argument("--no-plots", action="store_true", help="tables and advice only (fast over a sweep)")
    parser.add_argument("--price-per-hour", type=float, default=None, help="machine price per hour, for costs")
    parser.add_argument("--latest", action="store_true", help="only the most recent run under each LOG_DIR")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        sys.stderr.write(f"lit-compute report: --out {out} is a folder; name a file such as {out / 'report.md'}\n")
        return 2
    skipped: list[str] = []
    try:
        _, runs = build_report(
            args.log_dirs,
            out,
            Path(args.plots) if args.plots else None,
            args.price_per_hour,
            args.latest,
            plots=not args.no_plots,
            skipped=skipped,
        )
    except ReportError as err:
        sys.stderr.write(f"{err}\n")
        return 2
    for reason in skipped:
        sys.stdout.write(f"skipped: {reason}\n")
    sys.stdout.write(f"report: {out.resolve()} ({len(runs)} run(s): {', '.join(run.name for run in runs)})\n")
    return 0

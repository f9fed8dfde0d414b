"""``lit-compute report LOG_DIR [LOG_DIR ...]``: a Markdown run report with plots, advice and comparisons.

Reads the TensorBoard event files with tensorboard's own reader. Runs are named by their path from the
common folder of all runs reported (``exp_a/version_0`` and ``exp_b/version_0`` stay apart); folders with event
files but none of lit_compute's tags are skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUR_PREFIXES = ("compute/", "time/", "amp/", "device/", "profiler/", "comm/")
INPUT_BOUND = 0.2
LOW_MFU = {"32": 0.3, "other": 0.2}  # below this share of peak the compute is worth a look
PADDING = 0.15
_WINDOW = re.compile(r"Window \d+: steps (\d+)-(\d+)")


class ReportError(ValueError):
    """A log dir that cannot be reported on (no event files, none of our tags), or an output that cannot be written."""


# -- numbers people read ------------------------------------------------------------------------------------------
def human(value: float | None, digits: int = 3) -> str:
    """A number without scientific notation: ``14,200``, ``3.14``, ``0.00251``; ``n/a`` for None/NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    v = float(value)
    if v == 0:
        return "0"
    magnitude = abs(v)
    if magnitude >= 10 ** digits:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    text = f"{v:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def flops_rate(tflops: float | None) -> str:
    """A FLOP/s figure in a unit that fits: ``312 TFLOP/s``, ``2.5 GFLOP/s`` (a CPU), ``40 MFLOP/s``."""
    if tflops is None or not math.isfinite(tflops):
        return "n/a"
    for scale, unit in ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (1e-6, "MFLOP/s")):
        if abs(tflops) >= scale:
            return f"{human(tflops / scale)} {unit}"
    return f"{human(tflops / 1e-9)} kFLOP/s"


def percent(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


# -- one run ------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One run's numbers, read back from its event files."""

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def values(self, tag: str) -> list[float]:
        return [v for _, v in self.scalars.get(tag, [])]

    def mean(self, tag: str) -> float | None:
        vals = [v for v in self.values(tag) if math.isfinite(v)]
        return statistics.fmean(vals) if vals else None

    def last(self, tag: str) -> float | None:
        vals = self.values(tag)
        return vals[-1] if vals else None

    def maximum(self, *tags: str) -> float | None:
        vals = [v for t in tags for v in self.values(t)]
        return max(vals) if vals else None

    def info(self, key: str) -> str | None:
        for text in self.texts.get("lit_compute/run", []):
            for line in text.splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 2 and cells[0] == key:
                    return cells[1]
        return None

    @property
    def samples_per_sec(self) -> float | None:
        return self.mean("time/samples_per_sec")

    @property
    def time_per_sample_ms(self) -> float | None:
        sps = self.samples_per_sec
        return 1e3 / sps if sps else None

    @property
    def forward_gflops(self) -> float | None:
        value = self.last("compute/forward_gflops_per_sample")
        if value is None:
            value = self.hparams.get("compute/forward_gflops_per_sample")
        return float(value) if value is not None else None

    @property
    def tokens(self) -> bool:
        return "time/tokens_per_sec" in self.scalars or "compute/padding_fraction" in self.scalars

    def windows(self) -> list[tuple[int, int]]:
        """Profiler windows as ``(first step, last step)``."""
        out = []
        for text in self.texts.get("profiler/top_ops", []):
            m = _WINDOW.search(text)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return out

    def validation_steps(self) -> list[int]:
        for tag in ("val/loss", "compute/val_flops_per_step", "val/acc"):
            if tag in self.scalars:
                return sorted({s for s, _ in self.scalars[tag]})
        return []


def find_runs(log_dir: str | Path, latest: bool = False) -> list[Path]:
    """Directories under ``log_dir`` (itself included) that hold TensorBoard event files."""
    root = Path(log_dir)
    if not root.exists():
        raise ReportError(f"lit-compute report: {root} does not exist")
    dirs = sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    if not dirs:
        raise ReportError(f"lit-compute report: no TensorBoard event files (events.out.tfevents.*) under {root}")
    if latest:
        dirs = [max(dirs, key=lambda d: max(f.stat().st_mtime for f in d.glob("events.out.tfevents.*")))]
    return dirs


def load_run(path: Path) -> Run:
    """Read one run. Raises :class:`ReportError` when it has none of lit_compute's tags."""
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "images": 1, "histograms": 1,
                                                     "audio": 1, "compressedHistograms": 1})
    acc.Reload()
    tags = acc.Tags()
    run = Run(path=path, name=f"{path.parent.name}/{path.name}")
    for tag in tags.get("scalars", []):
        run.scalars[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    if not any(t.startswith(OUR_PREFIXES) for t in run.scalars):
        raise ReportError(
            f"lit-compute report: {path} has none of lit_compute's tags ({', '.join(OUR_PREFIXES)}); "
            "train with lit_compute's callbacks (FlopsLogger, StepTimeMonitor, ...) to get them"
        )
    for tag in tags.get("tensors", []):
        if tag.endswith("/text_summary"):
            run.texts[tag[: -len("/text_summary")]] = [
                s.decode() for ev in acc.Tensors(tag) for s in ev.tensor_proto.string_val
            ]
    hp = path / "hparams.yaml"
    if hp.is_file():
        try:
            loaded = yaml.safe_load(hp.read_text()) or {}
        except yaml.YAMLError:
            loaded = {}
        if isinstance(loaded, dict):
            run.hparams = loaded
    return run


def name_runs(runs: list[Run]) -> None:
    """Name each run by its path from the common folder of all runs (the last two parts for a single run)."""
    if len(runs) < 2:
        return
    common = Path(os.path.commonpath([str(r.path.resolve()) for r in runs]))
    for run in runs:
        rel = run.path.resolve().relative_to(common).as_posix()
        run.name = rel if rel != "." else run.path.name
    names = [r.name for r in runs]
    for run in runs:  # the same folder given twice
        if names.count(run.name) > 1:
            run.name = str(run.path)


# -- advice -------------------------------------------------------------------------------------------------------
def advice(run: Run) -> list[str]:
    """Advice derived from the numbers, each line citing the number that triggered it."""
    lines = []
    precision = run.info("precision") or ""
    wait = run.mean("time/data_wait_fraction")
    if wait is not None and wait > INPUT_BOUND:
        if run.tokens:
            fix = ("tokenise once and cache the token ids (TokenDataModule does), raise DataLoader num_workers, and keep "
                   "collation light")
        elif (run.info("data") or "").endswith("ImageDataModule") or "image" in (run.info("data") or "").lower():
            fix = ("raise DataLoader num_workers (about 75% of the cores), set pin_memory=True on CUDA, or decode with "
                   "lit_compute.data.DALIImageDataModule")
        else:
            fix = "raise DataLoader num_workers, set pin_memory=True on CUDA, and move work out of __getitem__"
        lines.append(f"Input-bound: data wait is {percent(wait)} of step time (time/data_wait_fraction > "
                     f"{INPUT_BOUND:.0%}): {fix}.")
    cpu, load, cores = run.mean("device/cpu_percent"), run.mean("device/load_avg_1m"), _number(run.info("cpu cores"))
    if cpu is not None and cores and load is not None and load > 1.5 * cores and cpu < 60 * cores:
        lines.append(f"CPU-starved: the machine's load average is {human(load)} on {int(cores)} cores while this "
                     f"process got {human(cpu / 100)} of a core on average (device/cpu_percent {human(cpu)}%): other "
                     "processes compete for the cores; stop them, or lower torch.set_num_threads and DataLoader "
                     "num_workers so the total fits the cores.")
    mfu = run.mean("compute/mfu")
    low = LOW_MFU["32" if precision.startswith("32") else "other"]
    if mfu is not None and mfu < low:
        if precision.startswith("32"):
            fix = ("switch on mixed precision: Trainer(plugins=[FP32BatchNormPrecision('bf16-mixed')]) (or '16-mixed' "
                   "on GPUs without bf16)")
        else:
            fix = ("raise the batch size until memory is nearly full, use torch.compile, use channels_last for "
                   "convolutions, and check the data wait and padding above")
        lines.append(f"Low MFU: compute/mfu is {percent(mfu)} in {precision or 'this precision'} (below {low:.0%}): {fix}.")
    padding = run.mean("compute/padding_fraction")
    if padding is not None and padding > PADDING:
        lines.append(f"Padding waste: {percent(padding)} of the computed token positions are padding "
                     "(compute/padding_fraction): pack sequences into fixed-length rows (TokenDataModule(mode='packed')) "
                     "or group batches by length.")
    plugin = run.info("precision plugin") or ""
    if precision and not precision.startswith("32") and "FP32BatchNorm" not in plugin and _has_batchnorm(run):
        lines.append(f"Low precision ({precision}) without FP32BatchNormPrecision (plugin {plugin}): BatchNorm statistics "
                     "in half precision drift and can overflow; use FP32BatchNormPrecision to keep norms in float32.")
    overlap = run.mean("profiler/comm_overlap_fraction")
    if overlap is not None and overlap < 0.5:
        lines.append(f"Communication-bound: only {percent(overlap)} of NCCL time overlaps compute "
                     "(profiler/comm_overlap_fraction). Try a larger bucket_cap_mb, a compression hook (comm_hook='bf16' "
                     "or 'powersgd') or NCCL settings (TunedDDPStrategy).")
    skipped = run.mean("amp/skipped_step_fraction")
    if skipped is not None and skipped > 0.05:
        lines.append(f"{percent(skipped)} of optimizer steps were skipped for inf/NaN gradients "
                     "(amp/skipped_step_fraction): check the learning rate and the loss scale's init_scale/growth_interval.")
    return lines


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _has_batchnorm(run: Run) -> bool:
    tables = run.texts.get("compute/flops_by_module", [])
    if not tables:
        return True  # unknown: say it
    return "bn" in tables[0].lower() or "batchnorm" in tables[0].lower()


# -- plots ----------------------------------------------------------------------------------------------------------
def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _marks(ax: Any, run: Run) -> None:
    """Profiler windows (shaded) and validation runs (dashed), with their legend entries."""
    for i, (first, last) in enumerate(run.windows()):
        ax.axvspan(first - 0.5, last + 0.5, color="#8172b3", alpha=0.2, label="profiler window" if i == 0 else None)
    for i, step in enumerate(run.validation_steps()):
        ax.axvline(step, color="#937860", linestyle="--", linewidth=1, label="validation" if i == 0 else None)


def write_plots(run: Run, out_dir: Path, index: int) -> list[Path]:
    """PNG plots of one run (headless matplotlib), each saying one thing, with a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    wait, compute = run.scalars.get("time/data_wait_ms"), run.scalars.get("time/compute_ms")
    if wait and compute:
        steps = [s for s, _ in compute]
        waits = dict(wait)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.stackplot(steps, [[v for _, v in compute], [waits.get(s, 0.0) for s in steps]],
                     labels=["compute", "data wait"], colors=["#4c72b0", "#dd8452"], alpha=0.85)
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel("ms per step")
        ax.set_title(f"Step time: compute and data wait ({run.name})")
        ax.legend(loc="upper right", fontsize=8)
        paths.append(_save(plt, fig, out_dir / f"run{index}_step_time.png"))
    tflops = run.scalars.get("compute/global_tflops_per_sec")
    if tflops:
        peak = max(abs(v) for _, v in tflops)
        scale, unit = next(((s, u) for s, u in ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (1e-6, "MFLOP/s")) if peak >= s),
                           (1e-9, "kFLOP/s"))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s for s, _ in tflops], [v / scale for _, v in tflops], color="#4c72b0", marker=".",
                label=f"model {unit}, all ranks")
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.set_title(f"Achieved throughput ({run.name})")
        ax.legend(loc="lower right", fontsize=8)
        paths.append(_save(plt, fig, out_dir / f"run{index}_throughput.png"))
    mfu, hfu = run.scalars.get("compute/mfu"), run.scalars.get("compute/hfu")
    if mfu:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        same = bool(hfu) and dict(hfu).keys() == dict(mfu).keys() and all(
            abs(dict(hfu)[s] - v) <= 1e-6 * max(abs(v), 1e-12) for s, v in mfu)
        label = "MFU = HFU (nothing recomputed)" if same else "MFU (model FLOPs)"
        ax.plot([s for s, _ in mfu], [100 * v for _, v in mfu], color="#c44e52", marker=".", label=label)
        if hfu and not same:
            ax.plot([s for s, _ in hfu], [100 * v for _, v in hfu], color="#55a868", marker=".", linestyle=":",
                    label="HFU (hardware FLOPs)")
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel("% of peak")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Utilisation of the device's peak ({run.name})")
        ax.legend(loc="lower right", fontsize=8)
        paths.append(_save(plt, fig, out_dir / f"run{index}_mfu.png"))
    scale_points = run.scalars.get("amp/loss_scale")
    if scale_points:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.step([s for s, _ in scale_points], [v for _, v in scale_points], where="post", color="#55a868",
                label="loss scale")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_ylabel("loss scale")
        ax.set_title(f"fp16 loss scale ({run.name})")
        ax.legend(loc="upper right", fontsize=8)
        paths.append(_save(plt, fig, out_dir / f"run{index}_loss_scale.png"))
    return paths


# -- the report -------------------------------------------------------------------------------------------------------
def run_section(run: Run, plots: list[Path], report_dir: Path) -> list[str]:
    memory = run.maximum("device/torch_max_memory_allocated_gb")
    memory_label = "GPU allocator peak"
    if memory is None:
        memory, memory_label = run.maximum("device/rss_gb"), "process RSS peak"
    lines = [f"## {run.name}", "", f"`{run.path}`", ""]
    peak = run.last("compute/peak_tflops")
    rows = [
        ("model forward GFLOPs per sample", human(run.forward_gflops, 4)),
        ("mean step time (ms)", human(run.mean("time/step_ms"))),
        ("p90 step time (ms)", human(run.mean("time/step_ms_p90"))),
        ("samples/s", human(run.samples_per_sec)),
    ]
    if run.tokens:
        rows += [("tokens/s", human(run.mean("time/tokens_per_sec"))),
                 ("padding fraction", percent(run.mean("compute/padding_fraction")))]
    rows += [
        ("achieved (all ranks)", flops_rate(run.mean("compute/global_tflops_per_sec"))),
        ("MFU", f"{percent(run.mean('compute/mfu'))} of {flops_rate(peak)} peak per device"),
        ("HFU", percent(run.mean("compute/hfu"))),
        ("data-wait fraction", percent(run.mean("time/data_wait_fraction"))),
        (f"peak memory ({memory_label}, GB)", human(memory)),
        ("precision", f"{run.info('precision') or 'n/a'} ({run.info('precision plugin') or 'n/a'})"),
        ("skipped optimizer steps", human(run.last("amp/skipped_steps"))),
        ("device", f"{run.info('device') or 'n/a'} x {run.info('world size') or '?'} ({run.info('strategy') or 'n/a'})"),
    ]
    lines += ["| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    for tag, title in (("ddp/config", "DDP / NCCL configuration"), ("profiler/top_ops", "Profiler windows")):
        for text in run.texts.get(tag, []):
            lines += [f"### {title}", "", text, ""]
    tips = advice(run)
    lines += ["### Advice", ""] + ([f"- {t}" for t in tips] or ["- Nothing stands out."]) + [""]
    for p in plots:
        rel = p.relative_to(report_dir) if p.is_relative_to(report_dir) else p
        lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    return lines


def comparison(runs: list[Run], price_per_hour: float | None) -> list[str]:
    base = runs[0]
    lines = ["## Comparison (ratios to the first run)", ""]
    header = ["run", "time per sample (ms)", "samples/s", "MFU", "time per sample vs first", "samples/s vs first"]
    if price_per_hour:
        header += ["cost per 1M samples", "cost vs first"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    summary = []
    for run in runs:
        tps, sps = run.time_per_sample_ms, run.samples_per_sec
        row = [run.name, human(tps), human(sps), percent(run.mean("compute/mfu")),
               human(tps / base.time_per_sample_ms if tps and base.time_per_sample_ms else None),
               human(sps / base.samples_per_sec if sps and base.samples_per_sec else None)]
        if price_per_hour:
            cost = price_per_hour / 3600 * 1e6 / sps if sps else None
            base_cost = price_per_hour / 3600 * 1e6 / base.samples_per_sec if base.samples_per_sec else None
            row += [human(cost, 4), human(cost / base_cost if cost and base_cost else None)]
            if run is not base and cost and base_cost:
                saved = 1 - cost / base_cost
                word = "less" if saved >= 0 else "more"
                summary.append(f"{run.name} costs {abs(saved):.1%} {word} per sample than the baseline {base.name}.")
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""] + summary + ([""] if summary else [])


def build_report(log_dirs: list[str], out: Path, plots_dir: Path | None, price_per_hour: float | None,
                 latest: bool = False, plots: bool = True, skipped: list[str] | None = None) -> tuple[str, list[Run]]:
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
        lines += [f"Skipped {len(reasons)} folder(s) without lit_compute's tags: "
                  + ", ".join(f"`{r.split(' has none')[0]}`" for r in reasons), ""]
    if len(runs) > 1:
        lines += comparison(runs, price_per_hour)
    for i, run in enumerate(runs, 1):
        lines += run_section(run, write_plots(run, plots_dir, i) if plots else [], report_dir)
    text = "\n".join(lines) + "\n"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except IsADirectoryError:
        raise ReportError(f"lit-compute report: --out {out} is a folder; name a file such as {out / 'report.md'}") from None
    except OSError as err:
        raise ReportError(f"lit-compute report: cannot write --out {out}: {err.strerror or err}") from None
    return text, runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute report", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
        _, runs = build_report(args.log_dirs, out, Path(args.plots) if args.plots else None, args.price_per_hour,
                               args.latest, plots=not args.no_plots, skipped=skipped)
    except ReportError as err:
        sys.stderr.write(f"{err}\n")
        return 2
    for reason in skipped:
        sys.stdout.write(f"skipped: {reason}\n")
    sys.stdout.write(f"report: {out.resolve()} ({len(runs)} run(s))\n")
    return 0

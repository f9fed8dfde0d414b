"""``lit-compute report LOG_DIR [LOG_DIR ...]``: a Markdown run report with plots, advice and comparisons.

Reads the TensorBoard event files with tensorboard's own reader.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

OUR_PREFIXES = ("compute/", "time/", "amp/", "device/", "profiler/", "comm/")
INPUT_BOUND = 0.2
LOW_MFU = 0.3


class ReportError(ValueError):
    """A log dir that cannot be reported on (no event files, none of our tags)."""


@dataclass
class Run:
    """One run's numbers, read back from its event files."""

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

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

    # derived figures ---------------------------------------------------------------------------
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
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    run = Run(path=path)
    for tag in tags.get("scalars", []):
        run.scalars[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        if tag.endswith("/text_summary"):
            run.texts[tag[: -len("/text_summary")]] = [
                s.decode() for ev in acc.Tensors(tag) for s in ev.tensor_proto.string_val
            ]
    hp = path / "hparams.yaml"
    if hp.is_file():
        loaded = yaml.safe_load(hp.read_text()) or {}
        if isinstance(loaded, dict):
            run.hparams = loaded
    if not any(t.startswith(OUR_PREFIXES) for t in run.scalars):
        raise ReportError(
            f"lit-compute report: {path} has none of lit_compute's tags ({', '.join(OUR_PREFIXES)}); "
            "train with lit_compute's callbacks (FlopsLogger, StepTimeMonitor, ...) to get them"
        )
    return run


def _fmt(value: float | None, digits: int = 3, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" if pct else f"{value:.{digits}g}"


def advice(run: Run) -> list[str]:
    """Advice derived from the numbers, each line citing the number that triggered it."""
    lines = []
    wait = run.mean("time/data_wait_fraction")
    if wait is not None and wait > INPUT_BOUND:
        lines.append(
            f"Input-bound: data wait is {wait:.1%} of step time (time/data_wait_fraction > {INPUT_BOUND:.0%}). "
            "Raise DataLoader num_workers (about 75% of the cores), set pin_memory=True on CUDA, "
            "or decode with lit_compute.data.DALIImageDataModule."
        )
    mfu = run.mean("compute/mfu")
    precision = run.info("precision") or ""
    if mfu is not None and mfu < LOW_MFU and precision.startswith("32"):
        lines.append(
            f"Low MFU in float32: compute/mfu is {mfu:.1%} with precision {precision}. Switch on mixed precision: "
            "Trainer(plugins=[FP32BatchNormPrecision('bf16-mixed')]) (or '16-mixed' on GPUs without bf16)."
        )
    plugin = run.info("precision plugin") or ""
    if precision and not precision.startswith("32") and "FP32BatchNorm" not in plugin:
        norm_share = _norm_share(run)
        if norm_share is None or norm_share > 0:
            lines.append(
                f"Low precision ({precision}) without FP32BatchNormPrecision (plugin {plugin}): BatchNorm statistics "
                "in half precision drift and can overflow; use FP32BatchNormPrecision to keep norms in float32."
            )
    overlap = run.mean("profiler/comm_overlap_fraction")
    if overlap is not None and overlap < 0.5:
        lines.append(
            f"Communication-bound: only {overlap:.0%} of NCCL time overlaps compute (profiler/comm_overlap_fraction). "
            "Try a larger bucket_cap_mb, a compression hook (comm_hook='bf16' or 'powersgd') or NCCL settings "
            "(TunedDDPStrategy)."
        )
    skipped = run.mean("amp/skipped_step_fraction")
    if skipped is not None and skipped > 0.05:
        lines.append(
            f"{skipped:.1%} of optimizer steps were skipped for inf/NaN gradients (amp/skipped_step_fraction): "
            "check the learning rate and the loss scale's init_scale/growth_interval."
        )
    return lines


def _norm_share(run: Run) -> float | None:
    tables = run.texts.get("compute/flops_by_module", [])
    if not tables:
        return None
    return 1.0 if "bn" in tables[0].lower() or "norm" in tables[0].lower() else 0.0


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(run: Run, out_dir: Path, index: int) -> list[Path]:
    """PNG plots of one run (headless matplotlib)."""
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
        ax.set_xlabel("step")
        ax.set_ylabel("ms per step")
        ax.set_title(f"Step time breakdown: {run.name}")
        ax.legend(loc="upper right")
        paths.append(_save(plt, fig, out_dir / f"run{index}_step_time.png"))
    tflops, mfu = run.scalars.get("compute/global_tflops_per_sec"), run.scalars.get("compute/mfu")
    if tflops:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s for s, _ in tflops], [v for _, v in tflops], color="#4c72b0", label="TFLOP/s (all ranks)")
        ax.set_xlabel("step")
        ax.set_ylabel("TFLOP/s")
        if mfu:
            ax2 = ax.twinx()
            ax2.plot([s for s, _ in mfu], [100 * v for _, v in mfu], color="#c44e52", label="MFU %")
            ax2.set_ylabel("MFU %")
        ax.set_title(f"Throughput: {run.name}")
        paths.append(_save(plt, fig, out_dir / f"run{index}_tflops_mfu.png"))
    scale = run.scalars.get("amp/loss_scale")
    if scale:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.step([s for s, _ in scale], [v for _, v in scale], where="post", color="#55a868")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_ylabel("loss scale")
        ax.set_title(f"Loss scale: {run.name}")
        paths.append(_save(plt, fig, out_dir / f"run{index}_loss_scale.png"))
    return paths


def run_section(run: Run, plots: list[Path], report_dir: Path) -> list[str]:
    peak_tflops = run.last("compute/peak_tflops")
    memory = run.maximum("device/torch_max_memory_allocated_gb")
    memory_label = "GPU allocator peak"
    if memory is None:
        memory, memory_label = run.maximum("device/rss_gb"), "process RSS peak"
    lines = [f"## {run.name}", "", f"`{run.path}`", ""]
    rows = [
        ("model forward GFLOPs per sample", _fmt(run.forward_gflops, 4)),
        ("mean step time (ms)", _fmt(run.mean("time/step_ms"))),
        ("p90 step time (ms)", _fmt(run.mean("time/step_ms_p90"))),
        ("samples/s", _fmt(run.samples_per_sec)),
        ("TFLOP/s (all ranks)", _fmt(run.mean("compute/global_tflops_per_sec"))),
        ("MFU", f"{_fmt(run.mean('compute/mfu'), pct=True)} of {_fmt(peak_tflops)} TFLOP/s peak per device"),
        ("data-wait fraction", _fmt(run.mean("time/data_wait_fraction"), pct=True)),
        (f"peak memory ({memory_label}, GB)", _fmt(memory)),
        ("precision", f"{run.info('precision') or 'n/a'} ({run.info('precision plugin') or 'n/a'})"),
        ("skipped optimizer steps", _fmt(run.last("amp/skipped_steps"))),
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
        row = [run.name, _fmt(tps), _fmt(sps), _fmt(run.mean("compute/mfu"), pct=True),
               _fmt(tps / base.time_per_sample_ms if tps and base.time_per_sample_ms else None),
               _fmt(sps / base.samples_per_sec if sps and base.samples_per_sec else None)]
        if price_per_hour:
            cost = price_per_hour / 3600 * 1e6 / sps if sps else None
            base_cost = price_per_hour / 3600 * 1e6 / base.samples_per_sec if base.samples_per_sec else None
            row += [f"{cost:.4f}" if cost else "n/a", _fmt(cost / base_cost if cost and base_cost else None)]
            if run is not base and cost and base_cost:
                saved = 1 - cost / base_cost
                word = "less" if saved >= 0 else "more"
                summary.append(f"{run.name} costs {abs(saved):.1%} {word} per sample than the baseline {base.name}.")
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""] + summary + ([""] if summary else [])


def build_report(log_dirs: list[str], out: Path, plots_dir: Path | None, price_per_hour: float | None,
                 latest: bool = False) -> tuple[str, list[Run]]:
    paths = [p for d in log_dirs for p in find_runs(d, latest)]
    runs = [load_run(p) for p in paths]
    report_dir = out.parent
    plots_dir = plots_dir or report_dir / f"{out.stem}_plots"
    lines = ["# lit_compute run report", ""]
    if len(runs) > 1:
        lines += comparison(runs, price_per_hour)
    for i, run in enumerate(runs, 1):
        lines += run_section(run, write_plots(run, plots_dir, i), report_dir)
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text, runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute report", description=__doc__)
    parser.add_argument("log_dirs", nargs="+", metavar="LOG_DIR")
    parser.add_argument("--out", default="report.md", help="Markdown report path (default: report.md)")
    parser.add_argument("--plots", default=None, help="folder for the PNG plots (default: <out>_plots/ next to it)")
    parser.add_argument("--price-per-hour", type=float, default=None, help="machine price per hour, for costs")
    parser.add_argument("--latest", action="store_true", help="only the most recent run under each LOG_DIR")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        _, runs = build_report(args.log_dirs, out, Path(args.plots) if args.plots else None, args.price_per_hour,
                               args.latest)
    except ReportError as err:
        sys.stderr.write(f"{err}\n")
        return 2
    sys.stdout.write(f"report: {out.resolve()} ({len(runs)} run(s))\n")
    return 0

"""PNG plots of one run (headless matplotlib), each saying one thing, with a legend."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lit_compute.formatting import flops_rate_unit
from lit_compute.report.runs import Run

__all__ = ["write_plots"]


def _save(plt: Any, fig: Any, path: Path) -> Path:
    for ax in fig.axes:  # the legend beside the axes, never over the data
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _marks(ax: Any, run: Run) -> None:
    """Profiler windows (shaded) and validation runs (dashed), with their legend entries."""
    for i, (first, last) in enumerate(run.windows()):
        ax.axvspan(first - 0.5, last + 0.5, color="#8172b3", alpha=0.2, label="profiler window" if i == 0 else None)
    for i, step in enumerate(run.validation_steps()):
        ax.axvline(step, color="#937860", linestyle="--", linewidth=1, label="validation" if i == 0 else None)


def plot_prefix(run: Run, index: int) -> str:
    """File-name prefix of a run's plots: the run's name (``lightning_logs_version_3``), so two reports written into
    one folder never overwrite each other's plots."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.name).strip("_.")
    return slug or f"run{index}"


def write_plots(run: Run, out_dir: Path, index: int) -> list[Path]:
    """PNG plots of one run (headless matplotlib), each saying one thing, with a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = plot_prefix(run, index)
    paths = []
    wait, compute = run.scalars.get("time/data_wait_ms"), run.scalars.get("time/compute_ms")
    if wait and compute:
        steps = [s for s, _ in compute]
        waits = dict(wait)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.stackplot(
            steps,
            [[v for _, v in compute], [waits.get(s, 0.0) for s in steps]],
            labels=["compute", "data wait"],
            colors=["#4c72b0", "#dd8452"],
            alpha=0.85,
        )
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel("ms per step")
        ax.set_title(f"Step time: compute and data wait ({run.name})")
        paths.append(_save(plt, fig, out_dir / f"{prefix}_step_time.png"))
    rate_tag, rate_unit = (
        ("time/global_tokens_per_sec", "tokens/s") if run.tokens else ("time/global_samples_per_sec", "samples/s")
    )
    rate, where = run.scalars.get(rate_tag), "all ranks"
    if not rate:
        rate, where = run.scalars.get(rate_tag.replace("global_", "")), "this device"
    if rate:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s for s, _ in rate], [v for _, v in rate], color="#55a868", marker=".", label=f"{rate_unit}, {where}")
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel(rate_unit)
        ax.set_ylim(bottom=0)
        ax.set_title(f"Training throughput in {rate_unit} ({run.name})")
        paths.append(_save(plt, fig, out_dir / f"{prefix}_{rate_unit.replace('/', '_per_')}.png"))
    tflops = run.scalars.get("compute/global_tflops_per_sec")
    if tflops:
        scale, unit = flops_rate_unit(max(abs(v) for _, v in tflops))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(
            [s for s, _ in tflops],
            [v / scale for _, v in tflops],
            color="#4c72b0",
            marker=".",
            label=f"model {unit}, all ranks",
        )
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.set_title(f"Achieved throughput ({run.name})")
        paths.append(_save(plt, fig, out_dir / f"{prefix}_throughput.png"))
    mfu, hfu = run.scalars.get("compute/mfu") or [], run.scalars.get("compute/hfu") or []
    if mfu:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        same = (
            bool(hfu)
            and dict(hfu).keys() == dict(mfu).keys()
            and all(abs(dict(hfu)[s] - v) <= 1e-6 * max(abs(v), 1e-12) for s, v in mfu)
        )
        label = "MFU = HFU (nothing recomputed)" if same else "MFU (model FLOPs)"
        ax.plot([s for s, _ in mfu], [100 * v for _, v in mfu], color="#c44e52", marker=".", label=label)
        if hfu and not same:
            ax.plot(
                [s for s, _ in hfu],
                [100 * v for _, v in hfu],
                color="#55a868",
                marker=".",
                linestyle=":",
                label="HFU (hardware FLOPs)",
            )
        _marks(ax, run)
        ax.set_xlabel("step")
        ax.set_ylabel("% of peak")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Utilisation of the device's peak ({run.name})")
        paths.append(_save(plt, fig, out_dir / f"{prefix}_mfu.png"))
    scale_points = run.scalars.get("amp/loss_scale")
    if scale_points:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.step(
            [s for s, _ in scale_points],
            [v for _, v in scale_points],
            where="post",
            color="#55a868",
            label="loss scale",
        )
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_ylabel("loss scale")
        ax.set_title(f"fp16 loss scale ({run.name})")
        paths.append(_save(plt, fig, out_dir / f"{prefix}_loss_scale.png"))
    return paths

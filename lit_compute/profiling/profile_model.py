"""profile_model: profile one inference of a model outside any trainer."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity

from lit_compute.profiling.trace_summary import summarize_trace


@dataclass
class ModelProfile:
    """The result of :func:`profile_model`."""

    table: str
    peak_memory_mb: float | None
    total_ms: float


def profile_model(
    model: nn.Module,
    input_size: tuple[int, ...] = (1, 3, 224, 224),
    device: str | None = None,
    row_limit: int = 15,
    warmup: int = 1,
    show: bool = True,
) -> ModelProfile:
    """Profile one inference of ``model`` and show the top ops, sorted by device time (CPU time without CUDA).

    Runs ``warmup`` untimed inferences, then one profiled inference under ``torch.inference_mode`` with memory
    profiling; on a CPU-only machine no CUDA activity is requested and no CUDA memory call is made. The model
    is put in eval mode for the call and its previous mode restored.

    Args:
        model: Any ``nn.Module``.
        input_size: Shape of the random input.
        device: ``"cpu"``, ``"cuda"``, ... (default: the model's device).
        row_limit: Rows of the table.
        warmup: Untimed inferences first.
        show: Write the table and the peak memory to standard output.

    Returns:
        A :class:`ModelProfile` with the table, the peak memory (MiB) and the wall time of the profiled call.

    Example:
        >>> import torchvision
        >>> result = profile_model(torchvision.models.resnet18(), (1, 3, 64, 64), show=False)
        >>> "aten::" in result.table
        True
    """
    first = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
    on_cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    was_training = model.training
    model.eval()
    x = torch.randn(*input_size, device=dev)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(x)
            if on_cuda:
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
                model(x)
                if on_cuda:
                    torch.cuda.synchronize(dev)
        sort_by = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            summary = summarize_trace(path)
            import json

            events = json.loads(path.read_text()).get("traceEvents", [])
        spans = [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in events
            if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
        ]
        total_ms = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e3 if spans else 0.0
        peak = torch.cuda.max_memory_allocated(dev) / 2**20 if on_cuda else summary.peak_memory_mb
        if peak is None:
            peak = _peak_from_events(prof)
    finally:
        model.train(was_training)
    if show:
        sys.stdout.write(
            f"{table}\npeak memory: {peak if peak is not None else float('nan'):.1f} MiB, "
            f"profiled call: {total_ms:.2f} ms\n"
        )
    return ModelProfile(table=table, peak_memory_mb=peak, total_ms=total_ms)


def _peak_from_events(prof: torch.profiler.profile) -> float | None:
    """Peak of the running sum of allocations seen by the profiler (CPU)."""
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    running = peak = 0
    for e in events:
        running += e.cpu_memory_usage
        peak = max(peak, running)
    return peak / 2**20 if events else None

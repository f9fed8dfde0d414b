"""Advice derived from a run's numbers, each line citing the number that triggered it."""

from __future__ import annotations

from lit_compute.formatting import human, percent
from lit_compute.report.runs import Run

__all__ = ["INPUT_BOUND", "LOW_MFU", "PADDING", "advice"]

INPUT_BOUND = 0.2
LOW_MFU = {"32": 0.3, "other": 0.2}  # below this share of peak the compute is worth a look
PADDING = 0.15
COMM_SHARE = 0.2  # gradient all-reduce above this share of a step is worth a look


def advice(run: Run) -> list[str]:
    """Advice derived from the numbers, each line citing the number that triggered it."""
    lines = []
    record = run.record
    precision = record.precision if record else ""
    data = record.data if record else ""
    wait = run.total("time/data_wait_fraction")
    if wait is not None and wait > INPUT_BOUND:
        if run.tokens:
            fix = (
                "tokenise once and cache the token ids (TokenDataModule does), raise DataLoader num_workers, and keep "
                "collation light"
            )
        elif data.endswith("ImageDataModule") or "image" in data.lower():
            fix = (
                "raise DataLoader num_workers (about 75% of the cores), set pin_memory=True on CUDA, or decode with "
                "lit_compute.data.DALIImageDataModule"
            )
        else:
            fix = "raise DataLoader num_workers, set pin_memory=True on CUDA, and move work out of __getitem__"
        lines.append(
            f"Input-bound: data wait is {percent(wait)} of step time (time/data_wait_fraction > "
            f"{INPUT_BOUND:.0%}): {fix}."
        )
    cpu, load, cores = (
        run.mean("device/cpu_percent"),
        run.mean("device/load_avg_1m"),
        (record.cpu_cores if record else None),
    )
    if cpu is not None and cores and load is not None and load > 1.5 * cores and cpu < 60 * cores:
        lines.append(
            f"CPU-starved: the machine's load average is {human(load)} on {int(cores)} cores while this "
            f"process got {human(cpu / 100)} of a core on average (device/cpu_percent {human(cpu)}%): other "
            "processes compete for the cores; stop them, or lower torch.set_num_threads and DataLoader "
            "num_workers so the total fits the cores."
        )
    mfu = run.total("compute/mfu")
    low = LOW_MFU["32" if precision.startswith("32") else "other"]
    if mfu is not None and mfu < low:
        if precision.startswith("32"):
            fix = (
                "switch on mixed precision: Trainer(plugins=[FP32BatchNormPrecision('bf16-mixed')]) (or '16-mixed' "
                "on GPUs without bf16)"
            )
        else:
            layout = "" if run.tokens else ", channels-last weights for the convolutions"
            fix = (
                f"raise the batch size until memory is nearly full{layout}, and check the data wait and padding "
                "above; `lit-compute tune --config <your config>` measures which knobs help this model on this "
                "machine (torch.compile among them: on CPUs it is often slower)"
            )
        lines.append(
            f"Low MFU: compute/mfu is {percent(mfu)} in {precision or 'this precision'} (below {low:.0%}): {fix}."
        )
    padding = run.mean("compute/padding_fraction")
    if padding is not None and padding > PADDING:
        how = (
            "set TokenDataModule(mode='packed') to pack sequences into fixed-length rows"
            if data == "TokenDataModule"
            else f"pack sequences into fixed-length rows in {data or 'your datamodule'} (concatenate documents with "
            "a separator and cut rows of seq_len, as lit_compute's TokenDataModule(mode='packed') does)"
        )
        lines.append(
            f"Padding waste: {percent(padding)} of the computed token positions are padding "
            f"(compute/padding_fraction): {how}, or group batches of similar length (a length-bucketing "
            "batch sampler)."
        )
    plugin = record.precision_plugin if record else ""
    if precision and not precision.startswith("32") and "FP32BatchNorm" not in plugin and _has_batchnorm(run):
        lines.append(
            f"Low precision ({precision}) without FP32BatchNormPrecision (plugin {plugin}): BatchNorm statistics "
            "in half precision drift and can overflow; use FP32BatchNormPrecision to keep norms in float32."
        )
    overlap, share = run.mean("profiler/comm_overlap_fraction"), run.mean("profiler/comm_fraction")
    if overlap is not None and overlap < 0.5 and (share is None or share >= 0.1):
        spent = f"collectives take {percent(share)} of the profiled steps and " if share is not None else ""
        lines.append(
            f"Communication-bound: {spent}only {percent(overlap)} of their time overlaps compute "
            "(profiler/comm_fraction, profiler/comm_overlap_fraction). Under DDP try a larger bucket_cap_mb, a "
            "compression hook (comm_hook='bf16' or 'powersgd') or NCCL settings (TunedDDPStrategy); under "
            "tensor parallelism keep the tensor-parallel group inside one node."
        )
    bandwidth = _bandwidth_advice(run)
    if bandwidth:
        lines.append(bandwidth)
    skipped = run.mean("amp/skipped_step_fraction")
    if skipped is not None and skipped > 0.05:
        lines.append(
            f"{percent(skipped)} of optimizer steps were skipped for inf/NaN gradients "
            "(amp/skipped_step_fraction): check the learning rate and the loss scale's init_scale/growth_interval."
        )
    return lines


def _bandwidth_advice(run: Run) -> str | None:
    """From CommBenchmark's figures: what all-reducing this model's gradients at the measured bus bandwidth costs
    per step, and the bandwidth that would keep it under a fifth of the step (not a fixed number)."""
    grad_bytes, estimate, step_ms = (
        run.last("comm/gradient_bytes"),
        run.last("comm/grad_allreduce_ms"),
        run.mean_step_ms,
    )
    world = run.record.world_size if run.record else None
    if not (grad_bytes and estimate and step_ms and world and world > 1) or estimate < COMM_SHARE * step_ms:
        return None
    busbw = run.last("comm/allreduce_busbw_gbps")
    needed = grad_bytes * 2 * (world - 1) / world / (COMM_SHARE * step_ms / 1e3) / 1e9
    return (
        f"Bandwidth-bound gradients: all-reducing this model's {grad_bytes / 2**20:.1f} MiB of gradients at the "
        f"measured bus bandwidth ({busbw or 0:.2f} GB/s, comm/allreduce_busbw_gbps) takes {estimate:.1f} ms, "
        f"{estimate / step_ms:.0%} of a {step_ms:.1f} ms step (comm/grad_allreduce_ms). Keeping it under "
        f"{COMM_SHARE:.0%} of the step needs {needed:.1f} GB/s bus bandwidth ({needed * 8:.0f} Gbit/s between nodes); "
        "otherwise overlap it (DDP buckets), compress it (comm_hook='bf16' or 'powersgd'), or accumulate more "
        "micro-batches per optimizer step."
    )


def _has_batchnorm(run: Run) -> bool:
    tables = run.texts.get("compute/flops_by_module", [])
    if not tables:
        return True  # unknown: say it
    return "bn" in tables[0].lower() or "batchnorm" in tables[0].lower()

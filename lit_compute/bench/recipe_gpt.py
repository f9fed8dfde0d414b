"""``lit-compute bench recipe --model gpt``: a small GPT on real text, baseline vs optimised, one change at a time.

Rows are cumulative: each adds one change to the row above: float32 on variable-length documents padded per
batch (the baseline), then FP32BatchNormPrecision bf16-mixed (norms in float32), then packing documents into
fixed-length rows instead of padding. Measured too and left out of the default rows, since none helped on 2 CPU
cores: twice the tokens per batch, a fused AdamW (both within the noise), and ``torch.compile`` of the blocks
(slower there; ``--compile`` adds that row, its compilation in the untimed first steps). Every row runs StepTimeMonitor
and FlopsLogger (``peak="measure"``, the GEMM peak of the row's dtype) and writes TensorBoard logs under ``--log-dir``.
Tokens per second count real (non-padding) tokens over the timed steps; MFU is FlopsLogger's, from model FLOPs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_compute.bench._common import cumulative_rows, emit, low_precision, machine_line, markdown
from lit_compute.data import TokenDataModule
from lit_compute.flops import FlopsLogger
from lit_compute.models import GPT
from lit_compute.monitoring import StepTimeMonitor
from lit_compute.precision import fp32_norm_precision


class TokenTimer(pl.Callback):
    """Wall time, real tokens and positions of every training step after ``skip`` warm-up steps."""

    def __init__(self, skip: int = 3) -> None:
        self.skip = skip
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self._last: float | None = None
        self._seen = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._last is not None and self._seen >= self.skip:
            ids = batch["input_ids"]
            mask = batch.get("attention_mask")
            self.times.append(now - self._last)
            self.tokens.append(int(mask.sum()) if mask is not None else ids.numel())
            self.positions.append(ids.numel())
        self._last = now
        self._seen += 1


def rows_for(device: str, compile_row: bool = False) -> list[dict[str, Any]]:
    precision = low_precision(device)
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("0_baseline", "baseline: 32-true, padded documents", {}),
        (f"1_{precision}", f"+ FP32BatchNormPrecision {precision}", {"precision": precision}),
        ("2_packed", "+ packed rows instead of padding", {"mode": "packed"}),
    ]
    if compile_row:
        steps.append(("3_compiled", "+ torch.compile (blocks)", {"compile": True}))
    return cumulative_rows({"precision": "32-true", "mode": "padded", "batch_mult": 1, "compile": False}, steps)


def run_row(row: dict[str, Any], args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    data = TokenDataModule(
        mode=row["mode"],
        batch_size=args.batch_size * row["batch_mult"],
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
    )
    model = GPT(
        block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, compile=row["compile"]
    )
    timer = TokenTimer(skip=3)
    # The same tokens in every row: a batch twice as long takes half the steps
    steps = max(6, args.steps // row["batch_mult"])
    callbacks: list[pl.Callback] = [
        timer,
        StepTimeMonitor(log_every_n_steps=5, window=20),
        FlopsLogger(peak="measure", log_every_n_steps=5),
    ]
    kwargs: dict[str, Any] = {}
    if row["precision"] != "32-true":
        kwargs["plugins"] = [fp32_norm_precision(row["precision"], fp32_norms=["LayerNorm"])]
    logger = pl.loggers.TensorBoardLogger(str(log_dir), name=row["slug"], version=0)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_steps=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
        **kwargs,
    )
    trainer.fit(model, datamodule=data)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    mfu = [e.value for e in acc.Scalars("compute/mfu")] if "compute/mfu" in tags else []
    seconds = sum(timer.times)
    return {
        "tokens_per_sec": sum(timer.tokens) / seconds if seconds else float("nan"),
        "samples_per_sec": len(timer.times) * args.batch_size * row["batch_mult"] / seconds
        if seconds
        else float("nan"),
        "padding": 1 - sum(timer.tokens) / sum(timer.positions) if timer.positions else float("nan"),
        "mfu": statistics.fmean(mfu) if mfu else float("nan"),
        "steps_timed": len(timer.times),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench recipe --model gpt",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="gpt", choices=["gpt"], help="the language-model recipe")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per batch in the first rows")
    parser.add_argument("--seq-len", type=int, default=256, help="longest document / packed row length (tokens)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per row (fewer with longer batches)")
    parser.add_argument("--n-layer", type=int, default=4, help="GPT blocks")
    parser.add_argument("--n-head", type=int, default=4, help="attention heads")
    parser.add_argument("--n-embd", type=int, default=256, help="model width")
    parser.add_argument("--max-tokens", type=int, default=1_000_000, help="corpus size (tokens)")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator")
    parser.add_argument("--log-dir", default="bench_logs/recipe_gpt", help="TensorBoard logs of every row")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile row")
    args = parser.parse_args(argv)
    device = "cuda" if args.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
    log_dir = Path(args.log_dir)
    rows = rows_for(device, compile_row=args.compile)
    emit(
        f"# bench recipe --model gpt: GPT {args.n_layer} layers x {args.n_embd} wide, {args.n_head} heads, sequences "
        f"up to {args.seq_len} tokens of this Python's standard library, batch {args.batch_size}, {args.steps} steps "
        f"per row, on {device}\n# {machine_line()}\n# TensorBoard logs: {log_dir} (lit-compute report {log_dir} --out "
        "recipe_gpt.md)\n"
    )
    results = []
    for i, row in enumerate(rows, 1):
        emit(f"  [{i}/{len(rows)}] {row['name']} ...")
        measured = run_row(row, args, log_dir)
        results.append(measured)
        emit(f"        {measured['tokens_per_sec']:,.0f} tokens/s")
    base = results[0]["tokens_per_sec"]
    table = [
        [
            row["name"],
            float(r["tokens_per_sec"]),
            float(r["samples_per_sec"]),
            f"{100 * r['mfu']:.1f}%",
            f"{100 * r['padding']:.1f}%",
            r["steps_timed"],
            f"{r['tokens_per_sec'] / base:.2f}x",
        ]
        for row, r in zip(rows, results)
    ]
    emit("")
    emit(markdown(["configuration", "tokens/s", "rows/s", "MFU", "padding", "steps timed", "vs baseline"], table))
    emit(f"\noptimised / baseline tokens per second: {results[-1]['tokens_per_sec'] / base:.2f}x")
    return 0

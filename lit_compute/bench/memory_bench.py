"""``lit-compute bench memory [--markdown FILE]``: the peak memory per device ``lit-compute estimate`` predicts
before any step, beside what torch measures over a real step of the same config: a convnet (the demo's ResNet-18),
one whose constructor computes with tensors (RegNet), a convolution-heavy CNN, a ViT, an encoder, a decoder with
grouped-query attention (with and without activation checkpointing), an encoder-decoder, our GPT and a Hugging Face
GPT-2, and the GPT sharded over 2 processes (tensor parallel, FSDP2), at two micro-batch sizes each. ``--set second``:
eight workloads written before any was measured (:data:`SECOND`).

The reference (:mod:`lit_compute.bench.memory_reference`): on a CPU, the allocator's live bytes through one
steady-state step from the profiler's memory events (torch's memory profiler timeline beside it); on CUDA,
``max_memory_allocated`` (``max_memory_reserved`` beside it). MemoryMonitor's tracked peak of the same run is the
last column: the tracker on real tensors, a check of tracing, not of the prediction."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from lit_compute.bench._common import emit, figure_header, machine_line, markdown, run_fit
from lit_compute.formatting import exit_status

ROOT = Path(__file__).resolve().parents[2]
SHARDED = [
    "--data.init_args.max_tokens=200000",
    "--data.init_args.seq_len=64",
    "--model.init_args.block_size=64",
    "--model.init_args.n_layer=2",
    "--data.init_args.mode=packed",
]
# name, config, arguments keeping it small on 2 cores, micro-batch sizes, processes
CASES: list[tuple[str, str, list[str], list[int], int]] = [
    (
        "demo: ResNet-18, bf16-mixed (quickstart.yaml)",
        "configs/quickstart.yaml",
        ["--data.init_args.num_workers=0"],
        [4, 32],
        1,
    ),
    ("RegNet-Y 400MF, constructor computes with tensors", "examples/memory/regnet.yaml", [], [2, 8], 1),
    ("3-conv CNN, 64 px (convolution workspaces)", "examples/memory/cnn.yaml", [], [2, 16], 1),
    ("ViT-B/16, 64 px", "examples/memory/vit.yaml", [], [2, 8], 1),
    ("BERT encoder, 4 layers", "examples/memory/bert.yaml", [], [2, 8], 1),
    ("Llama decoder, grouped-query attention, bf16-mixed", "examples/memory/llama_gqa.yaml", [], [2, 8], 1),
    (
        "Llama decoder, GQA, activation checkpointing",
        "examples/memory/llama_gqa.yaml",
        ["--model.init_args.gradient_checkpointing=true"],
        [2, 8],
        1,
    ),
    ("T5 encoder-decoder, bf16-mixed", "examples/memory/t5.yaml", [], [2, 8], 1),
    (
        "GPT, 2 layers, packed (gpt.yaml)",
        "configs/gpt.yaml",
        ["--model.init_args.n_layer=2", "--data.init_args.max_tokens=200000", "--data.init_args.mode=packed"],
        [4, 16],
        1,
    ),
    (
        "Hugging Face GPT-2, 2 layers (examples/hf_gpt2.yaml)",
        "examples/hf_gpt2.yaml",
        ["--data.init_args.mode=packed", "--data.init_args.max_tokens=200000"],
        [2, 8],
        1,
    ),
    ("GPT sharded: tensor parallel 2 (gpt_model_parallel.yaml)", "configs/gpt_model_parallel.yaml", SHARDED, [2, 8], 2),
    (
        "GPT sharded: FSDP2 over 2 (gpt_model_parallel.yaml)",
        "configs/gpt_model_parallel.yaml",
        [
            *SHARDED,
            "--trainer.strategy.init_args.data_parallel_size=2",
            "--trainer.strategy.init_args.tensor_parallel_size=1",
        ],
        [2, 8],
        2,
    ),
]

#: the second set (#69 item 3), written and committed before any of it was measured: workloads nobody here fitted
#: the estimate to, each of a kind the first set lacks
SECOND: list[tuple[str, str, list[str], list[int], int]] = [
    ("GRU language model, 2 layers x 384", "examples/memory/gru.yaml", [], [2, 8], 1),
    ("Mixtral mixture of experts, 4 experts top-2, bf16-mixed", "examples/memory/mixtral.yaml", [], [2, 8], 1),
    ("Swin-T, windowed attention, 64 px", "examples/memory/swin.yaml", [], [2, 8], 1),
    ("BART encoder-decoder, 2 + 2 layers", "examples/memory/bart.yaml", [], [2, 8], 1),
    ("MobileNetV3-small, depthwise, 64 px", "examples/memory/mobilenet.yaml", [], [2, 16], 1),
    ("Llama decoder with a tied head, 4,096 tokens", "examples/memory/tied.yaml", [], [2, 8], 1),
    ("ResNet-18 under torch.compile, 64 px", "examples/memory/compiled.yaml", [], [2, 16], 1),
    (
        "GPT 3 layers x 96, bf16-mixed, FSDP2 over 2",
        "configs/gpt_model_parallel.yaml",
        [
            *SHARDED,
            "--model.init_args.n_layer=3",
            "--model.init_args.n_embd=96",
            "--model.init_args.n_head=4",
            "--trainer.precision=bf16-mixed",
            "--trainer.strategy.init_args.data_parallel_size=2",
            "--trainer.strategy.init_args.tensor_parallel_size=1",
        ],
        [2, 8],
        2,
    ),
]
SETS = {"first": CASES, "second": SECOND}


def measured(config: str, overrides: list[str], micro_batch: int, processes: int) -> dict[str, Any]:
    """What torch measured over step 2 of a real run (the largest rank's, each figure on its own) and MemoryMonitor's
    tracked peak of its steps 0 and 1 (a fresh process: sharded runs launch their second rank by re-running the
    command)."""
    with tempfile.TemporaryDirectory() as out:
        logger = (
            "--trainer.logger=[{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: "
            f"{out}, name: runs"
            "}}]"
        )
        callbacks = (
            "--trainer.callbacks=[{class_path: lit_compute.MemoryMonitor, init_args: {log_every_n_steps: 1}}, "
            "{class_path: lit_compute.bench.memory_reference.ProfiledStep, init_args: {out: "
            f"{out}/reference, step: 2"
            "}}]"
        )
        command = [
            "--config",
            config,
            *overrides,
            f"--data.init_args.batch_size={micro_batch}",
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=0",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            logger,
            callbacks,
        ]
        log = Path(out, "fit.log")
        returncode = run_fit(command, log)  # forked from a helper that imported torch and Lightning once
        if returncode:
            raise RuntimeError(
                f"{config} at micro-batch {micro_batch} failed ({exit_status(returncode)}): {log.read_text()[-800:]}"
            )
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        ranks = [json.loads(p.read_text()) for p in sorted(Path(out, "reference").glob("rank*.json"))]
        if len(ranks) != processes:
            raise RuntimeError(f"{config} at micro-batch {micro_batch}: {len(ranks)} of {processes} ranks measured")
        found: dict[str, Any] = {
            key: float(max(r[key] for r in ranks)) for key in ranks[0] if isinstance(ranks[0][key], (int, float))
        }
        failed = [r["timeline_error"] for r in ranks if "timeline_error" in r]
        if failed:  # torch's timeline (the column beside) could not be built on a rank: said in place of its figure
            found.pop("timeline_peak", None)
            found["timeline_error"] = failed[0]
        run = next(Path(out, "runs").glob("version_*"))
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        tag = "memory/peak_gb_rank_max" if processes > 1 else "memory/peak_gb"
        found["monitor_peak"] = max(e.value for e in acc.Scalars(tag)) * 1e9
        found["cuda"] = float(ranks[0]["device"].startswith("cuda"))
        return found


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def _pct(predicted: float, reference: float) -> str:
    return f"{100 * (predicted / reference - 1):+.1f}%"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute bench memory", description=__doc__)
    parser.add_argument("--markdown", default=None, help="also write the table, with its header, to this file")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    parser.add_argument(
        "--set",
        choices=sorted(SETS),
        default="first",
        help="the workloads the estimate was developed on (first) or the ones written before measuring (second)",
    )
    args = parser.parse_args(argv)
    from lit_compute.planning import estimate

    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    rows: list[list[Any]] = []
    errors: list[float] = []
    timeline: list[float] = []
    cuda = False
    for name, config, overrides, sizes, processes in SETS[args.set]:
        if args.only and args.only not in name:
            continue
        emit(f"{name} ...")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = estimate(config, micro_batches=sizes, overrides=overrides, checkpoint_advice=False)
        for size in sizes:
            predicted = max(r.peak_bytes for r in plan.rows if r.micro_batch == size)
            # a model fake tensors cannot run is measured by the estimate itself on a real step: not a prediction
            method = next(r.method for r in plan.rows if r.micro_batch == size)
            label = name if method == "traced on fake tensors" else f"{name} (estimate {method}: not a prediction)"
            reserved = max(r.reserved_bytes or 0 for r in plan.rows if r.micro_batch == size)
            try:
                found = measured(config, overrides, size, processes)
            except (RuntimeError, subprocess.TimeoutExpired) as err:  # one workload's run: its row says why
                lines = [line for line in str(err).splitlines() if line.strip()]
                # the reason: the last line naming an error in the run's log tail, else the message's first line
                why = next((ln for ln in reversed(lines) if "Error" in ln or "Killed" in ln), lines[0] if lines else "")
                why = why.strip()[:160]
                rows.append([label, size, _mb(predicted), "not measured", "n/a", why, "n/a"])
                emit(f"  micro-batch {size}: not measured ({why})")
                continue
            cuda = cuda or bool(found["cuda"])
            reference = found["max_memory_allocated"] if found["cuda"] else found["allocator_peak"]
            if label == name:
                errors.append(predicted / reference - 1)
            beside = (
                f"{_mb(found['max_memory_reserved'])} (predicted {_mb(reserved)})"
                if found["cuda"]
                else f"n/a ({found['timeline_error']})"
                if "timeline_error" in found
                else f"{_mb(found['timeline_peak'])} ({_pct(predicted, found['timeline_peak'])})"
            )
            if not found["cuda"] and label == name and "timeline_peak" in found:
                timeline.append(abs(predicted / found["timeline_peak"] - 1))
            rows.append(
                [
                    label,
                    size,
                    _mb(predicted),
                    _mb(reference),
                    _pct(predicted, reference),
                    beside,
                    _mb(found["monitor_peak"]),
                ]
            )
            emit(f"  micro-batch {size}: predicted {_mb(predicted)} MB, measured {_mb(reference)} MB")
    reference_name = "max_memory_allocated MB" if cuda else "allocator peak MB"
    beside_name = "max_memory_reserved MB" if cuda else "profiler timeline MB"
    table = markdown(
        [
            "workload",
            "micro-batch",
            "predicted peak MB",
            reference_name,
            "error",
            beside_name,
            "MemoryMonitor MB (tracing check)",
        ],
        rows,
    )
    summary = ""
    if errors:
        summary = (
            f"Largest error against the {'caching allocator' if cuda else 'allocator'}: "
            f"{100 * max(abs(e) for e in errors):.1f}% over {len(errors)} predictions"
            + (f"; the furthest under it {100 * min(errors):+.1f}%." if min(errors) < 0 else "; none under it.")
        )
    if real := sum("not a prediction" in r[0] for r in rows):
        summary += (
            f" {real} row(s) are not predictions: the model cannot be traced on fake tensors, so the estimate measured "
            "a real step itself (its note says why); they are left out of the figures above."
        )
    if missing := sum(r[3] == "not measured" for r in rows):
        summary += f" {missing} run(s) not measured (their rows say why)."
        if timeline:
            summary += f" Against torch's memory profiler timeline: up to {100 * max(timeline):.1f}%."
    text = f"{table}\n\n{summary}\n"
    emit(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(
            figure_header(
                "lit-compute bench memory"
                + (f" --set {args.set}" if args.set != "first" else "")
                + (f" --only {args.only}" if args.only else ""),
                machine_line(),
            )
            + text
        )
        emit(f"written: {args.markdown}")
    return 0

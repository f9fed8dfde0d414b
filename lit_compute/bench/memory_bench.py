"""``lit-compute bench memory [--markdown FILE]``: the peak memory per device ``lit-compute estimate`` predicts
before any step, beside the peak MemoryMonitor measures on real steps, for the demo, the GPT, a Hugging Face GPT-2
and the sharded GPT on 2 processes (tensor parallel, FSDP2), at three micro-batch sizes each."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from lit_compute.bench._common import emit, figure_header, machine_line, markdown
from lit_compute.warm_start import start_process, stop_group

ROOT = Path(__file__).resolve().parents[2]
SHARDED = ["--data.init_args.max_tokens=200000", "--data.init_args.seq_len=64", "--model.init_args.block_size=64",
           "--model.init_args.n_layer=2", "--data.init_args.mode=packed"]
# name, config, arguments keeping it small on 2 cores, micro-batch sizes, processes
CASES: list[tuple[str, str, list[str], list[int], int]] = [
    ("demo: ResNet-18, bf16-mixed (quickstart.yaml)", "configs/quickstart.yaml", ["--data.init_args.num_workers=0"],
     [16, 32, 64], 1),
    ("GPT, 2 layers, packed (gpt.yaml)", "configs/gpt.yaml",
     ["--model.init_args.n_layer=2", "--data.init_args.max_tokens=200000", "--data.init_args.mode=packed"], [4, 8, 16], 1),
    ("Hugging Face GPT-2, 2 layers (examples/hf_gpt2.yaml)", "examples/hf_gpt2.yaml",
     ["--data.init_args.mode=packed", "--data.init_args.max_tokens=200000"], [2, 4, 8], 1),
    ("GPT sharded: tensor parallel 2 (gpt_model_parallel.yaml)", "configs/gpt_model_parallel.yaml", SHARDED,
     [2, 4, 8], 2),
    ("GPT sharded: FSDP2 over 2 (gpt_model_parallel.yaml)", "configs/gpt_model_parallel.yaml",
     [*SHARDED, "--trainer.strategy.init_args.data_parallel_size=2",
      "--trainer.strategy.init_args.tensor_parallel_size=1"], [2, 4, 8], 2),
]


def _measured(config: str, overrides: list[str], micro_batch: int, processes: int) -> float:
    """The largest peak of any rank MemoryMonitor logs over 3 real steps (a fresh process: sharded runs launch their
    second rank by re-running the command)."""
    with tempfile.TemporaryDirectory() as out:
        logger = ("--trainer.logger=[{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: "
                  f"{out}, name: runs" "}}]")
        command = [sys.executable, "-m", "lit_compute.cli", "fit", "--config", config, *overrides,
                   f"--data.init_args.batch_size={micro_batch}", "--trainer.max_steps=3", "--trainer.limit_val_batches=0",
                   "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
                   "--trainer.enable_model_summary=false", logger,
                   "--trainer.callbacks=[{class_path: lit_compute.MemoryMonitor, init_args: {log_every_n_steps: 1}}]"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        log = Path(out, "fit.log")
        with open(log, "w") as stream:  # forked from a helper that imported torch and Lightning once
            proc = start_process(command[1:], stdout=stream, env=env, cwd=ROOT)
            try:
                returncode = proc.wait(timeout=600)
            finally:
                if proc.poll() is None:
                    stop_group(proc)
        if returncode:
            raise RuntimeError(f"{config} at micro-batch {micro_batch} failed: {log.read_text()[-800:]}")
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        run = next(Path(out, "runs").glob("version_*"))
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        tag = "memory/peak_gb_rank_max" if processes > 1 else "memory/peak_gb"
        return max(e.value for e in acc.Scalars(tag)) * 1e9


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute bench memory", description=__doc__)
    parser.add_argument("--markdown", default=None, help="also write the table, with its header, to this file")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    args = parser.parse_args(argv)
    from lit_compute.planning import estimate

    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    rows: list[list[Any]] = []
    errors: list[float] = []
    for name, config, overrides, sizes, processes in CASES:
        if args.only and args.only not in name:
            continue
        emit(f"{name} ...")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = estimate(config, micro_batches=sizes, overrides=overrides, checkpoint_advice=False)
        for size in sizes:
            predicted = max(r.peak_bytes for r in plan.rows if r.micro_batch == size)
            measured = _measured(config, overrides, size, processes)
            error = predicted / measured - 1
            errors.append(abs(error))
            rows.append([name, size, f"{predicted / 1e6:.2f}", f"{measured / 1e6:.2f}", f"{100 * error:+.1f}%"])
    table = markdown(["workload", "micro-batch", "predicted peak MB", "measured peak MB", "error"], rows)
    summary = f"Largest error: {100 * max(errors):.1f}% over {len(errors)} predictions." if errors else ""
    text = f"{table}\n\n{summary}\n"
    emit(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(figure_header(f"lit-compute bench memory{' --only ' + args.only if args.only else ''}",
                                                     machine_line()) + text)
        emit(f"written: {args.markdown}")
    return 0

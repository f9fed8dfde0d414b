"""``lit-compute bench warmstart [--pairs N]``: a training run forked from the warm helper (how the tune starts its
trials and ``bench memory`` its runs: :mod:`lit_compute.warm_start`) against the same run in a new interpreter, side by
side in alternating pairs: the steady step time of each (StepTimeMonitor's mean over the run's logged steps, the
warm-up excluded), their ratio per pair with a 95% interval over the pairs, and the wall time each took to finish
(the import the fork saves).

A forked child that ran slower than a fresh one (a thread pool, an allocator or a random state inherited from the
helper) would bias every tune that compares trials; this measures it."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lit_compute.bench._common import emit, markdown, ratio_interval, run_fit
from lit_compute.formatting import exit_status


def _one(args: list[str], out: Path, warm: bool) -> tuple[float, float]:
    """(mean step seconds, wall seconds to finish) of one ``lit-compute fit`` run, forked from the helper or not."""
    from lit_compute.bench.whatif.training import LOGGER
    from lit_compute.planning.whatif import read_run

    log = out / "fit.log"
    start = time.monotonic()
    code = run_fit([*args, LOGGER % out], log, warm=warm)
    wall = time.monotonic() - start
    if code:
        raise RuntimeError(
            f"lit-compute fit ({'forked' if warm else 'fresh'}) failed ({exit_status(code)}): {log.read_text()[-800:]}"
        )
    run = max(Path(out, "runs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    step = read_run(run).step_s
    if not step:
        raise RuntimeError(f"{run}: no measured step time (time/step_ms)")
    return step, wall


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute bench warmstart", description=__doc__)
    parser.add_argument("--pairs", type=int, default=4, help="alternating pairs of runs (default 4)")
    parser.add_argument("--markdown", default=None, help="also write the table, with its header, to this file")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error(f"--pairs {args.pairs}: at least 2, for an interval over the pairs")
    from lit_compute.bench.whatif.training import IMAGE_ARGS, MEASURING_CALLBACKS

    config = [*IMAGE_ARGS, MEASURING_CALLBACKS]
    rows, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)  # who runs first turns each pair
            found: dict[bool, tuple[float, float]] = {}
            for warm in order:
                emit(f"pair {pair + 1} of {args.pairs}: {'forked' if warm else 'fresh'} ...")
                out = Path(tmp, f"{pair}-{'forked' if warm else 'fresh'}")
                out.mkdir()
                found[warm] = _one(config, out, warm)
            ratio = found[False][0] / found[True][0]  # forked's speed over fresh's: fresh step / forked step
            ratios.append(ratio)
            rows.append(
                [
                    pair + 1,
                    "forked first" if order[0] else "fresh first",
                    f"{found[False][0] * 1e3:.1f}",
                    f"{found[True][0] * 1e3:.1f}",
                    f"{ratio:.3f}x",
                    f"{found[False][1]:.1f} / {found[True][1]:.1f}",
                ]
            )
    center, low, high = ratio_interval(ratios)
    table = markdown(
        ["pair", "order", "fresh step ms", "forked step ms", "forked speed / fresh", "wall s (fresh / forked)"], rows
    )
    summary = (
        f"Forked over fresh, the step's speed: {center:.3f}x, 95% interval "
        f"{low:.3f}-{high:.3f}x over {len(ratios)} pairs "
        "(torchvision ResNet-18 at 64 px, float32, micro-batch 16, 50 steps, FlopsLogger, StepTimeMonitor and "
        "MemoryMonitor on; the step is StepTimeMonitor's mean over the logged steps)."
    )
    text = f"{table}\n\n{summary}\n"
    emit(text)
    if args.markdown:
        from lit_compute.bench._common import figure_header, machine_line

        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(
            figure_header(f"lit-compute bench warmstart --pairs {args.pairs}", machine_line()) + text
        )
        emit(f"written: {args.markdown}")
    return 0

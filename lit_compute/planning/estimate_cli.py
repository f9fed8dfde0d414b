"""``lit-compute estimate --config my.yaml [--device NAME | --memory 80GB] [--micro-batch 8,16,32] [--json]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from lit_compute.formatting import markdown_table
from lit_compute.memory.tracker import PARTS
from lit_compute.planning.capacity import CapacityError
from lit_compute.planning.estimate import EstimateError, Plan, estimate

__all__ = ["main", "render"]


def _gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.3f}"


def render(plan: Plan) -> str:
    """The plan as the text ``lit-compute estimate`` prints."""
    reserved = any(r.reserved_bytes is not None for r in plan.rows)  # CUDA: the caching allocator's reserved peak
    rows = [
        [
            r.micro_batch,
            _gb(r.peak_bytes),
            *([_gb(r.reserved_bytes)] if reserved else []),
            *(_gb(r.parts.get(p, 0)) for p in PARTS),
            r.at,
            {True: "yes", False: "NO", None: "-"}[r.fits],
        ]
        for r in plan.rows
    ]
    peak = "allocated peak GB" if reserved else "peak GB"
    lines = [
        f"Predicted peak memory per device of one training step ({plan.rows[0].method if plan.rows else ''}); "
        f"capacity: {plan.capacity_source}",
        "",
        markdown_table(
            [
                "micro-batch",
                peak,
                *(["reserved peak GB"] if reserved else []),
                *(f"{p} GB" for p in PARTS),
                "peak in",
                "fits",
            ],
            rows,
        ),
    ]
    lines += [f"- {note}" for note in plan.notes]
    if plan.checkpointing:
        lines += [
            "",
            "To fit a larger micro-batch, recompute these blocks' activations in backward "
            "(torch.utils.checkpoint), largest saving first:",
            "",
            markdown_table(
                ["block", "saves GB", "recompute GFLOPs per step"],
                [[f"`{c.module}`", _gb(c.saved_bytes), f"{c.recompute_flops / 1e9:.3g}"] for c in plan.checkpointing],
            ),
        ]
    return "\n".join(lines) + "\n"


#: the sections of a ``lit-compute fit`` command line an estimate passes on (``--trainer.precision=bf16-true``)
_FIT_SECTIONS = ("trainer", "model", "data", "optimizer", "lr_scheduler", "seed_everything")
_OPTIONS = ("--config", "--device", "--memory", "--micro-batch", "--json")


def _unknown_option(extra: list[str]) -> str | None:
    """The error for the first argument that is neither one of ours nor a ``lit-compute fit`` setting to pass on."""
    import difflib

    value_allowed = False
    for arg in extra:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            if name.split(".", 1)[0] in _FIT_SECTIONS:
                value_allowed = "=" not in arg
                continue
            close = difflib.get_close_matches(arg.split("=", 1)[0], _OPTIONS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f"; options: {', '.join(_OPTIONS)}, or --trainer.X=..."
            return f"unrecognized argument {arg.split('=', 1)[0]}{hint}"
        if not value_allowed:
            return f"unrecognized argument {arg!r}"
        value_allowed = False
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute estimate", description=__doc__)
    parser.add_argument("--config", required=True, help="the YAML you train with (lit-compute fit --config FILE)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--device",
        default=None,
        help="a device whose memory to fit into: a table key (h100-sxm, a100, l4, ...) or a device name "
        "('NVIDIA H200')",
    )
    where.add_argument("--memory", default=None, help="the memory to fit into: 80GB, 24GiB, 512MB")
    parser.add_argument(
        "--micro-batch",
        default=None,
        help="micro-batch sizes, comma-separated (default: the config's, half and twice it)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON row per micro-batch, then one with the largest that fits, for scripts",
    )
    args, overrides = parser.parse_known_args(argv)
    unknown = _unknown_option(overrides)
    if unknown:
        sys.stderr.write(f"lit-compute estimate: error: {unknown}\n")
        return 2
    try:
        sizes = [int(s) for s in args.micro_batch.split(",") if s.strip()] if args.micro_batch else None
    except ValueError:
        sys.stderr.write(
            f"lit-compute estimate: error: --micro-batch {args.micro_batch!r}: give whole numbers, "
            "comma-separated (8,16,32)\n"
        )
        return 2
    if os.getcwd() not in sys.path:  # the config's class paths import from here, as lit-compute fit's do
        sys.path.insert(0, os.getcwd())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = estimate(
                args.config, micro_batches=sizes, device=args.device, memory=args.memory, overrides=overrides
            )
    except (EstimateError, CapacityError) as err:
        sys.stderr.write(f"lit-compute estimate: error: {err}\n")
        return 2
    if args.json:
        for row in plan.rows:
            sys.stdout.write(json.dumps(row.as_json()) + "\n")
        sys.stdout.write(json.dumps(plan.summary_json()) + "\n")  # the largest micro-batch that fits, the notes
    else:
        sys.stdout.write(render(plan))
    return 0

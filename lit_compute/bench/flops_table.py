"""``lit-compute bench flops``: our counts vs torchvision's published figures vs plain FlopCounterMode."""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models import get_model_weights

from lit_compute.bench._common import emit, machine_line, markdown
from lit_compute.flops import count_flops
from lit_compute.models import classification_models


def _build(name: str, device: str) -> tuple[torch.nn.Module, int, float]:
    weights = get_model_weights(name).DEFAULT
    crop = int(weights.transforms().crop_size[0])
    kwargs = {"image_size": crop} if name.startswith("vit") else {}
    try:
        with torch.device(device):
            model = torchvision.models.get_model(name, weights=None, **kwargs)
    except (NotImplementedError, RuntimeError):  # an initialiser that reads values cannot run on meta
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    return model.eval(), crop, 2.0 * weights.meta["_ops"]


def zoo_main(args: argparse.Namespace) -> int:
    """Forward + backward model FLOPs of the transformers zoo: ours, plain FlopCounterMode and Lightning's
    ``measure_flops`` against the analytic count."""
    from lightning.fabric.utilities.throughput import measure_flops

    from lit_compute.bench.zoo import output_loss, transformers_zoo

    emit(
        "# bench flops --zoo transformers: forward + backward FLOPs of one training batch (batch 2 x 16 tokens; "
        f"T5: 16 encoder + 8 decoder tokens)\n# {machine_line()}\n"
        "# ours = model FLOPs on the real CPU kernels; plain = torch's FlopCounterMode on the same kernels; "
        "lightning = lightning's measure_flops on a meta-device model; analytic = 3 x the architecture's forward\n"
    )
    rows, worst = [], 0.0
    for entry in transformers_zoo():
        for attention in ("sdpa", "eager"):
            model, inputs = entry.build(attention), entry.inputs()
            analytic = 3 * entry.forward_flops
            t0 = time.perf_counter()
            ours = count_flops(model, count_on="real", **inputs)  # type: ignore[arg-type]  # inputs are tensors
            seconds = time.perf_counter() - t0
            with FlopCounterMode(display=False) as plain:
                output_loss(model(**inputs)).backward()
            model.zero_grad(set_to_none=True)
            meta_model = entry.build(attention, device="meta")
            meta_inputs = entry.inputs("meta")
            try:
                lightning = float(
                    measure_flops(meta_model, functools.partial(_forward, meta_model, meta_inputs), output_loss)
                )
            except Exception:  # noqa: BLE001 - a meta kernel that refuses (grouped mm in float32)
                lightning = float("nan")
            worst = max(worst, abs(ours.total / analytic - 1))
            rows.append(
                [
                    entry.name,
                    attention,
                    round(analytic / 1e6, 4),
                    round(ours.total / 1e6, 4),
                    f"{ours.total / analytic:.4f}",
                    round(ours.hardware / 1e6, 4),
                    round(plain.get_total_flops() / 1e6, 4),
                    f"{plain.get_total_flops() / analytic:.4f}",
                    round(lightning / 1e6, 4) if lightning == lightning else "n/a",
                    f"{lightning / analytic:.4f}" if lightning == lightning else "n/a",
                    round(seconds, 3),
                ]
            )
            emit(f"  {entry.name} ({attention}): ours {ours.total / 1e6:.4f} MFLOPs, analytic {analytic / 1e6:.4f}")
    emit("")
    emit(
        markdown(
            [
                "model",
                "attention",
                "analytic MFLOPs",
                "ours MFLOPs",
                "ours / analytic",
                "ours hardware",
                "plain FlopCounterMode",
                "plain / analytic",
                "lightning measure_flops",
                "lightning / analytic",
                "count s",
            ],
            rows,
        )
    )
    ok = worst <= 1e-3
    emit(f"\n{len(rows)} counts; ours within 0.1% of the analytic figure everywhere: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench flops", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--zoo",
        choices=["torchvision", "transformers"],
        default="torchvision",
        help="torchvision: forward GFLOPs of every classification model vs the published figures; "
        "transformers: forward + backward of small transformers configs vs analytic counts",
    )
    parser.add_argument("--models", nargs="*", help="torchvision model names (default: every classification model)")
    parser.add_argument(
        "--plain-on",
        choices=["cpu", "meta", "skip"],
        default="cpu",
        help="run plain FlopCounterMode on real CPU tensors (the kernel path users hit), on meta, or skip",
    )
    args = parser.parse_args(argv)
    if args.zoo == "transformers":
        return zoo_main(args)
    names = args.models or classification_models()
    emit(f"# bench flops: forward GFLOPs at the published crop, batch 1, eval mode\n# {machine_line()}\n")
    rows, worst = [], 0.0
    for name in names:
        model, crop, published = _build(name, "meta")
        t0 = time.perf_counter()
        ours = count_flops(model, torch.zeros(1, 3, crop, crop), backward=False, count_on="meta").forward
        t_ours = time.perf_counter() - t0
        ratio = ours / (published * 1e9)
        tolerance = max(0.01, 2 * 0.0005 / published)  # 1%, or the rounding of a three-decimal figure
        worst = max(worst, abs(ratio - 1) / tolerance)
        plain = float("nan")
        if args.plain_on != "skip":
            real, _, _ = _build(name, args.plain_on)
            x = torch.zeros(1, 3, crop, crop, device=args.plain_on)
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                real(x)
            plain = counter.get_total_flops() / 1e9
            del real
        rows.append(
            [
                name,
                crop,
                round(ours / 1e9, 4),
                round(published, 4),
                f"{ratio:.4f}",
                plain,
                f"{plain / (ours / 1e9):.4f}" if plain == plain else "n/a",
                round(t_ours, 3),
            ]
        )
        emit(f"  {name}: ours {ours / 1e9:.4f}, published {published:.4f}, plain {plain:.4f}")
    emit("")
    emit(
        markdown(
            [
                "model",
                "crop",
                "ours GFLOPs",
                "2 x torchvision _ops",
                "ours / published",
                f"plain FlopCounterMode ({args.plain_on})",
                "plain / ours",
                "count s",
            ],
            rows,
        )
    )
    ok = worst <= 1.0
    emit(f"\n{len(rows)} models; every count within 1% (or the published rounding): {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def _forward(model: Any, inputs: dict[str, Any]) -> Any:
    return model(**inputs)

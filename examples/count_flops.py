"""Count a model's FLOPs (forward and backward) and compare with a device's dense peak.

python examples/count_flops.py
"""

import torch
import torchvision

from lit_compute.flops import count_flops, peak_flops

if __name__ == "__main__":
    model = torchvision.models.vit_b_16()
    count = count_flops(model, torch.zeros(8, 3, 224, 224), count_on="meta")  # shapes only: instant, no memory
    print(f"ViT-B/16, batch 8: forward {count.forward / 1e9:.1f} GFLOPs, backward {count.backward / 1e9:.1f} GFLOPs")
    for path, fwd, total in count.table(depth=1)[:5]:
        print(f"  {path:<20} forward {fwd / 1e9:8.2f}  fwd+bwd {total / 1e9:8.2f} GFLOPs")
    peak = peak_flops("NVIDIA H200", torch.bfloat16)
    print(f"one training step on an H200 in bf16 takes at least {count.total / peak * 1e3:.2f} ms at 100% MFU")

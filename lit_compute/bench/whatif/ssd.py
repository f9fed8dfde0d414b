"""SSD300 with a ResNet-50 trunk as NVIDIA's DeepLearningExamples trains it (PyTorch/Detection/SSD, the workload of
Lambda's ``ssd`` column), written here from its description: the trunk is torchvision's ResNet-50 up to its third
stage, whose first block keeps the resolution (stride 1: 38x38 features at 300 px); five extra blocks (a 1x1
convolution, then a 3x3 one, each with batch norm and ReLU; stride 2 for the first three, unpadded for the last two)
give six feature maps (38, 19, 10, 5, 3 and 1 px); on each, a 3x3 convolution predicts 4 box offsets and a 3x3 one 81
class scores for each of 4, 6, 6, 6, 4 and 4 default boxes a position (8,732 boxes). The loss, in float32 after the
forward: smooth L1 on the positive boxes' encoded offsets, and cross entropy over every box with hard negatives mined
by sorting (the three times as many negatives with the largest loss), per image over its positives, then averaged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: default boxes a position on each feature map, and the channels of each map
BOXES = (4, 6, 6, 6, 4, 4)
CHANNELS = (1024, 512, 512, 256, 256, 256)
#: the extra blocks' middle channels
MIDDLE = (256, 256, 128, 128, 128)
CLASSES = 81  # COCO's 80 and the background


def _trunk() -> nn.Module:
    import torchvision

    net = torchvision.models.resnet50()
    stages = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3)
    first = net.layer3[0]
    first.conv1.stride = first.conv2.stride = (1, 1)
    first.downsample[0].stride = (1, 1)
    return stages


def _extra(inputs: int, middle: int, outputs: int, halves: bool) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(inputs, middle, 1, bias=False),
        nn.BatchNorm2d(middle),
        nn.ReLU(inplace=True),
        nn.Conv2d(middle, outputs, 3, stride=2 if halves else 1, padding=1 if halves else 0, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU(inplace=True),
    )


class SSD300(nn.Module):
    """The network: images (N, 3, 300, 300) in, box offsets (N, 4, 8732) and class scores (N, 81, 8732) out."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = _trunk()
        self.extras = nn.ModuleList(
            _extra(i, m, o, halves=index < 3)
            for index, (i, m, o) in enumerate(zip(CHANNELS[:-1], MIDDLE, CHANNELS[1:], strict=True))
        )
        self.loc = nn.ModuleList(nn.Conv2d(c, 4 * b, 3, padding=1) for c, b in zip(CHANNELS, BOXES, strict=True))
        self.conf = nn.ModuleList(nn.Conv2d(c, CLASSES * b, 3, padding=1) for c, b in zip(CHANNELS, BOXES, strict=True))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        maps = [self.trunk(x)]
        for block in self.extras:
            maps.append(block(maps[-1]))
        n = x.shape[0]
        locs = torch.cat([head(m).reshape(n, 4, -1) for head, m in zip(self.loc, maps, strict=True)], 2)
        confs = torch.cat([head(m).reshape(n, CLASSES, -1) for head, m in zip(self.conf, maps, strict=True)], 2)
        return locs.contiguous(), confs.contiguous()


def ssd_loss(locs: torch.Tensor, confs: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The detection loss of a batch (see the module's docstring); ``boxes`` (N, 4, 8732) are the matched ground truth
    as centre and size, ``labels`` (N, 8732) their classes (0: background). The positives' mask is applied by
    multiplying, as a mask of fixed shape (what the source's boolean indexing computes)."""
    positive = labels > 0
    count = positive.sum(dim=1)
    default = torch.full_like(boxes[:1], 0.5)  # the default boxes' centres and sizes, one set for the batch
    encoded = torch.cat(
        [10.0 * (boxes[:, :2] - default[:, :2]) / default[:, 2:], 5.0 * (boxes[:, 2:] / default[:, 2:]).log()], 1
    )
    where = nn.functional.smooth_l1_loss(locs, encoded, reduction="none").sum(dim=1)
    where = (positive.float() * where).sum(dim=1)
    what = nn.functional.cross_entropy(confs, labels, reduction="none")
    negative = torch.where(positive, torch.zeros_like(what), what)
    _, order = negative.sort(dim=1, descending=True)
    _, rank = order.sort(dim=1)
    mined = rank < torch.clamp(3 * count, max=positive.shape[1]).unsqueeze(-1)
    what = (what * (positive | mined).float()).sum(dim=1)
    return ((where + what) * (count > 0).float() / count.float().clamp(min=1e-6)).mean()


def ssd_step(net: Any, batch: int) -> Any:
    """The loss of one batch of 300 px images with every box's ground truth (counted on fake tensors: the shapes are
    what the count reads, not the values)."""
    images = torch.randn(batch, 3, 300, 300)
    locs, confs = net(images)
    boxes = torch.rand(batch, 4, locs.shape[-1]) + 0.1
    labels = torch.zeros(batch, locs.shape[-1], dtype=torch.long)
    return ssd_loss(locs.float(), confs.float(), boxes, labels)

import pytest
import torch

from lit_compute.models import ImageClassifier


def test_unknown_arch_lists_valid_names():
    with pytest.raises(ValueError, match=r"ImageClassifier\(arch='resnet1'\).*resnet18.*resnet50"):
        ImageClassifier(arch="resnet1")


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v3_small", "googlenet"])
def test_forward_gives_logits(arch):
    model = ImageClassifier(arch=arch, num_classes=5).train()
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 5)


def test_channels_last_model_and_input():
    model = ImageClassifier(channels_last=True)
    conv = model.net.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)

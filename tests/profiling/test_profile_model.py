"""profile_model: one inference profiled outside any trainer."""

from __future__ import annotations

import torch
import torchvision

from lit_compute import profile_model


def test_profile_model_on_cpu_makes_no_cuda_call(monkeypatch, capsys):
    def no_cuda(*args, **kwargs):
        raise AssertionError("CUDA was touched")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", no_cuda)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", no_cuda)
    model = torchvision.models.resnet18().train()
    result = profile_model(model, (1, 3, 64, 64))
    out = capsys.readouterr().out
    assert "aten::" in out
    assert "peak memory" in out
    assert result.peak_memory_mb
    assert result.peak_memory_mb > 0
    assert model.training  # mode restored

"""StepTimeMonitor's input-bound advice, computed from the run's own loader (more in tests/test_timeline.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import ImageFolder

from lit_compute.data import make_synthetic_image_folder
from lit_compute.monitoring.step_time_monitor import input_bound_advice


def _trainer(loader, datamodule=None):
    return SimpleNamespace(
        train_dataloader=loader,
        datamodule=datamodule,
        num_devices=1,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )


def test_tensors_in_memory_get_no_dali_advice_and_image_files_do(tmp_path):
    in_memory = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8)), batch_size=4)
    advice = input_bound_advice(_trainer(in_memory), 0.5, 0.2, 20)
    assert "num_workers=0" in advice
    assert "DALI" not in advice
    root = make_synthetic_image_folder(tmp_path / "images", num_classes=2, images_per_class=2, image_size=(16, 16))
    files = DataLoader(ImageFolder(str(root / "train")), batch_size=4)
    assert "DALIImageDataModule" in input_bound_advice(_trainer(files), 0.5, 0.2, 20)

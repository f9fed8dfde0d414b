"""Shared fixtures: a private dataset cache, a tiny CPU trainer, tiny model and data, event-file reading."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Keep the synthetic dataset of the test session out of the user's cache; set before lit_compute is used.
_CACHE = Path(os.environ.get("PYTEST_LIT_COMPUTE_CACHE", "/tmp/lit_compute_test_cache"))
os.environ["LIT_COMPUTE_CACHE"] = str(_CACHE)

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from lit_compute import ImageClassifier, TorchvisionImageDataModule  # noqa: E402

TINY_DATA = dict(batch_size=8, image_size=32, synthetic_num_classes=4, synthetic_images_per_class=8, num_workers=0)


class RandomImages(torch.utils.data.Dataset):
    """``n`` seeded random images (4 classes), each taking ``sleep`` seconds to "load"."""

    def __init__(self, sleep: float = 0.0, n: int = 64, size: int = 32):
        self.sleep, self.n, self.size = sleep, n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % 4


def tiny_model(**kwargs) -> ImageClassifier:
    kwargs.setdefault("arch", "resnet18")
    kwargs.setdefault("num_classes", 4)
    return ImageClassifier(**kwargs)


def tiny_data(**kwargs) -> TorchvisionImageDataModule:
    return TorchvisionImageDataModule(**{**TINY_DATA, **kwargs})


def make_trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    """A tiny CPU trainer writing TensorBoard events under ``tmp_path``."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        limit_train_batches=3,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="logs"),
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


class SpawnDDP(pl.strategies.DDPStrategy):
    """Lightning's DDP with spawned processes that destroy their process group at teardown (left to interpreter
    exit, gloo's threads can abort a rank at random; TunedDDPStrategy does the same)."""

    def __init__(self, **kwargs):
        super().__init__(start_method="spawn", **kwargs)

    def teardown(self):
        super().teardown()
        from lit_compute.distributed.tuned_ddp import destroy_process_group

        destroy_process_group()


def read_events(log_dir: str | Path) -> EventAccumulator:
    """Load every event file under ``log_dir`` with TensorBoard's own reader (scalars and text)."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_values(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def text_values(acc: EventAccumulator, tag: str) -> list[str]:
    """Text written with ``add_text`` (stored as tensors by the text plugin)."""
    out = []
    for ev in acc.Tensors(tag + "/text_summary"):
        out.extend(s.decode() for s in ev.tensor_proto.string_val)
    return out


@pytest.fixture
def trainer_factory(tmp_path):
    def factory(**kwargs) -> pl.Trainer:
        return make_trainer(tmp_path, **kwargs)

    return factory


@pytest.fixture(autouse=True)
def _fresh_master_port(monkeypatch):
    """Lightning keeps the MASTER_PORT of the first DDP run in os.environ; each test picks a fresh free port."""
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)

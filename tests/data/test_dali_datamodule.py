"""DALIImageDataModule on the CPU pipeline (GPU ones are marked cuda)."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import nvidia.dali  # noqa: F401 - part of the test install (.[all,dev]): a missing DALI fails, never skips
import pytest
import torch
from PIL import Image

from lit_compute import DALIImageDataModule, TorchvisionImageDataModule
from lit_compute.data import make_synthetic_image_folder

from ..conftest import TINY_DATA, SpawnDDP, make_trainer, tiny_model

pytestmark = pytest.mark.dali

SMALL = {"batch_size": 8, "image_size": 32, "synthetic_num_classes": 4, "synthetic_images_per_class": 8}


def _dm(**kwargs) -> DALIImageDataModule:
    return DALIImageDataModule(**{**SMALL, **kwargs})


def test_batches_match_the_torchvision_datamodule():
    dali, tv = _dm(), TorchvisionImageDataModule(**TINY_DATA)
    dali.setup("fit")
    tv.setup("fit")
    for split in ("train_dataloader", "val_dataloader"):
        xd, yd = next(iter(getattr(dali, split)()))
        xt, yt = next(iter(getattr(tv, split)()))
        assert xd.shape == xt.shape
        assert xd.dtype == xt.dtype
        assert yd.dtype == yt.dtype == torch.int64
        assert abs(float(xd.mean()) - float(xt.mean())) < 0.5  # same normalisation
        assert float(xd.min()) > -2.2
        assert float(xd.max()) < 2.7
    assert dali.classes == tv.classes
    labels = {int(v) for _, y in dali.train_dataloader() for v in y}
    assert labels == {0, 1, 2, 3}


def test_val_images_equal_torchvision_ones_closely():
    dali, tv = _dm(), TorchvisionImageDataModule(**TINY_DATA)
    dali.setup("fit")
    tv.setup("fit")
    xd, yd = next(iter(dali.val_dataloader()))
    xt, yt = next(iter(tv.val_dataloader()))
    assert torch.equal(yd, yt)  # same order, same class indices
    # same resize + crop + normalise; the JPEG decoders and resamplers differ, so pixels differ a little
    assert float((xd - xt).abs().mean()) < 0.25
    assert float(torch.corrcoef(torch.stack([xd.flatten(), xt.flatten()]))[0, 1]) > 0.95


def test_one_epoch_reads_every_training_image_exactly_once():
    dm = _dm()
    dm.with_source_info = True
    dm.setup("fit")
    loader = dm.train_dataloader()
    paths = [p for _, _, batch_paths in loader for p in batch_paths]
    files = sorted(str(p) for p in (dm.resolved_data_dir() / "train").rglob("*.jpg"))
    assert sorted(paths) == files
    assert len(loader) == 4


def test_limited_epochs_start_fresh_shuffled_passes(tmp_path):
    dm = _dm(synthetic_images_per_class=16)  # 64 images, 8 batches per pass
    dm.with_source_info = True
    seen: list[list[str]] = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                seen.append([])
            seen[-1].extend(batch[2])

    class Model(type(tiny_model())):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch[:2], batch_idx)

    trainer = make_trainer(
        tmp_path, max_epochs=3, max_steps=-1, limit_train_batches=3, callbacks=[Record()], limit_val_batches=0
    )
    trainer.fit(Model(num_classes=4), datamodule=dm)
    assert len(seen) == 3
    assert all(len(s) == 24 and len(set(s)) == 24 for s in seen)
    # a continuation would have read the rest of pass 0; fresh passes read new permutations from their start
    reference = DALIImageDataModule(**{**SMALL, "synthetic_images_per_class": 16})
    reference.with_source_info = True
    reference.setup("fit")
    first_pass = [p for _, _, ps in reference.train_dataloader() for p in ps]
    assert dm.train_dataloader().passes == 3, dm.train_dataloader().passes
    assert seen[0] == first_pass[:24]
    assert seen[1] != first_pass[24:48]
    assert seen[1] != seen[0]
    assert seen[2] != seen[1]
    assert dm.train_dataloader().passes == 3


def test_sanity_check_does_not_eat_into_the_first_validation(tmp_path):
    dm = _dm()
    dm.with_source_info = True
    counts: list[int] = []

    class Count(pl.Callback):
        def on_validation_epoch_start(self, trainer, pl_module):
            counts.append(0)

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            counts[-1] += len(batch[2])

    class Model(type(tiny_model())):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch[:2], batch_idx)

        def validation_step(self, batch, batch_idx):
            return super().validation_step(batch[:2], batch_idx)

    trainer = make_trainer(
        tmp_path, max_steps=2, num_sanity_val_steps=1, limit_val_batches=None, callbacks=[Count()], val_check_interval=2
    )
    trainer.fit(Model(num_classes=4), datamodule=dm)
    n_val = len(list((dm.resolved_data_dir() / "val").rglob("*.jpg")))
    assert counts == [8, n_val]  # the sanity batch, then a whole validation epoch


class _WritePaths(pl.Callback):
    def __init__(self, out: Path):
        self.out = out

    def on_train_epoch_start(self, trainer, pl_module):
        self.paths: list[str] = []
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.paths.extend(batch[2])
        self.batches += 1

    def on_train_epoch_end(self, trainer, pl_module):
        (self.out / f"rank{trainer.global_rank}.txt").write_text("\n".join([str(self.batches), *self.paths]))


class _PathModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.lin(batch[0].mean(dim=(2, 3))), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.slow
def test_ddp_spawn_ranks_read_disjoint_shards_with_equal_batch_counts(tmp_path):
    dm = _dm(synthetic_images_per_class=9, num_threads=1)  # 36 images over 2 ranks, batches of 8
    dm.with_source_info = True
    trainer = make_trainer(
        tmp_path,
        max_epochs=1,
        max_steps=-1,
        limit_train_batches=None,
        devices=2,
        strategy=SpawnDDP(),
        callbacks=[_WritePaths(tmp_path)],
        logger=False,
        limit_val_batches=0,
    )
    trainer.fit(_PathModel(), datamodule=dm)
    ranks = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in (0, 1)]
    assert ranks[0][0] == ranks[1][0] == "3"  # equal batch counts: nobody waits on the last batch
    p0, p1 = set(ranks[0][1:]), set(ranks[1][1:])
    assert not p0 & p1
    files = {str(p) for p in (make_synthetic_image_folder(None, 4, 9, (37, 37), 0) / "train").rglob("*.jpg")}
    assert p0 | p1 == files


def test_demo_trains_with_the_dali_datamodule(tmp_path, monkeypatch):
    from lit_compute.cli import LitComputeCLI

    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[2]
    cli = LitComputeCLI(
        args=[
            "fit",
            "--config",
            str(root / "configs" / "dali.yaml"),
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=1",
            "--data.init_args.synthetic_images_per_class=8",
            "--trainer.log_every_n_steps=1",
        ]
    )
    assert cli.trainer.global_step == 3
    assert isinstance(cli.datamodule, DALIImageDataModule)


def test_png_and_grayscale_inputs_give_rgb(tmp_path):
    for split in ("train", "val"):
        for cls in ("a", "b"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            rng = np.random.default_rng(0)
            Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8), "L").save(folder / "gray.jpg")
            Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(folder / "color.png")
    dm = DALIImageDataModule(data_dir=str(tmp_path), batch_size=4, image_size=32)
    dm.setup("fit")
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 32, 32)


def test_channels_last_and_half_output():
    dm = _dm(channels_last=True, output_dtype="bfloat16")
    dm.setup("fit")
    x, _ = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.bfloat16
    assert x.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    ("layout", "match"),
    [("missing", "does not exist"), ("empty", "no 'train/' folder"), ("no_classes", "has no class folders")],
)
def test_bad_folders(tmp_path, layout, match):
    root = tmp_path / "data"
    if layout != "missing":
        root.mkdir()
    if layout == "no_classes":
        (root / "train").mkdir()
        (root / "val").mkdir()
    with pytest.raises(ValueError, match=match):
        DALIImageDataModule(data_dir=str(root)).setup("fit")


def test_undecodable_image_is_named(tmp_path):
    src = make_synthetic_image_folder(tmp_path / "ok", num_classes=2, images_per_class=4)
    bad = src / "train" / "class_001" / "broken.jpg"
    bad.write_bytes(b"this is not a jpeg")
    with pytest.raises(ValueError, match=r"cannot be decoded: .*broken\.jpg"):
        DALIImageDataModule(data_dir=str(src)).setup("fit")


def test_missing_dali_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lit-compute\[dali\]'"):
        _dm().setup("fit")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_gpu_without_cuda_is_an_error():
    with pytest.raises(ValueError, match=r"DALIImageDataModule\(device='gpu'\) needs CUDA"):
        _dm(device="gpu").setup("fit")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_pipeline_outputs_on_the_device(tmp_path):
    dm = _dm(device="gpu")
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.is_cuda
    assert y.is_cuda
    assert x.shape == (8, 3, 32, 32)


DALI_THEN_FORKED_WORKERS = r"""
import gc
import lightning.pytorch as pl
from lit_compute import DALIImageDataModule, TorchvisionImageDataModule
from lit_compute.models import ImageClassifier

DATA = dict(batch_size=8, image_size=32, synthetic_num_classes=4, synthetic_images_per_class=8)

if __name__ == "__main__":
    for round_ in range(2):  # a notebook comparing loaders: DALI, then forked workers, then both again
        for dm in (DALIImageDataModule(device="cpu", **DATA), TorchvisionImageDataModule(num_workers=2, **DATA)):
            trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=3, limit_val_batches=2,
            logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
            trainer.fit(ImageClassifier("resnet18", num_classes=4), datamodule=dm)
            del trainer, dm
            gc.collect()
        print("ROUND", round_, flush=True)
"""


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_forked_workers_after_a_dali_pipeline_never_hang(tmp_path):
    from ..conftest import run_script

    result = run_script(tmp_path, DALI_THEN_FORKED_WORKERS, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    assert [line for line in result.stdout.splitlines() if line.startswith("ROUND")] == ["ROUND 0", "ROUND 1"]


def test_teardown_frees_the_pipelines_in_this_process(tmp_path):
    from lit_compute.data import dali_datamodule

    dm = DALIImageDataModule(device="cpu", **{k: v for k, v in TINY_DATA.items() if k != "num_workers"})
    before = {id(it) for it in dali_datamodule._LIVE}
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.fit(tiny_model(), datamodule=dm)
    assert all(loader._iterator is None for loader in dm._loaders.values())  # teardown released them
    assert {id(it) for it in dali_datamodule._LIVE} <= before  # and they are gone, not garbage waiting for a fork

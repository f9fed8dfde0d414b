import pytest
import torch

from lit_compute.data import TorchvisionImageDataModule
from lit_compute.data.torchvision_datamodule import default_num_workers

from ..conftest import tiny_data


def test_batches_shape_dtype_and_normalisation():
    dm = tiny_data()
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32)
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert set(y.tolist()) <= {0, 1, 2, 3}
    assert x.min() < -0.5
    assert x.max() > 0.5
    xv, _ = next(iter(dm.val_dataloader()))
    assert xv.shape == (8, 3, 32, 32)
    assert dm.num_classes == 4


def test_defaults():
    dm = TorchvisionImageDataModule()
    assert dm.num_workers == default_num_workers() >= 1
    assert dm.val_resize == 256


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ("missing", "the folder does not exist"),
        ("no_val", "no 'val/' folder"),
        ("no_classes", "has no class folders"),
        ("no_images", "no images"),
    ],
)
def test_bad_folders_fail_in_setup_naming_the_path(tmp_path, layout, match):
    root = tmp_path / "data"
    if layout != "missing":
        (root / "train" / "cat").mkdir(parents=True)
        (root / "train" / "cat" / "a.jpg").write_bytes(b"x")
    if layout == "no_classes":
        (root / "val").mkdir()
    if layout == "no_images":
        (root / "val" / "cat").mkdir(parents=True)
        (root / "train" / "cat" / "a.jpg").unlink()
    dm = TorchvisionImageDataModule(data_dir=str(root))
    with pytest.raises(ValueError, match=match) as err:
        dm.setup("fit")
    assert str(root) in str(err.value)


def test_bad_values_at_construction():
    with pytest.raises(ValueError, match=r"TorchvisionImageDataModule\(batch_size=0\)"):
        TorchvisionImageDataModule(batch_size=0)
    with pytest.raises(ValueError, match=r"val_resize=10"):
        TorchvisionImageDataModule(image_size=32, val_resize=10)

"""TorchvisionImageDataModule: the torchvision ImageFolder + DataLoader baseline."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from lit_compute._utils import available_cpu_cores
from lit_compute.data.folders import check_image_folder
from lit_compute.data.synthetic import make_synthetic_image_folder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def default_num_workers() -> int:
    """75% of the CPU cores available to this process, at least 1."""
    return max(1, int(available_cpu_cores() * 0.75))


class TorchvisionImageDataModule(LightningDataModule):
    """ImageNet-style folders through torchvision transforms and a PyTorch DataLoader.

    Train: ``RandomResizedCrop(image_size)``, horizontal flip, ``ToTensor``, ImageNet normalisation.
    Val: resize the shorter side to ``val_resize``, center crop ``image_size``, ``ToTensor``, normalisation.
    Batches are ``(images, labels)``: ``float32`` ``(B, 3, image_size, image_size)`` and ``int64`` ``(B,)``.
    Grayscale and RGBA images are converted to RGB.

    Args:
        data_dir: An ImageNet-style folder (``train/<class>/*``, ``val/<class>/*``). ``None`` uses the embedded
            synthetic dataset, written once under ``$LIT_COMPUTE_CACHE`` (default ``~/.cache/lit_compute``).
        batch_size: Samples per batch (per process under DDP).
        image_size: Side of the square crops the model sees.
        val_resize: Shorter side before the validation center crop (default ``round(image_size / 0.875)``).
        num_workers: DataLoader workers; ``None`` means 75% of the CPU cores available (at least 1).
        pin_memory: ``None`` means on when training on CUDA.
        persistent_workers: Keep workers alive between epochs (when ``num_workers > 0``).
        min_crop_scale: Lower bound of ``RandomResizedCrop``'s area scale.
        synthetic_num_classes: Classes of the synthetic dataset (``data_dir=None`` only).
        synthetic_images_per_class: Training images per class of the synthetic dataset.
        seed: Seed of the synthetic dataset.

    Raises:
        ValueError: at construction for bad values; in ``setup()`` for a missing folder, one without
            ``train/``/``val/``, without class folders, or without images (the message names the path).

    Example:
        >>> dm = TorchvisionImageDataModule(batch_size=8, image_size=32, synthetic_images_per_class=4)
    """

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 64,
        image_size: int = 224,
        val_resize: int | None = None,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        min_crop_scale: float = 0.08,
        synthetic_num_classes: int = 10,
        synthetic_images_per_class: int = 100,
        seed: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if batch_size < 1:
            raise ValueError(f"{name}(batch_size={batch_size}) must be >= 1")
        if image_size < 8:
            raise ValueError(f"{name}(image_size={image_size}) must be >= 8")
        if val_resize is not None and val_resize < image_size:
            raise ValueError(f"{name}(val_resize={val_resize}) must be >= image_size ({image_size}) or None")
        if num_workers is not None and num_workers < 0:
            raise ValueError(f"{name}(num_workers={num_workers}) must be >= 0, or None for 75% of the cores")
        if not 0.0 < min_crop_scale <= 1.0:
            raise ValueError(f"{name}(min_crop_scale={min_crop_scale}) must be in (0, 1]")
        self.save_hyperparameters()
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.image_size = image_size
        self.val_resize = val_resize if val_resize is not None else round(image_size / 0.875)
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.min_crop_scale = min_crop_scale
        self.synthetic_num_classes = synthetic_num_classes
        self.synthetic_images_per_class = synthetic_images_per_class
        self.seed = seed
        self.classes: list[str] = []
        self.train_set: datasets.ImageFolder | None = None
        self.val_set: datasets.ImageFolder | None = None

    # -- data location -------------------------------------------------------------------------------
    def resolved_data_dir(self) -> Path:
        """The folder in use: ``data_dir``, or the synthetic dataset (written if missing)."""
        if self.data_dir is not None:
            return Path(self.data_dir).expanduser()
        side = max(16, self.val_resize)
        return make_synthetic_image_folder(
            None, self.synthetic_num_classes, self.synthetic_images_per_class, (side, side), self.seed
        )

    @property
    def num_classes(self) -> int:
        return len(self.classes) if self.classes else self.synthetic_num_classes

    def prepare_data(self) -> None:
        if self.data_dir is None:
            self.resolved_data_dir()

    # -- transforms ------------------------------------------------------------------------------------
    def train_transform(self) -> transforms.Compose:
        return transforms.Compose(
            [
                transforms.RandomResizedCrop(self.image_size, scale=(self.min_crop_scale, 1.0), antialias=True),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def val_transform(self) -> transforms.Compose:
        return transforms.Compose(
            [
                transforms.Resize(self.val_resize, antialias=True),
                transforms.CenterCrop(self.image_size),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def setup(self, stage: str | None = None) -> None:
        root = self.resolved_data_dir()
        self.classes = check_image_folder(root, type(self).__name__)
        rgb = _to_rgb
        self.train_set = datasets.ImageFolder(root / "train", transform=self.train_transform(), loader=rgb)
        self.val_set = datasets.ImageFolder(root / "val", transform=self.val_transform(), loader=rgb)

    # -- loaders ---------------------------------------------------------------------------------------
    def _pin(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = self.trainer
        return bool(trainer is not None and trainer.strategy.root_device.type == "cuda")

    def _loader(self, dataset: datasets.ImageFolder | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a dataloader")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=self._pin(),
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)


def _to_rgb(path: str) -> Image.Image:  # noqa: F821
    from PIL import Image

    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")

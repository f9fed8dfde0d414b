"""TorchvisionImageDataModule: the torchvision ImageFolder + DataLoader baseline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from lit_compute._compat import available_cpu_cores
from lit_compute._validate import Check, validated
from lit_compute.data.folders import ImageFolderScan, scan_image_folder
from lit_compute.data.synthetic import make_synthetic_image_folder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def default_num_workers() -> int:
    """75% of the CPU cores available to this process, at least 1."""
    return max(1, int(available_cpu_cores() * 0.75))


class ImageFiles(Dataset):
    """``(image, label)`` samples from a checked file list (what ``torchvision.datasets.ImageFolder`` yields, with
    the labels fixed by the train split's classes). A file that fails to decode raises an error naming it."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], transform: Callable | None = None) -> None:
        self.samples = samples
        self.targets = [label for _, label in samples]
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes)}
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        image = load_rgb(path)
        return (self.transform(image) if self.transform is not None else image), label


def load_rgb(path: str) -> Any:
    """Open an image as RGB (grayscale and RGBA converted); an error names the file."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")
    except Exception as err:
        raise OSError(f"could not decode the image {path}: {type(err).__name__}: {err}") from err


class TorchvisionImageDataModule(LightningDataModule):
    """ImageNet-style folders through torchvision transforms and a PyTorch DataLoader.

    Train: ``RandomResizedCrop(image_size)``, horizontal flip, ``ToTensor``, ImageNet normalisation.
    Val: resize the shorter side to ``val_resize``, center crop ``image_size``, ``ToTensor``, normalisation.
    Batches are ``(images, labels)``: ``float32`` ``(B, 3, image_size, image_size)`` and ``int64`` ``(B,)``.
    Grayscale and RGBA images are converted to RGB.

    Checked at ``setup()``, before training (see :func:`~lit_compute.data.folders.scan_image_folder`): ``val/`` has
    exactly train's classes (labels are train's sorted class names, never shifted), every class folder has images,
    every image is one a decoder can read (a cached header pass, paid once per dataset). ``on_bad_image="error"``
    names the bad files; ``"skip"`` leaves them out and logs how many (``data/skipped_images``). A file that still
    fails to decode during training raises an error naming it.

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
        on_bad_image: ``"error"`` or ``"skip"`` (see above).

    Raises:
        ValueError: at construction for bad values; in ``setup()`` for a missing folder, one without
            ``train/``/``val/``, without class folders, a class folder without images, differing classes, or
            undecodable images (the message names the paths).

    Example:
        >>> dm = TorchvisionImageDataModule(batch_size=8, image_size=32, synthetic_images_per_class=4)
    """

    @validated
    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: Annotated[int, Check(ge=1)] = 64,
        image_size: Annotated[int, Check(ge=8)] = 224,
        val_resize: Annotated[int | None, Check(ge=8)] = None,
        num_workers: Annotated[int | None, Check(ge=0, hint="None: 75% of the cores")] = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        min_crop_scale: Annotated[float, Check(gt=0.0, le=1.0)] = 0.08,
        synthetic_num_classes: Annotated[int, Check(ge=2)] = 10,
        synthetic_images_per_class: Annotated[int, Check(ge=1)] = 100,
        seed: Annotated[int, Check(ge=0)] = 0,
        on_bad_image: Literal["error", "skip"] = "error",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if val_resize is not None and val_resize < image_size:
            raise ValueError(f"{name}(val_resize={val_resize}) must be >= image_size ({image_size}) or None")
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
        self.on_bad_image = on_bad_image
        self.classes: list[str] = []
        self.scan: ImageFolderScan | None = None
        self.train_set: ImageFiles | None = None
        self.val_set: ImageFiles | None = None

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

    def check_data(self) -> ImageFolderScan:
        """Scan the folder (see the class docstring); in ``"skip"`` mode say and log how many images are left out."""
        scan = scan_image_folder(self.resolved_data_dir(), type(self).__name__, on_bad_image=self.on_bad_image)
        self.scan, self.classes = scan, scan.classes
        if scan.bad_count:
            shown = ", ".join(p for split in scan.bad.values() for p, _ in split[:3])
            rank_zero_info(
                f"{type(self).__name__}(on_bad_image='skip'): left out {scan.bad_count} image(s) that cannot "
                f"be decoded ({shown}, ...)"
            )
            trainer = getattr(self, "trainer", None)
            for logger in trainer.loggers if trainer is not None else []:
                logger.log_metrics({"data/skipped_images": float(scan.bad_count)}, step=0)
        return scan

    def setup(self, stage: str | None = None) -> None:
        scan = self.check_data()
        self.train_set = ImageFiles(scan.samples["train"], scan.classes, self.train_transform())
        self.val_set = ImageFiles(scan.samples["val"], scan.classes, self.val_transform())

    # -- loaders ---------------------------------------------------------------------------------------
    def _pin(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = self.trainer
        return bool(trainer is not None and trainer.strategy.root_device.type == "cuda")

    def _loader(self, dataset: ImageFiles | None, shuffle: bool) -> DataLoader:
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

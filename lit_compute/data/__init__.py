"""Image and token datamodules, the embedded synthetic image dataset, and the checks run before training."""

from lit_compute.data.dali_datamodule import DALIImageDataModule, DALILoader
from lit_compute.data.folders import check_image_folder, scan_image_folder
from lit_compute.data.synthetic import make_synthetic_image_folder
from lit_compute.data.tokens import TokenDataModule
from lit_compute.data.torchvision_datamodule import TorchvisionImageDataModule

__all__ = [
    "DALIImageDataModule",
    "DALILoader",
    "TokenDataModule",
    "TorchvisionImageDataModule",
    "check_image_folder",
    "make_synthetic_image_folder",
    "scan_image_folder",
]

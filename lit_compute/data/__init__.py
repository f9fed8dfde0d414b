"""Image datamodules and the embedded synthetic dataset."""

from lit_compute.data.dali_datamodule import DALIImageDataModule, DALILoader
from lit_compute.data.folders import check_image_folder
from lit_compute.data.synthetic import make_synthetic_image_folder
from lit_compute.data.torchvision_datamodule import TorchvisionImageDataModule

__all__ = ["DALIImageDataModule", "DALILoader", "TorchvisionImageDataModule", "check_image_folder", "make_synthetic_image_folder"]

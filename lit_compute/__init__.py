"""lit_compute: Lightning callbacks, plugins and datamodules that make the compute cost of training visible."""

from lit_compute.data import TorchvisionImageDataModule, make_synthetic_image_folder
from lit_compute.models import ImageClassifier

__version__ = "0.1.0"

__all__ = [
    "ImageClassifier",
    "TorchvisionImageDataModule",
    "make_synthetic_image_folder",
]

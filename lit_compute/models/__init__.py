"""LightningModules the configs train: an image classifier over torchvision models and a small GPT."""

from lit_compute.models.gpt import GPT, GPTBlock
from lit_compute.models.image_classifier import ImageClassifier, classification_models

__all__ = ["GPT", "GPTBlock", "ImageClassifier", "classification_models"]

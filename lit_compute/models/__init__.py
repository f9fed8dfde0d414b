"""LightningModules the configs train."""

from lit_compute.models.image_classifier import ImageClassifier, classification_models

__all__ = ["ImageClassifier", "classification_models"]

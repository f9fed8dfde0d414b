"""Validation of ImageNet-style image folders (``train/<class>/*.jpg``, ``val/<class>/*.jpg``)."""

from __future__ import annotations

from pathlib import Path

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def check_image_folder(data_dir: str | Path, owner: str, splits: tuple[str, ...] = ("train", "val")) -> list[str]:
    """Check that ``data_dir`` is an ImageNet-style folder; return the sorted class names.

    Raises:
        ValueError: naming the path and what was expected, for a missing folder, a missing split, a split
            with no class folders, or a class folder with no images.
    """
    root = Path(data_dir).expanduser()
    layout = "expected <data_dir>/train/<class>/<image> and <data_dir>/val/<class>/<image>"
    if not root.is_dir():
        raise ValueError(f"{owner}(data_dir={str(root)!r}): the folder does not exist; {layout}")
    classes: list[str] | None = None
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise ValueError(f"{owner}(data_dir={str(root)!r}): no '{split}/' folder in it; {layout}")
        found = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not found:
            raise ValueError(f"{owner}(data_dir={str(root)!r}): '{split_dir}' has no class folders; {layout}")
        n_images = sum(
            1 for c in found for f in (split_dir / c).iterdir() if f.suffix.lower() in IMG_EXTENSIONS
        )
        if n_images == 0:
            raise ValueError(
                f"{owner}(data_dir={str(root)!r}): no images ({', '.join(IMG_EXTENSIONS)}) under '{split_dir}'"
            )
        if classes is None:
            classes = found
    return classes or []

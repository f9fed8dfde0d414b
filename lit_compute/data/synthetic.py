"""A deterministic, photo-like synthetic ImageFolder dataset (the embedded default data).

Each class is a shape type drawn in a class-specific hue over a smooth random background, with a
random distractor shape, blur and sensor noise, saved as JPEG. The images are smooth like photos
(not white noise), so decoding them costs what real JPEGs of the same size cost, and the classes are
learnable (a ResNet-18 reaches well above chance in two epochs).
"""

from __future__ import annotations

import colorsys
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from lit_compute._compat import default_cache_dir

_FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
_SHAPES = ("circle", "square", "triangle", "ring", "cross")


def synthetic_folder_path(num_classes: int, images_per_class: int, image_size: tuple[int, int], seed: int) -> Path:
    """Where the cached synthetic folder for these arguments lives."""
    h, w = image_size
    return default_cache_dir() / f"synthetic-c{num_classes}-n{images_per_class}-{h}x{w}-s{seed}-v{_FORMAT_VERSION}"


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, r: float, fill: tuple) -> None:
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "square":
        draw.rectangle([cx - r * 0.85, cy - r * 0.85, cx + r * 0.85, cy + r * 0.85], fill=fill)
    elif kind == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=fill)
    elif kind == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=max(2, int(r * 0.35)))
    else:  # cross
        t = r * 0.3
        draw.rectangle([cx - r, cy - t, cx + r, cy + t], fill=fill)
        draw.rectangle([cx - t, cy - r, cx + t, cy + r], fill=fill)


def _hue_rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
    return int(r * 255), int(g * 255), int(b * 255)


def render_image(label: int, num_classes: int, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """Render one photo-like RGB image of class ``label``."""
    h, w = size
    # Smooth background: a linear gradient between two colours plus low-frequency noise.
    c0, c1 = rng.uniform(40, 215, size=(2, 3))
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (np.cos(angle) * xx / max(w - 1, 1) + np.sin(angle) * yy / max(h - 1, 1) + 1.0) / 2.0
    bg = c0[None, None, :] * (1 - t[..., None]) + c1[None, None, :] * t[..., None]
    low = Image.fromarray(rng.uniform(0, 255, size=(4, 4, 3)).astype(np.uint8)).resize((w, h), Image.Resampling.BICUBIC)
    bg = 0.75 * bg + 0.25 * np.asarray(low, dtype=np.float32)
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    m = min(h, w)
    # A distractor: random shape and colour, smaller.
    _draw_shape(
        draw,
        _SHAPES[int(rng.integers(len(_SHAPES)))],
        rng.uniform(0.1, 0.9) * w,
        rng.uniform(0.1, 0.9) * h,
        rng.uniform(0.06, 0.12) * m,
        tuple(int(x) for x in rng.integers(0, 256, size=3)),
    )
    # The class: its shape in its hue.
    hue = label / num_classes + rng.uniform(-0.25, 0.25) / num_classes
    fill = _hue_rgb(hue, rng.uniform(0.65, 1.0), rng.uniform(0.7, 1.0))
    r = rng.uniform(0.22, 0.38) * m
    _draw_shape(draw, _SHAPES[label % len(_SHAPES)], rng.uniform(0.35, 0.65) * w, rng.uniform(0.35, 0.65) * h, r, fill)
    img = img.filter(ImageFilter.GaussianBlur(radius=0.6))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0, 4.0, size=(h, w, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def make_synthetic_image_folder(
    root: str | os.PathLike | None = None,
    num_classes: int = 10,
    images_per_class: int = 100,
    image_size: tuple[int, int] = (72, 72),
    seed: int = 0,
    val_images_per_class: int | None = None,
) -> Path:
    """Write deterministic ``train/`` and ``val/`` ImageFolder trees of photo-like JPEGs.

    Idempotent: a ``manifest.json`` records the arguments; a second call with the same arguments writes
    nothing. The tree is built in a temporary sibling folder and renamed into place, so concurrent
    callers (several ranks) never see a half-written folder.

    Args:
        root: Target folder. ``None`` uses a folder under ``$LIT_COMPUTE_CACHE`` (default
            ``~/.cache/lit_compute``) named after the arguments.
        num_classes: Number of classes (folders ``class_000`` ...).
        images_per_class: Training images per class.
        image_size: ``(height, width)`` of every image.
        seed: Seed; the same arguments always give byte-identical files.
        val_images_per_class: Validation images per class (default: a fifth of ``images_per_class``, at least 4).

    Returns:
        The folder's path.

    Raises:
        ValueError: Bad argument values, or ``root`` already holds a different dataset.

    Example:
        >>> import tempfile
        >>> path = make_synthetic_image_folder(tempfile.mkdtemp(), num_classes=2, images_per_class=2)
        >>> sorted(p.name for p in (path / "train").iterdir())
        ['class_000', 'class_001']
    """
    if num_classes < 2:
        raise ValueError(f"make_synthetic_image_folder(num_classes={num_classes}) must be >= 2")
    if images_per_class < 1:
        raise ValueError(f"make_synthetic_image_folder(images_per_class={images_per_class}) must be >= 1")
    h, w = (int(image_size[0]), int(image_size[1]))
    if h < 16 or w < 16:
        raise ValueError(f"make_synthetic_image_folder(image_size={tuple(image_size)}) must be at least 16x16")
    n_val = max(4, images_per_class // 5) if val_images_per_class is None else int(val_images_per_class)
    root = Path(root) if root is not None else synthetic_folder_path(num_classes, images_per_class, (h, w), seed)
    spec = {
        "version": _FORMAT_VERSION,
        "num_classes": num_classes,
        "images_per_class": images_per_class,
        "val_images_per_class": n_val,
        "image_size": [h, w],
        "seed": seed,
    }
    manifest = root / _MANIFEST
    if manifest.is_file():
        existing = json.loads(manifest.read_text())
        if {k: existing.get(k) for k in spec} == spec:
            return root
        raise ValueError(
            f"make_synthetic_image_folder(root={str(root)!r}) already holds a different synthetic dataset "
            f"({ {k: existing.get(k) for k in spec} }); pass another root or delete that folder"
        )
    if root.exists() and any(root.iterdir()):
        raise ValueError(
            f"make_synthetic_image_folder(root={str(root)!r}) exists and is not a synthetic dataset folder "
            "(no manifest.json); pass an empty or new folder"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    total = (images_per_class + n_val) * num_classes
    progress = _progress(total, f"lit_compute: writing the synthetic dataset ({total} images, {h}x{w}) to {root}")
    try:
        counts = {}
        for split_idx, (split, n) in enumerate((("train", images_per_class), ("val", n_val))):
            for label in range(num_classes):
                folder = tmp / split / f"class_{label:03d}"
                folder.mkdir(parents=True)
                for i in range(n):
                    rng = np.random.default_rng([seed, split_idx, label, i])
                    render_image(label, num_classes, (h, w), rng).save(folder / f"{i:05d}.jpg", quality=90)
                    progress.update(1)
            counts[split] = n * num_classes
        (tmp / _MANIFEST).write_text(json.dumps({**spec, "counts": counts}, indent=2))
        try:
            if root.exists():
                root.rmdir()  # empty, checked above (unless another process has filled it since)
            os.replace(tmp, root)
        except OSError:
            # lost a race to another process or rank that wrote the same folder first: theirs is the same data
            if not _holds(root, spec):
                raise
    finally:
        progress.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _holds(root: Path, spec: dict[str, Any]) -> bool:
    """Whether ``root`` holds a finished synthetic dataset of exactly ``spec``."""
    try:
        existing = json.loads((root / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return {k: existing.get(k) for k in spec} == spec


def _progress(total: int, description: str) -> Any:
    """A progress bar on stderr for the longer jobs (tqdm ships with Lightning); silent for small ones."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit="img", disable=total < 500, leave=False, mininterval=1.0)

import hashlib

import pytest
from PIL import Image

from lit_compute.data import make_synthetic_image_folder


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.jpg")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_layout_and_determinism(tmp_path):
    a = make_synthetic_image_folder(tmp_path / "a", num_classes=3, images_per_class=5, image_size=(40, 48), seed=1)
    b = make_synthetic_image_folder(tmp_path / "b", num_classes=3, images_per_class=5, image_size=(40, 48), seed=1)
    assert sorted(p.name for p in (a / "train").iterdir()) == ["class_000", "class_001", "class_002"]
    assert len(list((a / "train").rglob("*.jpg"))) == 15
    assert len(list((a / "val").rglob("*.jpg"))) == 12  # at least 4 per class
    assert _digest(a) == _digest(b)
    img = Image.open(next((a / "train" / "class_000").iterdir()))
    assert img.size == (48, 40)
    assert img.mode == "RGB"
    assert img.format == "JPEG"


def test_idempotent_second_call_writes_nothing(tmp_path):
    root = make_synthetic_image_folder(tmp_path / "d", num_classes=2, images_per_class=3)
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    again = make_synthetic_image_folder(tmp_path / "d", num_classes=2, images_per_class=3)
    assert again == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == mtimes


def test_images_are_smooth_not_noise(tmp_path):
    import numpy as np

    root = make_synthetic_image_folder(tmp_path / "s", num_classes=2, images_per_class=2, image_size=(64, 64))
    arr = np.asarray(Image.open(next((root / "train" / "class_000").iterdir())), dtype=np.float32)
    neighbour_diff = np.abs(np.diff(arr, axis=1)).mean()
    assert neighbour_diff < 12, neighbour_diff  # white noise would give ~85


def test_different_seed_different_data_and_mismatch_error(tmp_path):
    make_synthetic_image_folder(tmp_path / "x", num_classes=2, images_per_class=2, seed=0)
    with pytest.raises(ValueError, match="already holds a different synthetic dataset"):
        make_synthetic_image_folder(tmp_path / "x", num_classes=2, images_per_class=2, seed=1)
    with pytest.raises(ValueError, match="num_classes=1"):
        make_synthetic_image_folder(tmp_path / "y", num_classes=1)


def test_two_writers_of_one_cold_cache_both_succeed(tmp_path, monkeypatch):
    """Another process finishes the same folder while this one is still writing its copy (two `lit-compute fit`
    at once on a cold cache, or two ranks): this one's final rename finds the folder full and uses theirs."""
    import lit_compute.data.synthetic as synthetic

    real_render, raced = synthetic.render_image, []

    def render_while_another_process_finishes(*args, **kwargs):
        if not raced:
            raced.append(True)
            synthetic.make_synthetic_image_folder(
                tmp_path / "cache", num_classes=2, images_per_class=3, image_size=(16, 16)
            )
        return real_render(*args, **kwargs)

    monkeypatch.setattr(synthetic, "render_image", render_while_another_process_finishes)
    root = synthetic.make_synthetic_image_folder(
        tmp_path / "cache", num_classes=2, images_per_class=3, image_size=(16, 16)
    )
    assert raced
    assert (root / "manifest.json").is_file()
    assert sorted(p.name for p in (root / "train").iterdir()) == ["class_000", "class_001"]
    assert not list(tmp_path.glob(".cache.tmp-*"))  # this writer's own copy is cleaned up

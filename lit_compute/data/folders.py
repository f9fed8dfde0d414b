"""ImageNet-style image folders (``train/<class>/*.jpg``, ``val/<class>/*.jpg``), checked before training.

:func:`scan_image_folder` checks the layout (every split has the same classes, every class folder has
images) and that every image is one a decoder can read: its format is recognised from its first bytes, PIL
opens and verifies it, and a JPEG ends with its end-of-image marker (a truncated download does not). The
per-file results are cached under ``$LIT_COMPUTE_CACHE/image_checks/`` by path, size and modification time, so
the pass is paid once per dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LAYOUT = "expected <data_dir>/train/<class>/<image> and <data_dir>/val/<class>/<image>"
_CHECK_VERSION = 1


@dataclass
class ImageFolderScan:
    """What :func:`scan_image_folder` found.

    Attributes:
        root: The folder.
        classes: Class names in label order (the sorted class folders of ``train/``).
        samples: split -> ``[(path, label), ...]`` of the images that will be read (bad ones left out).
        bad: split -> ``[(path, reason), ...]`` of images no decoder can read.
        checked: Images verified in this scan (not found in the cache).
    """

    root: Path
    classes: list[str]
    samples: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    bad: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    checked: int = 0

    @property
    def bad_count(self) -> int:
        return sum(len(v) for v in self.bad.values())


def _image_problem(path: Path) -> str | None:
    """Why ``path`` cannot be decoded, or None. Cheap: first bytes, PIL's verify, a JPEG's end marker."""
    from PIL import Image, UnidentifiedImageError

    try:
        size = path.stat().st_size
        if size == 0:
            return "empty file"
        with Image.open(path) as img:
            fmt = img.format
            img.verify()
    except UnidentifiedImageError:
        return "not an image (its first bytes match no image format)"
    except Exception as err:  # noqa: BLE001 - any reader error is a bad file
        return f"unreadable ({type(err).__name__}: {err})"
    if fmt == "JPEG":
        with open(path, "rb") as f:
            f.seek(max(0, size - 64))
            tail = f.read().rstrip(b"\x00")
        if not tail.endswith(b"\xff\xd9"):
            return "truncated JPEG (no end-of-image marker)"
    return None


def _cache_path(root: Path) -> Path:
    from lit_compute.data.synthetic import default_cache_dir

    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]
    return default_cache_dir() / "image_checks" / f"{digest}.json"


def _load_cache(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text())
        return data["files"] if data.get("version") == _CHECK_VERSION else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _save_cache(path: Path, files: dict[str, list]) -> None:
    """Write the check cache whole (a temporary file renamed into place: two processes checking the same folder at
    once both succeed, the last rename wins, a reader never sees half a file)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": _CHECK_VERSION, "files": files}, f)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache only costs a re-check next time
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def scan_image_folder(
    data_dir: str | Path,
    owner: str,
    splits: tuple[str, ...] = ("train", "val"),
    on_bad_image: Literal["error", "skip"] = "error",
) -> ImageFolderScan:
    """Check an ImageNet-style folder before training; the classes and the images to read.

    Raises:
        ValueError: naming the path and what was expected: a missing folder or split, a split without class
            folders, a class folder without images, a split whose classes differ from ``train/``'s (the missing and
            extra classes named: a ``val/`` without one of train's classes would shift every later label), and,
            with ``on_bad_image="error"``, images that cannot be decoded (the first five named, and how many).
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise ValueError(f"{owner}(data_dir={str(root)!r}): the folder does not exist; {_LAYOUT}")
    per_split: dict[str, list[str]] = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise ValueError(f"{owner}(data_dir={str(root)!r}): no '{split}/' folder in it; {_LAYOUT}")
        found = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not found:
            raise ValueError(f"{owner}(data_dir={str(root)!r}): '{split_dir}' has no class folders; {_LAYOUT}")
        per_split[split] = found
    classes = per_split[splits[0]]
    for split in splits[1:]:
        missing = sorted(set(classes) - set(per_split[split]))
        extra = sorted(set(per_split[split]) - set(classes))
        if missing or extra:
            parts = ([f"missing {missing}"] if missing else []) + ([f"extra {extra}"] if extra else [])
            raise ValueError(
                f"{owner}(data_dir={str(root)!r}): '{split}/' must have exactly the classes of "
                f"'{splits[0]}/' ({len(classes)}); it has {' and '.join(parts)}. Labels are the sorted "
                f"class names of '{splits[0]}/', so every split needs the same class folders."
            )
    cache_file = _cache_path(root)
    cache = _load_cache(cache_file)
    scan = ImageFolderScan(root=root, classes=classes)
    for split in splits:
        scan.samples[split], scan.bad[split] = [], []
        for label, cls in enumerate(classes):
            folder = root / split / cls
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())
            if not files:
                raise ValueError(
                    f"{owner}(data_dir={str(root)!r}): the class folder '{folder}' has no images "
                    f"({', '.join(IMG_EXTENSIONS)}); remove it or add its images"
                )
            for path in files:
                st = path.stat()
                key = str(path)
                entry = cache.get(key)
                if entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
                    problem = entry[2]
                else:
                    problem = _image_problem(path)
                    cache[key] = [st.st_size, st.st_mtime_ns, problem]
                    scan.checked += 1
                if problem is None:
                    scan.samples[split].append((key, label))
                else:
                    scan.bad[split].append((key, problem))
    if scan.checked:
        _save_cache(cache_file, cache)
    bad = [item for split in splits for item in scan.bad[split]]
    if bad and on_bad_image == "error":
        shown = "; ".join(f"{p} ({why})" for p, why in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(
            f"{owner}(data_dir={str(root)!r}): {len(bad)} image(s) cannot be decoded: {shown}{more}. "
            f"Fix or remove them, or pass on_bad_image='skip' to leave them out."
        )
    for split in splits:
        for label, cls in enumerate(classes):
            if not any(lab == label for _, lab in scan.samples[split]):
                raise ValueError(
                    f"{owner}(data_dir={str(root)!r}): every image of the class folder "
                    f"'{root / split / cls}' cannot be decoded; a class needs images"
                )
    return scan


def check_image_folder(data_dir: str | Path, owner: str, splits: tuple[str, ...] = ("train", "val")) -> list[str]:
    """The sorted class names of a checked folder (see :func:`scan_image_folder`)."""
    return scan_image_folder(data_dir, owner, splits).classes


def first_undecodable(paths: list[str], limit: int = 5) -> list[str]:
    """Images among ``paths`` that PIL cannot fully decode (a full decode: for naming the file after a decoder
    failed mid-epoch, not for every run)."""
    from PIL import Image

    bad = []
    for path in paths:
        try:
            with Image.open(path) as img:
                img.load()
        except Exception as err:  # noqa: BLE001 - any decoder error marks the file unreadable, named
            bad.append(f"{path} ({type(err).__name__}: {err})")
            if len(bad) >= limit:
                break
    return bad

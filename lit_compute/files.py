"""Files written whole or not at all: the one way lit_compute writes a file a reader may open at any moment (a
cache, a trace, an op table, a measurement) - through a temporary name beside it, renamed into place only once it
holds something, and removed on any failure, so a full disk or a kill leaves no partial or 0-byte file behind."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["write_whole", "written_whole"]


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer to fill. When the block ends normally and the temporary
    file holds something, it replaces ``path`` (a rename: readers see the old file or the new one, never half);
    otherwise - an exception, or a writer that failed without raising and left nothing or an empty file - it is
    removed, along with any ``.tmp`` the writer left beside it, and ``OSError(ENOSPC)``-like failures propagate
    (a writer that wrote nothing raises ``OSError`` naming the file)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise OSError(errno.EIO, f"nothing was written to {target.name} (a full disk?)", str(target))
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".tmp")):
            with contextlib.suppress(OSError):
                leftover.unlink()


def write_whole(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (see :func:`written_whole`)."""
    with written_whole(path) as tmp:
        tmp.write_text(text)

"""A model of PyTorch's CUDA caching allocator: what ``max_memory_allocated`` and ``max_memory_reserved`` read for a
sequence of allocations and frees.

The rules are those of ``c10/cuda/CUDACachingAllocator.cpp`` with its default settings (no
``PYTORCH_CUDA_ALLOC_CONF``): a request is rounded up to a multiple of 512 bytes; requests up to 1 MiB come from
the small pool, whose segments are 2 MiB, larger ones from the large pool, whose segments are 20 MiB for requests
under 10 MiB and the request rounded up to 2 MiB otherwise; a request takes the smallest free block of its pool
that holds it (the lowest address among equals), split when the rest is at least 512 bytes (small pool) or more
than 1 MiB (large pool), else handed out whole (and counted whole as allocated); a freed block merges with free
neighbours of its segment; segments are never returned (no out-of-memory retry is modelled). One stream.

:func:`simulate` replays an event log (sizes in order, ``+`` allocate, ``-`` free) and returns the allocated and
reserved peaks.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Peaks", "round_size", "simulate"]

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # a small-pool segment
MIN_LARGE_ALLOC = 10 << 20  # requests below get a LARGE_BUFFER segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """The bytes the allocator hands out for a request of ``nbytes``."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def _segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass
class Peaks:
    """What the caching allocator would report: its allocated and reserved peaks in bytes."""

    allocated: int = 0
    reserved: int = 0


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool


class _Allocator:
    def __init__(self) -> None:
        self.segments: list[list[_Block]] = []  # blocks by offset
        self.small: list[bool] = []  # each segment's pool
        self.free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # pool -> sorted (size, seg, offset)
        self.allocated = self.reserved = 0
        self.peaks = Peaks()

    def _index(self, seg: int, offset: int) -> int:
        blocks = self.segments[seg]
        return bisect.bisect_left([b.offset for b in blocks], offset)

    def malloc(self, nbytes: int) -> tuple[int, int]:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.free[small]
        at = bisect.bisect_left(pool, (size, -1, -1))
        if at < len(pool):
            _, seg, offset = pool.pop(at)
        else:  # a new segment
            seg, offset = len(self.segments), 0
            whole = _segment_size(size)
            self.segments.append([_Block(seg, 0, whole, True)])
            self.small.append(small)
            self.reserved += whole
        blocks = self.segments[seg]
        i = self._index(seg, offset)
        block = blocks[i]
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            block.size = size
            blocks.insert(i + 1, _Block(seg, offset + size, rest, True))
            bisect.insort(pool, (rest, seg, offset + size))
        block.free = False
        self.allocated += block.size
        self.peaks.allocated = max(self.peaks.allocated, self.allocated)
        self.peaks.reserved = max(self.peaks.reserved, self.reserved)
        return seg, offset

    def release(self, seg: int, offset: int) -> None:
        blocks, small = self.segments[seg], self.small[seg]
        pool = self.free[small]
        i = self._index(seg, offset)
        block = blocks[i]
        block.free = True
        self.allocated -= block.size
        if i + 1 < len(blocks) and blocks[i + 1].free:  # merge with the next free block
            after = blocks.pop(i + 1)
            pool.remove((after.size, seg, after.offset))
            block.size += after.size
        if i > 0 and blocks[i - 1].free:  # and with the previous one
            before = blocks[i - 1]
            pool.remove((before.size, seg, before.offset))
            before.size += block.size
            blocks.pop(i)
            block = before
        bisect.insort(pool, (block.size, seg, block.offset))


def simulate(events: Iterable[tuple[int, int, int]]) -> Peaks:
    """Replay ``events``, each ``(kind, key, nbytes)`` with ``kind`` +1 (allocate ``nbytes`` as ``key``) or -1 (free
    ``key``), through the allocator model; its allocated and reserved peaks."""
    allocator = _Allocator()
    where: dict[int, tuple[int, int]] = {}
    for kind, key, nbytes in events:
        if kind > 0:
            where[key] = allocator.malloc(nbytes)
        elif key in where:
            allocator.release(*where.pop(key))
    return allocator.peaks

"""collective_clock on one gloo process: every wait of torch.distributed reported on the watching thread, nothing
after the last watcher goes, the originals back in place."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from lit_compute import collective_clock


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Clock:
    t = 0.0

    def __call__(self) -> float:
        self.t += 1.0  # each read one second later: a call's (start, end) differ by exactly one read
        return self.t


def test_waits_are_reported_and_the_originals_restored(gloo):
    originals = (dist.distributed_c10d.Work.wait, dist._broadcast_coalesced, funcol.wait_tensor)
    seen: list[tuple[float, float]] = []
    handle = collective_clock.watch(lambda s, e: seen.append((s, e)), Clock())
    try:
        dist.all_reduce(torch.ones(2))  # synchronous: waits inside
        dist.all_gather_into_tensor(torch.empty(2), torch.ones(2), async_op=True).wait()
        (funcol.all_reduce(torch.ones(2), "sum", group=dist.group.WORLD) + 1).sum()  # DTensor's path
        dist._broadcast_coalesced(dist.group.WORLD, [torch.ones(2)], 1 << 20, 0)  # DDP's buffer broadcast
        other = threading.Thread(target=lambda: dist.all_reduce(torch.ones(2)))  # not the watching thread
        other.start()
        other.join()
        assert len(seen) == 4
        assert all(e - s == 1.0 for s, e in seen)
        assert collective_clock.watching()
    finally:
        collective_clock.unwatch(handle)
    assert not collective_clock.watching()
    assert (dist.distributed_c10d.Work.wait, dist._broadcast_coalesced, funcol.wait_tensor) == originals
    dist.all_reduce(torch.ones(2))
    assert len(seen) == 4
    collective_clock.unwatch(handle)  # twice: nothing


def test_a_watcher_that_raises_never_breaks_the_collective(gloo):
    def broken(start: float, end: float) -> None:
        raise RuntimeError("boom")

    handle = collective_clock.watch(broken, Clock())
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        collective_clock.unwatch(handle)


def test_a_clock_that_raises_skips_its_watcher_never_the_collective(gloo):
    """A watcher's clock can be a CUDA event's record (the timeline's under NCCL): if it raises, that watcher misses
    the call, the collective and the other watchers do not."""

    def broken_clock() -> float:
        raise RuntimeError("CUDA error: an illegal memory access")

    never: list[tuple[float, float]] = []
    seen: list[tuple[float, float]] = []
    broken = collective_clock.watch(lambda s, e: never.append((s, e)), broken_clock)
    fine = collective_clock.watch(lambda s, e: seen.append((s, e)), Clock())
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
        assert never == []
        assert len(seen) == 1
    finally:
        collective_clock.unwatch(broken)
        collective_clock.unwatch(fine)

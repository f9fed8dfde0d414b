"""Every cache this package writes, written by two processes at once from cold: both succeed with the same result
(two `lit-compute fit` started together, or two ranks on one node)."""

from __future__ import annotations

import pytest

from ..conftest import run_script

RACE = r"""
import json
import multiprocessing as mp
import os
import sys


def work(barrier, out):
    os.environ["LIT_COMPUTE_CACHE"] = sys.argv[1]  # cold: nothing cached yet
    from lit_compute.data import TokenDataModule, make_synthetic_image_folder
    from lit_compute.data.folders import scan_image_folder

    barrier.wait()
    folder = make_synthetic_image_folder(num_classes=3, images_per_class=6, image_size=(40, 40))
    scan = scan_image_folder(folder, "Test")
    dm = TokenDataModule(seq_len=64, max_tokens=5_000)
    dm.setup()
    out.put({"images": sorted(map(list, scan.samples["train"])), "tokens": dm.token_count("train")})


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=work, args=(barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=200) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    print("CODES", [p.exitcode for p in procs])
    print("SAME", results[0] == results[1] and bool(results[0]["images"]) and results[0]["tokens"] > 0)
"""


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_two_processes_fill_the_same_cold_caches_at_once(tmp_path):
    result = run_script(tmp_path, RACE, str(tmp_path / "cache"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "CODES [0, 0]" in result.stdout, result.stdout[-3000:]
    assert "SAME True" in result.stdout, result.stdout[-3000:]
    leftovers = [p.name for p in (tmp_path / "cache").rglob("*") if p.name.startswith(".tmp") or p.suffix == ".tmp"]
    assert leftovers == []
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "tokens").iterdir()] == ["stdlib"]  # no temporary

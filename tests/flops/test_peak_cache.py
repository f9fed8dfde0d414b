"""FlopsLogger(peak="measure") uses one measured peak per machine, cached with its conditions (#29 item 7):
MFU of two runs on the same machine is against the same peak; peak="remeasure" measures again."""

from __future__ import annotations

import json

import torch

from lit_compute.flops import peaks
from lit_compute.flops.peaks import cached_peak_flops


def test_the_peak_is_measured_once_cached_with_its_conditions_and_remeasured_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    measured = iter([2.0e11, 3.0e11, 4.0e11])
    monkeypatch.setattr(peaks, "measure_peak_flops", lambda device, dtype: next(measured))
    first = cached_peak_flops("cpu", torch.float32)
    again = cached_peak_flops("cpu", torch.float32)
    assert (first.flops, first.cached) == (2.0e11, False)
    assert (again.flops, again.cached) == (2.0e11, True)  # a second run, a loaded machine: the same peak
    assert again.describe().startswith(f"cached from {first.measured_at} on ")
    assert f"{torch.get_num_threads()} threads" in again.describe() and f"torch {torch.__version__}" in again.describe()
    bf16 = cached_peak_flops("cpu", torch.bfloat16)  # another dtype is another entry
    assert (bf16.flops, bf16.cached) == (3.0e11, False)
    redone = cached_peak_flops("cpu", torch.float32, remeasure=True)
    assert (redone.flops, redone.cached) == (4.0e11, False)
    entries = json.loads((tmp_path / "peaks.json").read_text())
    assert sorted(e["flops"] for e in entries.values()) == [3.0e11, 4.0e11]
    assert all({"measured_at", "load_average", "threads", "torch_version", "device"} <= set(e) for e in entries.values())


def test_a_broken_cache_file_is_measured_over(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    (tmp_path / "peaks.json").write_text("{not json")
    monkeypatch.setattr(peaks, "measure_peak_flops", lambda device, dtype: 5.0e11)
    peak = cached_peak_flops("cpu", torch.float32)
    assert (peak.flops, peak.cached) == (5.0e11, False)
    assert cached_peak_flops("cpu", torch.float32).cached

"""CommBenchmark under 2-process DDP on CPU (gloo): one table row per message size."""
from __future__ import annotations

import lightning.pytorch as pl

from lit_compute import CommBenchmark, TunedDDPStrategy

from ..conftest import read_events, scalar_values, text_values
from .conftest import _fit


def test_benchmark_table_has_a_row_per_size_with_positive_bandwidth(tmp_path):
    strategy = TunedDDPStrategy(benchmark_collectives=True, benchmark_max_mb=1, start_method="spawn")
    _fit(tmp_path, "bench", strategy, logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0),
         callbacks=[CommBenchmark(max_mb=0.1, seconds=5)])
    acc = read_events(tmp_path / "tb" / "version_0")
    busbw = scalar_values(acc, "comm/allreduce_busbw_gbps")
    assert [s for s, _ in busbw][:5] == [4096, 16384, 65536, 262144, 1048576]
    assert all(v > 0 for _, v in busbw)
    table = text_values(acc, "comm/allreduce_table")[0]
    assert table.count("\n| ") >= 5 and "busbw (GB/s)" in table

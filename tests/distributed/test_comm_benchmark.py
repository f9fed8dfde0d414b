"""CommBenchmark under 2-process DDP on CPU (gloo): one table row per message size."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from lit_compute import CommBenchmark, TunedDDPStrategy

from ..conftest import read_events, scalar_values, text_values
from .conftest import _fit


@pytest.mark.slow
def test_benchmark_table_has_a_row_per_size_with_positive_bandwidth(tmp_path):
    strategy = TunedDDPStrategy(benchmark_collectives=True, benchmark_max_mb=1, start_method="forkserver")
    _fit(
        tmp_path,
        "bench",
        strategy,
        logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0),
        callbacks=[CommBenchmark(max_mb=0.1, seconds=5)],
    )
    acc = read_events(tmp_path / "tb" / "version_0")
    busbw = scalar_values(acc, "comm/allreduce_busbw_gbps")
    assert [s for s, _ in busbw][:5] == [4096, 16384, 65536, 262144, 1048576]
    assert all(v > 0 for _, v in busbw)
    table = text_values(acc, "comm/allreduce_table")[0]
    assert table.count("\n| ") >= 5
    assert "busbw (GB/s)" in table


def test_mesh_groups_are_the_rows_and_columns_of_a_2d_mesh():
    from types import SimpleNamespace

    import torch

    from lit_compute.distributed.comm_benchmark import mesh_groups

    mesh = SimpleNamespace(mesh_dim_names=("data_parallel", "tensor_parallel"), mesh=torch.arange(8).reshape(2, 4))
    trainer = SimpleNamespace(strategy=SimpleNamespace(_device_mesh=mesh))
    assert mesh_groups(trainer) == [
        ("data_parallel", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("tensor_parallel", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ]
    one_dim = SimpleNamespace(mesh_dim_names=("data_parallel",), mesh=torch.arange(2))
    assert mesh_groups(SimpleNamespace(strategy=SimpleNamespace(_device_mesh=one_dim))) == []


def test_collectives_are_checked_by_name():
    import pytest

    with pytest.raises(
        ValueError, match=r"CommBenchmark\(collectives=\[.all_to_all.\]\) must be a list of one of .all_reduce."
    ):
        CommBenchmark(collectives=["all_to_all"])

"""The trace summary of a CUDA trace (a stored Kineto-format trace, no GPU needed)."""

from __future__ import annotations

import pytest

from lit_compute.profiling.trace_summary import summarize_trace


def test_summary_of_a_cuda_trace_counts_each_step_once_and_measures_gpu_idle_and_overlap():
    """The shape of a Kineto trace on CUDA: each ProfilerStep#N on the CPU and again on the GPU timeline."""

    def x(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [
        x("user_annotation", "ProfilerStep#5", 0, 100),
        x("user_annotation", "ProfilerStep#6", 100, 100),
        # GPU copies: the kernels lag the CPU ranges, the last ends at 250
        x("gpu_user_annotation", "ProfilerStep#5", 20, 110),
        x("gpu_user_annotation", "ProfilerStep#6", 140, 110),
        x("kernel", "sm90_gemm", 20, 60),
        x("kernel", "ncclDevKernel_AllReduce", 60, 40),  # 20 us overlap
        x("kernel", "sm90_gemm", 140, 50),
        x("kernel", "elementwise", 230, 20),
        x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 100, 10),
    ]
    summary = summarize_trace({"traceEvents": events})
    assert summary.steps == [5, 6]
    assert summary.step_time_ms == pytest.approx(0.1)  # 100 us CPU steps, not the GPU copies
    assert summary.dataloader_fraction == pytest.approx(10 / 200)
    # window 0..250 us (GPU finished at 250): busy 20..100, 140..190, 230..250 = 150 us
    assert summary.gpu_idle_fraction == pytest.approx(1 - 150 / 250)
    assert summary.comm_overlap_fraction == pytest.approx(20 / 40)


def test_exposed_communication_is_a_union_of_intervals_not_a_sum():
    """Two gloo calls that overlap each other (0-10 and 5-15 us) are 15 us of collectives, not 20; compute on another
    thread from 8 to 12 us hides 4 of them: 11 of the 20 us window are exposed."""
    from lit_compute.profiling.trace_summary import summarize_trace

    trace = {
        "traceEvents": [
            {"ph": "X", "name": "ProfilerStep#3", "ts": 0, "dur": 20, "tid": 1},
            {"ph": "X", "name": "gloo:all_reduce", "ts": 0, "dur": 10, "tid": 7},
            {"ph": "X", "name": "gloo:all_gather", "ts": 5, "dur": 10, "tid": 8},
            {"ph": "X", "name": "aten::mm", "ts": 8, "dur": 4, "tid": 1},
            {"ph": "X", "name": "aten::mm", "ts": 9, "dur": 2, "tid": 1},  # nested in the first: counted once
        ]
    }
    summary = summarize_trace(trace)
    assert summary.comm_fraction == pytest.approx(15 / 20)
    assert summary.comm_overlap_fraction == pytest.approx(4 / 15)
    assert summary.comm_exposed_fraction == pytest.approx(11 / 20)
    assert summary.scalars()["comm/exposed_fraction"] == pytest.approx(0.55)


def test_the_collectives_own_time_is_each_ones_shortest_duration_over_the_ranks():
    from lit_compute.profiling.trace_summary import transfer_time_per_step

    def trace(durations_us):
        steps = [{"ph": "X", "name": f"ProfilerStep#{i}", "ts": 1000.0 * i, "dur": 1000.0} for i in (1, 2)]
        comm = [
            {"ph": "X", "name": "gloo:all_reduce", "ts": 1000.0 + 400.0 * k, "dur": d, "tid": 7}
            for k, d in enumerate(durations_us)
        ]
        outside = [{"ph": "X", "name": "gloo:all_reduce", "ts": 5000.0, "dur": 999.0, "tid": 7}]  # after the window
        return {"traceEvents": steps + comm + outside}

    # rank 0 waited 40 us in the first all-reduce, rank 1 38 us in the second: the transfers were 10 and 12 us
    rank0, rank1 = trace([10.0, 50.0, 5.0]), trace([50.0, 12.0, 5.0])
    assert transfer_time_per_step([rank0, rank1]) == pytest.approx((10 + 12 + 5) / 2 / 1e6)
    assert transfer_time_per_step([rank0, trace([50.0, 12.0])]) is None  # not the same collectives
    assert transfer_time_per_step([rank0]) is None

"""``lit-compute estimate``: the peak predicted on fake tensors against the peak torch's allocator reports over a
real step (its profiler memory events: :mod:`lit_compute.bench.memory_reference`, not the tracker the estimate
uses) at two or three micro-batch sizes for a ResNet-50, the GPT and a Hugging Face GPT-2; the largest micro-batch that
fits; bad input."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from lit_compute._lightning_cli import LitComputeCLI
from lit_compute.planning import estimate
from lit_compute.planning.estimate_cli import main

ROOT = Path(__file__).resolve().parents[2]
CASES = {  # config, arguments that keep it small, micro-batch sizes
    "resnet50": ("configs/baseline.yaml", ["--data.init_args.image_size=32", "--data.init_args.num_workers=0"], [2, 8]),
    "gpt": (
        "configs/gpt.yaml",
        ["--model.init_args.n_layer=2", "--data.init_args.max_tokens=200000", "--data.init_args.mode=packed"],
        [4, 8, 16],
    ),
    "hf_gpt2": (
        "examples/hf_gpt2.yaml",
        ["--data.init_args.mode=packed", "--data.init_args.max_tokens=200000"],
        [2, 4, 8],
    ),
}


def measured_peak(config: str, overrides: list[str], micro_batch: int, root: Path) -> int:
    """The allocator's peak over a steady-state real training step of ``config`` at ``micro_batch`` (step 2: the
    optimizer's state exists), from torch's profiler memory events: the reference ``bench memory`` uses."""
    import shutil

    out = root / "reference"
    shutil.rmtree(out, ignore_errors=True)
    args = [
        "fit",
        "--config",
        config,
        *overrides,
        f"--data.init_args.batch_size={micro_batch}",
        "--trainer.max_steps=3",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        f"--trainer.default_root_dir={root}",
        "--trainer.callbacks+=lit_compute.bench.memory_reference.ProfiledStep",
        f"--trainer.callbacks.out={out}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LitComputeCLI(args=args)
    return json.loads((out / "rank0.json").read_text())["allocator_peak"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=pytest.mark.heavy) if case in ("resnet50", "hf_gpt2") else case
        for case in sorted(CASES)
    ],
)
def test_the_predicted_peak_is_within_10_percent_of_the_measured_one(case, tmp_path, monkeypatch):
    config, overrides, sizes = CASES[case]
    monkeypatch.chdir(ROOT)  # the Hugging Face example's class path imports from the repository root
    monkeypatch.syspath_prepend(str(ROOT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(config, micro_batches=sizes, overrides=overrides)
    assert [r.micro_batch for r in plan.rows] == sizes
    assert all(r.method == "traced on fake tensors" for r in plan.rows)
    for row in plan.rows:
        real = measured_peak(config, overrides, row.micro_batch, tmp_path)
        assert row.peak_bytes == pytest.approx(real, rel=0.10), (case, row.micro_batch, row.peak_bytes, real)
        assert sum(v for k, v in row.parts.items() if k != "other") <= row.peak_bytes  # "other" is the rest
    peaks = [r.peak_bytes for r in plan.rows]
    assert peaks == sorted(peaks)
    assert peaks[0] < peaks[-1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_mixture_of_experts_is_traced_on_fake_tensors_and_within_5_percent(tmp_path, monkeypatch):
    """#69 item 1: a Hugging Face Mixtral (its experts in ``torch._grouped_mm``, float32 under CPU autocast) is traced
    on fake tensors, not measured on a real step, and its predicted peak is within 5% of the allocator's. The fix
    came after bench memory's second set had measured this model's real step (docs/memory.md says so)."""
    pytest.importorskip("transformers")
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no grouped matmul")
    config = "examples/memory/mixtral.yaml"
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(config, micro_batches=[2])
    (row,) = plan.rows
    assert row.method == "traced on fake tensors"
    assert row.peak_bytes == pytest.approx(measured_peak(config, [], 2, tmp_path), rel=0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_largest_micro_batch_that_fits_trains_under_the_cap_and_the_next_does_not(tmp_path, monkeypatch):
    config, overrides, _ = CASES["gpt"]
    monkeypatch.chdir(ROOT)
    cap = measured_peak(config, overrides, 6, tmp_path) + 1_000_000  # about 6 samples' worth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(config, micro_batches=[4, 8], memory=cap, overrides=overrides)
    assert [r.fits for r in plan.rows] == [True, False]
    largest, over = plan.largest_fitting, plan.next_size
    assert largest is not None
    assert largest >= 6
    assert over.micro_batch == largest + 1
    assert over.peak_bytes > cap
    assert measured_peak(config, overrides, largest, tmp_path) <= cap  # one real step under the cap
    assert plan.checkpointing
    assert plan.checkpointing[0].module.startswith("blocks.")
    assert all(c.saved_bytes > 0 and c.recompute_flops > 0 for c in plan.checkpointing)


def _small_config(tmp_path: Path, model: str) -> Path:
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 2},
        "model": {"class_path": model, "init_args": {"coef": 0.0} if "Sleepy" in model else {}},
        "data": {"class_path": "tests.tuning.tune_models.RandomRegressionData", "init_args": {"batch_size": 4}},
    }
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_model_fake_tensors_cannot_run_is_named_in_one_line_and_measured(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = _small_config(tmp_path, "tests.planning.models.MaskedMLP")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(path, micro_batches=[4, 8])
    (note,) = [n for n in plan.notes if "cannot be traced" in n]
    assert note.startswith("the model cannot be traced on fake tensors (selector: ")
    assert "\n" not in note
    assert all(r.method == "measured on a real step" and r.peak_bytes > 0 for r in plan.rows)


def test_the_command_answers_in_json_and_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    path = _small_config(tmp_path, "tests.tuning.tune_models.SleepyRegression")
    assert main(["--config", str(path), "--micro-batch", "4,8", "--memory", "1GB", "--json"]) == 0
    *rows, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["micro_batch"] for r in rows] == [4, 8]
    assert all(r["fits"] for r in rows)
    assert summary["largest_fitting_micro_batch"] > 8
    assert summary["capacity_bytes"] == 10**9
    assert set(rows[0]) == {
        "micro_batch",
        "peak_bytes",
        "parameters_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "other_bytes",
        "fits",
        "rank",
        "reserved_bytes",
    }
    assert rows[0]["reserved_bytes"] is None  # the caching allocator's reserved peak: CUDA only
    for args, phrase in (
        (["--device", "h900"], "--device 'h900' is not in the table; known: "),
        (["--memory", "lots"], "--memory 'lots' is not a size"),
        (["--micro-batch", "eight"], "--micro-batch 'eight': give whole numbers"),
    ):
        assert main(["--config", str(path), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert phrase in err, err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert os.getcwd() == str(ROOT)


# -- #47: estimate on bad or unusual input ---------------------------------------------------------------------------
def _quietly(config, **kwargs):
    """:func:`estimate` with Lightning's set-up warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate(config, **kwargs)


def test_half_weights_estimate_and_agree_with_a_real_step(tmp_path, monkeypatch):
    """#47 item 8: bf16-true and 16-true ended in "_apply(): Couldn't swap Linear.weight"."""
    monkeypatch.chdir(ROOT)
    path = _small_config(tmp_path, "tests.planning.models.WideAdamMLP")
    full = _quietly(path, micro_batches=[8])
    half = _quietly(path, micro_batches=[8], overrides=["--trainer.precision=bf16-true"])
    assert half.rows[0].method == "traced on fake tensors"
    assert half.rows[0].parts["parameters"] * 2 == full.rows[0].parts["parameters"]
    real = measured_peak(str(path), ["--trainer.precision=bf16-true"], 8, tmp_path)
    assert half.rows[0].peak_bytes == pytest.approx(real, rel=0.10)


def test_manual_optimization_stepping_its_own_scheduler_is_traced(tmp_path, monkeypatch):
    """#47 item 10: ``self.lr_schedulers()`` under manual optimization made the estimate say fit must train first."""
    monkeypatch.chdir(ROOT)
    path = _small_config(tmp_path, "tests.planning.models.ManualWithScheduler")
    plan = _quietly(path, micro_batches=[4])
    assert plan.rows[0].method == "traced on fake tensors"
    assert plan.rows[0].parts["gradients"] > 0


@pytest.mark.slow
def test_the_largest_micro_batch_is_found_when_the_optimizer_holds_the_peak(tmp_path, monkeypatch, capsys):
    """#47 item 12: with Adam's step holding the peak at micro-batch 1 and 2 the largest size that fits was silently
    missing (and always missing from --json); a model whose state alone does not fit was sent to checkpointing."""
    monkeypatch.chdir(ROOT)
    path = _small_config(tmp_path, "tests.planning.models.WideAdamMLP")
    assert main(["--config", str(path), "--micro-batch", "4", "--memory", "60MB", "--json"]) == 0
    row, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    largest = summary["largest_fitting_micro_batch"]
    assert largest
    assert summary["next_size"]["micro_batch"] == largest + 1
    assert summary["next_size"]["peak_bytes"] > 60e6 >= row["peak_bytes"]
    plan = _quietly(path, micro_batches=[4], memory="10MB")
    state = sum(plan.rows[0].parts[p] for p in ("parameters", "gradients", "optimizer"))
    assert state > 10e6
    assert plan.largest_fitting is None
    assert plan.checkpointing == []
    assert any(
        n.startswith("does not fit even at micro-batch 1: the parameters, gradients and optimizer state alone need")
        for n in plan.notes
    )


def test_a_real_step_is_never_larger_than_this_machine_can_hold(tmp_path, monkeypatch):
    """#47 item 9: a model fake tensors cannot run, with --memory 80GB, was measured on a real step at micro-batch
    19,999,010,530. The free memory is driven: 40 MB here."""
    import importlib

    import psutil

    estimate_module = importlib.import_module("lit_compute.planning.estimate")
    trace = importlib.import_module("lit_compute.planning.estimate.trace")

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 40_000_000, "total": 10**9})())
    measured = []
    real = trace.measure
    monkeypatch.setattr(trace, "measure", lambda c, o, size, b: measured.append(size) or real(c, o, size, b))
    path = _small_config(tmp_path, "tests.planning.models.MaskedMLP")
    plan = _quietly(path, micro_batches=[4], memory="80GB")
    peaks = {r.micro_batch: r.peak_bytes for r in plan.rows}
    assert plan.largest_fitting
    assert plan.next_size is None
    assert max(measured) == plan.largest_fitting
    assert any(
        "is the last size that ran here; larger ones are not measured: micro-batch" in n
        and "more than half of this machine's free memory" in n
        for n in plan.notes
    )
    assert max(measured) * peaks[4] / 4 < 40_000_000  # never a step near the machine's memory
    with pytest.raises(
        estimate_module.EstimateError, match="micro-batch 100000000 is not measured: a real step of it would need about"
    ):
        estimate(path, micro_batches=[100_000_000])


def test_a_real_step_that_runs_out_of_memory_ends_the_search_at_the_last_size_that_ran(tmp_path, monkeypatch):
    """#69 item 2: with an address-space cap and --memory 80GB, the search probed a real step far past what ran here,
    the allocation failed, and the command said the config must train first. The allocation failure (driven here,
    past micro-batch 16) now ends the search at the last size that ran, and the note says so."""
    import importlib

    trace = importlib.import_module("lit_compute.planning.estimate.trace")
    monkeypatch.chdir(ROOT)
    real = trace.measure

    def measure(config, overrides, size, buckets):
        if size > 16:
            raise RuntimeError(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9999999999 bytes. Error code 12"
            )
        return real(config, overrides, size, buckets)

    monkeypatch.setattr(trace, "measure", measure)
    path = _small_config(tmp_path, "tests.planning.models.MaskedMLP")
    plan = _quietly(path, micro_batches=[4], memory="80GB")
    assert plan.largest_fitting == 16
    assert plan.next_size is None
    (note,) = [n for n in plan.notes if "is the last size that ran here" in n]
    assert "larger ones are not measured: micro-batch 32: a real step of it ran out of memory here" in note
    assert "can't allocate memory" in note


def test_the_memory_a_real_step_may_take_is_the_least_of_free_memory_the_address_space_and_the_cgroup(
    tmp_path, monkeypatch
):
    """#69 item 2: ``ulimit -v`` and a container's memory limit count as well as the machine's free memory."""
    import resource

    import psutil

    from lit_compute.planning.estimate import search

    used, cgroup_left = psutil.Process().memory_info().vms, search._cgroup_left
    monkeypatch.setattr(search, "_cgroup_left", lambda: None)
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (used + 10_000_000, resource.RLIM_INFINITY))
    left, why = search.headroom()
    assert why == "the address space left under RLIMIT_AS (ulimit -v)"
    assert 0 < left <= 10_000_000 + 1_000_000  # the process may have grown since ``used`` was read
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert search.headroom()[1] == "this machine's free memory"
    # a cgroup v2 limit: memory.max less memory.current, read where /proc/self/cgroup says this process lives
    (tmp_path / "proc").write_text("0::/job.slice/train\n")
    folder = tmp_path / "cg" / "job.slice" / "train"
    folder.mkdir(parents=True)
    (folder / "memory.max").write_text("3000000\n")
    (folder / "memory.current").write_text("1000000\n")
    assert cgroup_left(str(tmp_path / "cg"), str(tmp_path / "proc")) == 2_000_000
    (folder / "memory.max").write_text("max\n")
    assert cgroup_left(str(tmp_path / "cg"), str(tmp_path / "proc")) is None
    assert search.out_of_memory(MemoryError())
    assert search.out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not search.out_of_memory(RuntimeError("shape mismatch"))


def test_bad_input_to_estimate_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """#47 items 11 and 13: a missing data folder, a misspelt option, a packaged config's name."""
    monkeypatch.chdir(ROOT)
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 2},
        "model": {"class_path": "tests.planning.models.WideAdamMLP"},
        "data": {
            "class_path": "lit_compute.TorchvisionImageDataModule",
            "init_args": {"data_dir": str(tmp_path / "no_such_folder")},
        },
    }
    path = tmp_path / "missing_data.yaml"
    path.write_text(yaml.safe_dump(config))
    small = _small_config(tmp_path, "tests.planning.models.WideAdamMLP")
    for args, phrase in (
        (["--config", str(path)], "the config's training data cannot be read: TorchvisionImageDataModule(data_dir="),
        (["--config", str(small), "--devcie", "a100"], "unrecognized argument --devcie (did you mean --device?)"),
        (["--config", "no_such_config"], "no such file, and no packaged config of that name"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert phrase in err, err


BUILD_MODELS = '''
import lightning.pytorch as pl
import torch


class DropPathSchedule(pl.LightningModule):
    """A timm-style constructor: its drop-path rates computed with a tensor and read back."""

    def __init__(self, depth: int = 4):
        super().__init__()
        self.rates = torch.linspace(0, 0.1, depth).tolist()
        self.blocks = torch.nn.Sequential(*[torch.nn.Linear(3 * 32 * 32, 3 * 32 * 32) for _ in range(depth)])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.blocks(x.flatten(1)).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Broken(DropPathSchedule):
    def __init__(self):
        raise RuntimeError("the weights file is missing")
'''


def _image_config(tmp_path: Path, model: dict) -> Path:
    config = {
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 2},
        "model": model,
        "data": {
            "class_path": "lit_compute.data.TorchvisionImageDataModule",
            "init_args": {
                "batch_size": 4,
                "image_size": 32,
                "num_workers": 0,
                "synthetic_num_classes": 4,
                "synthetic_images_per_class": 8,
            },
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_a_model_whose_constructor_reads_tensor_values_is_built_on_the_cpu_and_estimated(tmp_path, monkeypatch, capsys):
    """#49 item 1: torchvision's RegNet computes its block widths with tensors and reads them back (``.tolist()``):
    on the meta device that ended in a 40-line traceback. Built on the CPU instead (said in a note), its prediction
    is checked against a real step like the others; a drop-path schedule the same; a constructor that fails anyway
    is one line naming the class."""
    (tmp_path / "build_models.py").write_text(BUILD_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    regnet = _image_config(
        tmp_path,
        {"class_path": "lit_compute.models.ImageClassifier", "init_args": {"arch": "regnet_y_400mf", "num_classes": 4}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(regnet, micro_batches=[2])
    assert any(
        n.startswith("ImageClassifier was built on the CPU") and "Cannot copy out of meta tensor" in n
        for n in plan.notes
    ), plan.notes
    for row in plan.rows:
        assert row.peak_bytes == pytest.approx(measured_peak(str(regnet), [], row.micro_batch, tmp_path), rel=0.10)
    schedule = _image_config(tmp_path, {"class_path": "build_models.DropPathSchedule"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(schedule, micro_batches=[2])
    assert any(n.startswith("DropPathSchedule was built on the CPU") for n in plan.notes), plan.notes
    broken = _image_config(tmp_path, {"class_path": "build_models.Broken"})
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:  # the CLI's one line for a constructor that fails, exit 2
        estimate(broken, micro_batches=[2])
    assert info.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    # the same failure on the meta device and on the CPU: said once
    assert line == "lit-compute: error: Broken(...) cannot be built: RuntimeError: the weights file is missing"
    # built on the CPU within a budget: past the memory share or the time, one line saying which, never a traceback
    import sys

    pieces = sys.modules["lit_compute.planning.estimate.pieces"]  # where the model is built
    schedule = _image_config(tmp_path, {"class_path": "build_models.DropPathSchedule"})  # the file Broken took

    for name, value, phrase in (
        ("BUILD_MEMORY_SHARE", 1e-6, "more than 0% of this machine's free memory"),
        ("_clock", iter(range(0, 10**6, 100)).__next__, "it ran for more than 300 s"),
    ):
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pieces, name, value)
            with pytest.raises(SystemExit) as info:
                estimate(schedule, micro_batches=[2])
        assert info.value.code == 2
        (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert line.startswith("lit-compute: error: DropPathSchedule(...) cannot be built on the meta device"), line
        assert phrase in line, line
        assert line.endswith(
            "stopped. Give the model a constructor that does not read tensor "
            "values, or estimate on a machine with more memory"
        ), line


def test_a_measurement_first_asked_for_inside_the_traced_step_runs_on_real_tensors(tmp_path, monkeypatch):
    """FP32BatchNormPrecision(slow_bf16='float32') asks this machine whether bf16 is fast at its first use, which in an
    estimate is inside the step traced on fake tensors. On a machine without the cached answer, the measurement had
    timed fake tensors (and cached what it found) and the estimate had counted its 512 MiB of matrices as the model's
    (538 MB predicted against 28 MB for the GPT at micro-batch 4). Here each measurement allocates 64 MiB: it sees
    no fake tensor, no tracer, no saved-tensors hook, no autocast, and the estimate is the one made with the answer
    cached; ``whatif --config``'s FLOP count likewise."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from lit_compute.hardware import measure
    from lit_compute.precision import fp32_batchnorm_precision

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fp32_batchnorm_precision, "slow_bf16_cpu", lambda: None)  # measured on any CPU
    seen: list[tuple] = []

    def measuring(result):
        def measure_it(*args, **kwargs):
            big = torch.ones(16 * 2**20, requires_grad=True)  # 64 MiB: the estimate would count it as the model's
            (big * big).sum().backward()  # saved for backward: the tracer's saved-tensors hook would see it
            torch.mm(big[:65536].view(256, 256), big[:65536].view(256, 256))  # FLOPs a counter would count
            seen.append(
                (
                    type(big).__name__,
                    _get_current_dispatch_mode(),
                    torch.is_autocast_enabled("cpu"),
                    torch.is_grad_enabled(),
                    torch._C._autograd._top_saved_tensors_default_hooks(False),
                )
            )
            return result

        return measure_it

    monkeypatch.setattr(measure, "measure_peak", measuring(measure.PeakMeasurement(1e11, True, cpu_share=0.9)))
    monkeypatch.setattr(measure, "measure_bandwidth", measuring(1e10))
    monkeypatch.setattr(
        measure,
        "measure_mixed_speedup",
        measuring(measure.MixedSpeedup({"matmul": 2.0, "conv": 2.0, "attention": 2.0}, True)),
    )
    config = {
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 2,
            "plugins": [
                {
                    "class_path": "lit_compute.FP32BatchNormPrecision",
                    "init_args": {"precision": "bf16-mixed", "slow_bf16": "float32"},
                }
            ],
        },
        "model": {"class_path": "tests.tuning.tune_models.SleepyRegression", "init_args": {"coef": 0.0}},
        "data": {"class_path": "tests.tuning.tune_models.RandomRegressionData", "init_args": {"batch_size": 4}},
    }
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = estimate(path, micro_batches=[4])
        assert len(seen) == 3, seen
        assert all(s == ("Tensor", None, False, True, None) for s in seen), seen
        cached = estimate(path, micro_batches=[4])
    assert len(seen) == 3  # the second estimate read the cache: nothing measured
    assert fresh.rows[0].peak_bytes == cached.rows[0].peak_bytes < 2**26
    # whatif --config counts the step under a FLOP counter on fake tensors: the measurement's matmul is not the model's
    from lit_compute.planning.config_facts import config_facts

    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path / "another_cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted_fresh = config_facts(path, time_the_loader=False)
        assert len(seen) == 6
        counted_cached = config_facts(path, time_the_loader=False)
    assert len(seen) == 6
    assert counted_fresh.by_class == counted_cached.by_class
    assert counted_fresh.model_flops == counted_cached.model_flops < 2 * 256**3


def test_a_step_under_torch_compile_is_recognised_and_its_convolutions_laid_out_as_inductor_does(monkeypatch):
    """#69: a config that compiles (a CompileModules callback, a compiled module, a ``compile: true`` hyperparameter)
    is traced with inductor's channels-last weight copies where inductor's ``decide_layout_opt`` would make them for a
    training graph: on a CPU for any convolution; on CUDA not for a grouped convolution, a narrowing one, or only
    small ones; never with ``layout_optimization`` off or under another backend."""
    from types import SimpleNamespace

    from torch import nn

    from lit_compute.planning.estimate.compiled import (
        ChannelsLastConvolutions,
        compiled_layout,
        inductor_channels_last,
        runs_compiled,
    )
    from lit_compute.speedup import CompileModules

    class Net(nn.Module):
        hparams: dict = {}

        def __init__(self, *convs: nn.Module) -> None:
            super().__init__()
            self.convs = nn.ModuleList(convs)

    def pieces(model, callbacks=(), device="cpu"):
        strategy = SimpleNamespace(root_device=torch.device(device))
        return SimpleNamespace(model=model, trainer=SimpleNamespace(callbacks=list(callbacks), strategy=strategy))

    plain = nn.Conv2d(128, 128, 3)
    assert not runs_compiled(pieces(Net(plain)))
    assert not isinstance(compiled_layout(pieces(Net(plain))), ChannelsLastConvolutions)
    assert isinstance(compiled_layout(pieces(Net(plain), [CompileModules()])), ChannelsLastConvolutions)
    assert not isinstance(
        compiled_layout(pieces(Net(plain), [CompileModules(backend="eager")])), ChannelsLastConvolutions
    )
    flagged = Net(plain)
    flagged.hparams = {"compile": True}
    assert isinstance(compiled_layout(pieces(flagged)), ChannelsLastConvolutions)
    assert not inductor_channels_last(Net(nn.Linear(4, 4)), torch.device("cpu"))

    cuda = torch.device("cuda")
    assert inductor_channels_last(Net(nn.Conv2d(3, 64, 7), plain), cuda)
    assert not inductor_channels_last(Net(plain, nn.Conv2d(128, 128, 3, groups=2)), cuda)  # grouped, 64 in a group
    assert inductor_channels_last(Net(plain, nn.Conv2d(128, 128, 3, groups=128)), cuda)  # depthwise is not
    assert not inductor_channels_last(Net(plain, nn.Conv2d(256, 128, 3)), cuda)  # out channels <= half of in
    assert not inductor_channels_last(Net(nn.Conv2d(3, 32, 3), nn.Conv2d(32, 64, 3)), cuda)  # all small

    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "layout_optimization", False)
    assert not inductor_channels_last(Net(plain), torch.device("cpu"))


def test_a_compiled_steps_weight_copies_are_held_from_forward_to_backward():
    """The copies the traced step makes are what a laid-out graph keeps for its backward: after a conv net's forward
    the tracker holds its two convolution weights' bytes more (kept by autograd until each backward), and a net
    already in channels-last copies nothing."""
    from torch import nn

    from lit_compute.memory import StorageTracker
    from lit_compute.planning.estimate.compiled import ChannelsLastConvolutions

    def held_after_forward(channels_last: bool, laid_out: bool) -> int:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1))
        x = torch.randn(1, 256, 4, 4)
        if channels_last:
            net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        tracker = StorageTracker()
        tracker.register(list(net.parameters()), "parameters")
        with tracker, ChannelsLastConvolutions() if laid_out else contextlib.nullcontext():
            out = net(x)
        assert out.requires_grad
        return tracker.breakdown().peak

    weights = 2 * 256 * 256 * 9 * 4
    assert held_after_forward(False, True) - held_after_forward(False, False) == weights
    assert held_after_forward(True, True) == held_after_forward(True, False)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_a_compiled_resnets_peak_is_within_5_percent_and_not_under_the_real_one(tmp_path, monkeypatch):
    """#69: a ResNet-18 under ``torch.compile`` (inductor, CPU) held its convolution weights' channels-last copies
    beyond the eager trace (9.2% under the allocator in bench memory's second set, which found it: seen data). The
    estimate now traces those copies: within 5% of a real compiled step's allocator peak, and not more than 2% under
    it."""
    config, overrides = "examples/memory/compiled.yaml", ["--data.init_args.image_size=32"]
    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = estimate(config, micro_batches=[2], overrides=overrides)
    (row,) = plan.rows
    assert row.method == "traced on fake tensors"
    real = measured_peak(config, overrides, 2, tmp_path)
    assert row.peak_bytes == pytest.approx(real, rel=0.05), (row.peak_bytes, real)
    assert row.peak_bytes >= 0.98 * real, (row.peak_bytes, real)
    assert any("channels-last copy of each convolution's weight" in n for n in plan.notes), plan.notes

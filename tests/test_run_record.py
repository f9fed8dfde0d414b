"""One typed record per run (#46): written as ``run.json`` beside the events, read by whatif and report; runs of
0.3.0 (a Markdown table only) still read; a GPU run is priced against its own chip."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lit_compute.hardware.dtypes import Float32Math
from lit_compute.planning.whatif import RunFacts, read_run
from lit_compute.planning.whatif_cli import main
from lit_compute.report.runs import load_run
from lit_compute.run_record import RECORD_FILE, RunRecord, read_record, write_record

from .conftest import make_trainer, read_events, text_values, tiny_data, tiny_model

FIXTURE = Path(__file__).parent / "planning" / "fixtures" / "run_0_3_0"
PACKAGE = Path(__file__).resolve().parents[1] / "lit_compute"


def test_a_run_writes_its_record_beside_the_events(tmp_path):
    from lit_compute import FlopsLogger, StepTimeMonitor

    trainer = make_trainer(
        tmp_path,
        max_steps=3,
        limit_train_batches=3,
        log_every_n_steps=1,
        callbacks=[FlopsLogger(peak="none"), StepTimeMonitor(log_every_n_steps=1)],
    )
    trainer.fit(tiny_model(), datamodule=tiny_data(batch_size=8))
    record = read_record(trainer.logger.log_dir)
    assert record is not None
    assert record.format == 1
    assert (record.precision, record.device, record.chip, record.world_size) == ("32-true", "cpu", None, 1)
    assert record.planned_steps == 3
    assert record.loader_workers == 0
    assert record.torch_threads >= 1
    assert record.op_classes["samples"] == 8
    assert "optimizer" in record.op_classes["by_class"]
    # the table TensorBoard shows is the record rendered
    (table,) = text_values(read_events(trainer.logger.log_dir), "lit_compute/run")
    assert table == record.table()
    assert "| planned | 3 steps |" in table


def test_the_record_keeps_torchs_float32_switches_and_whether_the_module_ran_compiled(tmp_path):
    """#68 item 2: what a float32 run's convolutions and matmuls would run on with TF32 tensor cores is the run's own
    torch switches, as they were when it ran (here set by Float32MatmulPrecision("high") at setup); the run-info table
    says them; ``compiled`` is whether the LightningModule ran torch.compile'd."""
    import torch

    from lit_compute import FlopsLogger, StepTimeMonitor, _compat
    from lit_compute.speedup import Float32MatmulPrecision

    before = torch.get_float32_matmul_precision()
    measuring = [FlopsLogger(peak="none"), StepTimeMonitor(log_every_n_steps=1)]
    trainer = make_trainer(
        tmp_path, max_steps=2, log_every_n_steps=1, callbacks=[Float32MatmulPrecision("high"), *measuring]
    )
    trainer.fit(tiny_model(), datamodule=tiny_data(batch_size=8))
    assert torch.get_float32_matmul_precision() == before  # the callback put it back
    record = read_record(trainer.logger.log_dir)
    assert (record.float32_matmul_precision, record.matmul_tf32, record.cudnn_allow_tf32) == ("high", True, True)
    assert record.compiled is False
    assert "| float32 switches | cudnn.allow_tf32 True, matmul precision 'high' (TF32 matmuls: True) |" in (
        record.table()
    )
    assert read_run(trainer.logger.log_dir).float32_math == Float32Math(conv_tf32=True, matmul_tf32=True)
    # a record written before the switches were kept: None, priced at torch's defaults (and said so by whatif)
    assert RunRecord.from_json({"precision": "32-true"}).cudnn_allow_tf32 is None
    net = torch.nn.Linear(2, 2)
    assert not _compat.trains_compiled(net)
    net.compile()  # in place: compiled at its first call, never here
    assert _compat.trains_compiled(net)
    other = torch.nn.Linear(2, 2)
    other._compiler_ctx = {"compiler": "dynamo"}  # what Lightning keeps on a module it was given compiled
    assert _compat.trains_compiled(other)


def test_the_record_round_trips_and_keeps_what_a_newer_version_added(tmp_path):
    record = RunRecord(precision="bf16-mixed", device="NVIDIA H200", chip="h200-sxm", planned_steps=10)
    write_record(tmp_path, record)
    data = json.loads((tmp_path / RECORD_FILE).read_text())
    data["new_field"] = [1, 2]
    (tmp_path / RECORD_FILE).write_text(json.dumps(data))
    back = read_record(tmp_path)
    assert back.extras == {"new_field": [1, 2]}
    assert back.chip == "h200-sxm"
    assert back.as_json()["new_field"] == [1, 2]
    (tmp_path / RECORD_FILE).write_text("[1, 2]")
    assert read_record(tmp_path) is None


def test_the_micro_batchs_op_classes_are_kept_not_the_last_partial_batch():
    record = RunRecord()
    assert record.with_op_classes({"samples": 6, "by_class": {"matmul": [1, 2, 3]}})
    assert not record.with_op_classes({"samples": 2, "by_class": {"matmul": [1, 1, 1]}})  # the epoch's last batch
    assert record.op_classes["samples"] == 6
    assert not record.with_op_classes({"samples": 8, "by_class": {}})  # nothing counted


def test_a_run_written_by_0_3_0_still_reads():
    """A committed run folder trained with lit_compute 0.3.0 (FlopsLogger, StepTimeMonitor, MemoryMonitor on a
    small MLP, batch 8, 8 steps): no run.json, the facts in its run-info table and op-class text."""
    assert not (FIXTURE / RECORD_FILE).exists()
    record = load_run(FIXTURE).record
    assert record.format == 0
    assert record.precision == "32-true"
    assert record.device == "cpu"
    assert (record.nodes, record.devices_per_node, record.data_parallel, record.tensor_parallel) == (1, 1, 1, 1)
    assert record.planned_steps == 8
    assert record.loader_workers == 0
    assert record.op_classes["samples"] == 8
    facts = read_run(FIXTURE)
    assert facts.samples == 8
    assert facts.step_s
    assert set(facts.by_class) >= {"matmul", "optimizer"}


def _gpu_run(tmp_path: Path, device: str, chip: str | None) -> Path:
    """The 0.3.0 fixture's run as if recorded on a GPU (its record written with the device's name and chip)."""
    folder = tmp_path / "version_0"
    shutil.copytree(FIXTURE, folder)
    record = load_run(folder).record
    record.device, record.chip, record.format = device, chip, 1
    write_record(folder, record)
    return folder


def test_a_gpu_run_is_priced_against_its_own_chip_by_default(tmp_path, capsys):
    folder = _gpu_run(tmp_path, "NVIDIA H100 80GB HBM3", "h100-sxm")
    facts = read_run(folder)
    from lit_compute.hardware.chips import CHIPS

    assert facts.runs_on(CHIPS["h100-sxm"])
    assert not facts.runs_on(CHIPS["a100"])
    assert main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| h100-sxm |" in out
    assert "h100-sxm is the hardware version_0 ran on: calibrated on its measured step" in out
    assert main([str(folder), "--json", "--hardware", "run,a100"]) == 0
    own, other = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # calibrated on its own step: at the run's own micro-batch the prediction is the measured step
    assert own["hardware"] == "h100-sxm"
    assert own["step_time_s"] == pytest.approx(facts.step_s, rel=1e-6)
    assert other["hardware"] == "a100"
    # priced from the table, not the run's step: its compute is the A100's (the host's part, a dispatch cost measured
    # on this CPU, can bring its step time near the run's by chance: 0.8% once, on a busy machine)
    assert other["compute_s"] != pytest.approx(own["compute_s"], rel=0.5)
    # a run on a device the table lacks: one line naming the fix
    unknown = _gpu_run(tmp_path / "other", "Made-up Accelerator 9000", None)
    assert main([str(unknown)]) == 2
    assert "ran on 'Made-up Accelerator 9000', which is not in the hardware table" in capsys.readouterr().err


def test_a_cpu_run_runs_on_this_cpu_only_when_it_is_the_same_model():
    from lit_compute.hardware.chips import CHIPS, ThisMachine

    here = ThisMachine(
        "this",
        {"float32": 1e11},
        1e10,
        1e10,
        "loopback",
        "measured",
        measured=True,
        kind="cpu",
        device_name="AMD EPYC",
    )
    run = RunFacts(path=Path("r"), by_class={}, samples=1, model_flops=0.0, device="cpu", cpu="AMD EPYC")
    assert run.runs_on(here)
    assert not run.runs_on(CHIPS["xeon-6248"])
    assert not run.runs_on(CHIPS["h100-sxm"])
    assert not RunFacts(path=Path("r"), by_class={}, samples=1, model_flops=0.0, cpu="Intel Xeon").runs_on(here)


def test_no_module_reads_a_runs_facts_with_a_regular_expression():
    """The readers of runs (report, whatif, the tune's summaries) read the record and the scalars, never the text this
    project wrote: no ``re`` in them, and nobody looks a run fact up by its table label."""
    readers = [
        *(PACKAGE / "report" / f for f in ("runs.py", "advice.py", "document.py")),
        *sorted((PACKAGE / "planning" / "whatif").rglob("*.py")),
        PACKAGE / "planning" / "whatif_cli.py",
        PACKAGE / "run_record.py",
    ]
    for path in readers:
        text = path.read_text()
        assert not re.search(r"^\s*(import re\b|from re import)", text, re.M), path
    for path in PACKAGE.rglob("*.py"):
        assert '.info("' not in path.read_text().replace('logging.info("', ""), path


def test_a_log_folder_of_many_runs_is_priced_by_its_newest_version_and_says_so(tmp_path, capsys):
    """#47 item 7: ``whatif lightning_logs`` read version_2 rather than version_10 (sorted as strings), silently."""
    logs = tmp_path / "lightning_logs"
    for version in (2, 10):
        shutil.copytree(FIXTURE, logs / f"version_{version}")
    record = load_run(logs / "version_10").record
    record.op_classes["samples"] = 16
    write_record(logs / "version_10", record)
    facts = read_run(logs)
    assert facts.samples == 16
    assert facts.path.name == "version_10"
    assert any("holds 2 runs: priced the last, version_10" in n for n in facts.notes)
    # an event file named as RUN stands for its folder
    (event,) = (logs / "version_2").glob("events.out.tfevents.*")
    assert read_run(event).path.name == "version_2"


def test_a_cut_short_event_file_is_read_with_a_word(tmp_path, capsys):
    """#47 item 7: an event file cut mid-record was priced from its readable part without a word."""
    folder = tmp_path / "version_0"
    shutil.copytree(FIXTURE, folder)
    (event,) = folder.glob("events.out.tfevents.*")
    data = event.read_bytes()
    event.write_bytes(data[:-7])
    facts = read_run(folder)
    assert any("ends in a partial or damaged record" in n and f"{len(data) - 7:,} bytes" in n for n in facts.notes)
    assert main([str(folder), "--hardware", "a100"]) == 0
    assert "ends in a partial or damaged record" in capsys.readouterr().out
    assert main([str(FIXTURE), "--hardware", "a100"]) == 0
    assert "partial" not in capsys.readouterr().out

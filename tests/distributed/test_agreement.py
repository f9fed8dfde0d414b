"""Nodes started with different settings stop at set-up with one line naming the setting on every rank, instead of
hanging (a different ``log_every_n_steps`` or set of measuring callbacks: a logging all-reduce only some ranks call)
or dying later with an unnamed transport error (a different ``max_steps`` or batch size)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import yaml

from lit_compute import FlopsLogger, StepTimeMonitor
from lit_compute.agreement import describe_mismatch, flatten, settings

from ..conftest import make_trainer
from .conftest import launch_jobs

BASE = {
    "trainer": {
        "accelerator": "cpu",
        "devices": 1,
        "num_nodes": 2,
        "strategy": "ddp_tuned",
        "max_steps": 4,
        "log_every_n_steps": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [
            {"class_path": "lit_compute.FlopsLogger", "init_args": {"peak": "none"}},
            {"class_path": "lit_compute.StepTimeMonitor"},
        ],
    },
    "model": {"class_path": "tests.tuning.tune_models.SleepyRegression", "init_args": {"coef": 0.0}},
    "data": {"class_path": "tests.tuning.tune_models.RandomRegressionData", "init_args": {"batch_size": 8}},
}


def _different(c):
    """Node 1's file: another logging interval, step count and batch size, and a measuring callback fewer."""
    c["trainer"].update(log_every_n_steps=3, max_steps=6)
    c["data"]["init_args"]["batch_size"] = 16
    c["trainer"]["callbacks"] = c["trainer"]["callbacks"][1:]


# every rank's one line names the first three and counts the rest (the batch size among them; the callback list's
# shift moves many of the config's keys)
EXPECTED = [
    "log_every_n_steps: 2 on node 0 rank 0, 3 on node 1 rank 1",
    "max_steps: 4 on node 0 rank 0, 6 on node 1 rank 1",
    "callbacks[0]: FlopsLogger on node 0 rank 0, StepTimeMonitor on node 1 rank 1",
]


def _normalised(text: str) -> list[tuple[str, list[str]]]:
    """(setting, sorted values) per named setting: ranks follow the rendezvous, not the launch order."""
    out = []
    for part in text.split("; "):
        key, _, values = part.partition(": ")
        out.append((key, sorted(re.findall(r"(\S+) on node \d rank \d", values))))
    return out


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_nodes_with_different_settings_stop_at_setup_naming_them(tmp_path):
    """A two-node job whose node 1 file differs in the logging interval, the steps and the batch size (a logging
    all-reduce only some ranks call, a transport error later) and lacks a measuring callback. It ends within 90 s (a
    hang fails the test) with the one line on both nodes naming what differs."""
    other = copy.deepcopy(BASE)
    _different(other)
    files = [tmp_path / "node0.yaml", tmp_path / "node1.yaml"]
    files[0].write_text(yaml.safe_dump(BASE))
    files[1].write_text(yaml.safe_dump(other))
    (results,) = launch_jobs(tmp_path, [files], timeout=90)
    for rc, out in results:
        errors = [line for line in out.splitlines() if line.startswith("lit-compute: error:")]
        assert rc != 0, out[-3000:]
        assert len(errors) == 1, out[-3000:]
        named = _normalised(errors[0].split("different settings: ", 1)[1].split(". Start every node")[0])
        assert named[:3] == _normalised("; ".join(EXPECTED)), errors[0]
        assert re.fullmatch(r"and \d+ more", named[3][0]), errors[0]


def _entries(*per_rank):
    return [{"node": r, "rank": r, "settings": s} for r, s in enumerate(per_rank)]


def test_the_mismatch_names_the_first_setting_that_differs_and_where():
    same = {"max_steps": "4", "config.model.lr": "0.1"}
    assert describe_mismatch(
        _entries(
            {**same, "log_every_n_steps": "2"}, {**same, "log_every_n_steps": "3"}, {**same, "log_every_n_steps": "2"}
        )
    ).startswith(
        "the ranks of this job were started with different settings: log_every_n_steps: 2 on node 0 rank 0 (and 1 "
        "other ranks), 3 on node 1 rank 1. Start every node with the same config"
    )
    five = describe_mismatch(_entries({f"config.k{i}": "1" for i in range(5)}, {f"config.k{i}": "2" for i in range(5)}))
    assert "config.k2: 1 on node 0 rank 0, 2 on node 1 rank 1; and 2 more." in five
    assert "k3" not in five
    # trainer settings come before the rest; a setting only one rank has is "(not set)" elsewhere
    line = describe_mismatch(_entries({"config.a": "1", "max_steps": "4"}, {"config.a": "2", "max_steps": "5"}))
    assert (
        ": max_steps: 4 on node 0 rank 0, 5 on node 1 rank 1; config.a: 1 on node 0 rank 0, 2 on node 1 rank 1." in line
    )
    line = describe_mismatch(_entries({"callbacks[1]": '"StepTimeMonitor"'}, {}))
    assert "callbacks[1]: StepTimeMonitor on node 0 rank 0, (not set) on node 1 rank 1" in line


def test_what_is_compared_leaves_machine_local_values_out(tmp_path):
    flat = flatten(
        {
            "data": {"init_args": {"data_dir": "/node0/scratch", "batch_size": 8}},
            "trainer": {"default_root_dir": "/x", "callbacks": [{"init_args": {"port": 9464, "window": 5}}]},
            "seed_everything": 1234,
            "ckpt_path": None,
        }
    )
    assert flat == {"data.init_args.batch_size": "8", "trainer.callbacks[0].init_args.window": "5"}
    trainer = make_trainer(tmp_path, callbacks=[FlopsLogger(), StepTimeMonitor(window=7)])
    model = torch.nn.Linear(2, 2)
    values = settings(trainer, model, trainer.callbacks[:2])
    assert values["log_every_n_steps"] == "1"
    assert values["max_steps"] == "3"
    assert values["callbacks[0]"] == "FlopsLogger"
    assert values["callbacks[1] StepTimeMonitor.window"] == "7"
    assert not [v for v in values.values() if " at 0x" in v]  # object addresses differ between processes
    assert settings(trainer, model, trainer.callbacks[:2]) == values


def test_strategies_written_two_ways_are_compared_by_their_resolved_settings(tmp_path):
    """#47 item 14: node 0 wrote ``ddp_tuned``, node 1 a class_path with another comm_hook: the line listed
    ``config.trainer.strategy: ddp_tuned vs (not set) ... and 50 more``; it names comm_hook first."""
    from lit_compute.agreement import register_config
    from lit_compute.distributed import TunedDDPStrategy

    per_rank = []
    for hook, written in (
        ("none", "ddp_tuned"),
        ("bf16", {"class_path": "lit_compute.TunedDDPStrategy", "init_args": {"comm_hook": "bf16"}}),
    ):
        trainer = make_trainer(tmp_path / hook, strategy=TunedDDPStrategy(comm_hook=hook))
        register_config(trainer, {"trainer": {"strategy": written, "max_steps": 3}})
        per_rank.append(settings(trainer, torch.nn.Linear(2, 2), []))
    line = describe_mismatch(_entries(*per_rank))
    assert "different settings: strategy.comm_hook: none on node 0 rank 0, bf16 on node 1 rank 1." in line, line
    assert "config.trainer.strategy" not in line
    assert "more" not in line

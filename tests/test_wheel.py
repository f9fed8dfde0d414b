"""What a ``pip install`` user gets: the wheel ``python -m build`` makes, installed with pip into a fresh virtual
environment outside the repository, trains a packaged config with the ``lit-compute`` console script.

The new environment's own site-packages holds only lit_compute (installed from the wheel, ``--no-deps``); torch,
Lightning and the rest come from the running environment through one path line, because this machine cannot
download them again. A ``.pth`` path line puts that folder on ``sys.path`` without running its own ``.pth`` files, so
the development tree's editable install is not active there: the test asserts lit_compute is the wheel's copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_installs_outside_the_repository_and_trains_a_packaged_config(tmp_path):
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]  # the one source
    # the sources a wheel is built from, copied so that the build leaves nothing in the working tree
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lit_compute", src / "lit_compute", ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist")], src, 300)
    (wheel,) = (tmp_path / "dist").glob("lit_compute-*.whl")
    assert wheel.name.startswith(f"lit_compute-{version}-")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = venv / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        tmp_path,
        300,
    )
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, 60).strip()
    )
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    user = tmp_path / "user"  # a folder of the user's, far from the repository
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["LIT_COMPUTE_CACHE"] = str(tmp_path / "cache")
    # this machine's measurements (peaks, bf16 speed) as the suite's earlier runs cached them: the wheel's fit reads
    # them as a user's second run would, instead of measuring again
    measured = Path(os.environ.get("LIT_COMPUTE_CACHE", "")) / "this_machine.json"
    if measured.is_file():
        (tmp_path / "cache").mkdir()
        shutil.copy(measured, tmp_path / "cache" / measured.name)
    where = _run([str(python), "-c", "import lit_compute; print(lit_compute.__file__)"], user, 60, env).strip()
    assert Path(where).is_relative_to(site), where  # the wheel's copy, not the repository's
    console = venv / "bin" / "lit-compute"
    assert _run([str(console), "--version"], user, 60, env).strip() == f"lit-compute {version}"
    listed = _run([str(console), "init"], user, 60, env)
    assert "quickstart" in listed
    assert "gpt" in listed

    _run(
        [
            str(console),
            "fit",
            "--config",
            "quickstart",
            "--trainer.max_steps=3",
            "--trainer.log_every_n_steps=1",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--data.init_args.synthetic_images_per_class=8",
            "--data.init_args.image_size=32",
        ],
        user,
        400,
        env,
    )
    (events,) = (user / "lightning_logs").glob("version_0/events.out.tfevents.*")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events))
    acc.Reload()
    assert {"compute/flops_per_step", "memory/peak_gb"} <= set(acc.Tags()["scalars"])
    assert (user / "lightning_logs" / "version_0" / "config.yaml").is_file()  # the resolved config beside the run
    # the installed whatif quotes the published check rows it ships with (package data) beside a GPU target
    checked = _run(
        [
            str(python),
            "-c",
            "from lit_compute.planning.whatif import checked_on; print(checked_on('h100-sxm', 'bf16-mixed'))",
        ],
        user,
        60,
        env,
    )
    assert "published result(s) of this chip they were not fitted on" in checked, checked
    # the Grafana dashboard ships too: the installed command copies it out
    board = _run([str(python), "-m", "lit_compute.cli", "init", "grafana", "--out", "board.json"], user, 60, env)
    assert "packaged Grafana dashboard" in board, board
    assert json.loads((user / "board.json").read_text())["uid"] == "lit-compute-training"

"""lit_compute.warm_start: a process forked from a helper behaves as ``python ARGS`` started anew would (arguments,
working directory, environment, output, exit status, its own session) and answers as ``subprocess.Popen`` does.
The helpers here preload nothing, so each starts in a fraction of a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lit_compute.warm_start import WarmProcess, WarmStarter, start_process

SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "flag": os.environ.get("WARM_FLAG"),
                  "session": os.getsid(0) == os.getpid(), "path0": sys.path[0], "main": __name__}))
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if code == 99:
    raise RuntimeError("boom in the child")
if code == 77:
    import time
    time.sleep(600)
sys.exit(code)
"""


@pytest.fixture
def starter():
    helper = WarmStarter(preload=())
    yield helper
    helper.close()


def _run(starter: WarmStarter, tmp_path, *args: str, env: dict | None = None) -> tuple[int, str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SCRIPT))
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = starter.start([str(script), *args], stdout=out, env={**os.environ, **(env or {})}, cwd=tmp_path)
        code = proc.wait(timeout=60)
    return code, log.read_text()


def test_a_forked_script_gets_its_arguments_directory_environment_session_and_exit_status(starter, tmp_path):
    import json

    code, out = _run(starter, tmp_path, "3", env={"WARM_FLAG": "on"})
    seen = json.loads(out.splitlines()[0])
    assert code == 3
    assert seen == {
        "argv": ["3"],
        "cwd": str(tmp_path),
        "flag": "on",
        "session": True,
        "path0": str(tmp_path),
        "main": "__main__",
    }
    code, out = _run(starter, tmp_path, "0")  # the same helper again, one child after the other
    assert code == 0
    assert json.loads(out.splitlines()[0])["argv"] == ["0"]


def test_an_exception_prints_its_traceback_and_exits_1(starter, tmp_path):
    code, out = _run(starter, tmp_path, "99")
    assert code == 1
    assert "Traceback" in out
    assert "RuntimeError: boom in the child" in out


def test_wait_times_out_like_popen_and_the_group_can_be_stopped(starter, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = starter.start([str(script), "77"], cwd=tmp_path)
    assert isinstance(proc, WarmProcess)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    with pytest.raises(OSError, match="one child at a time"):
        starter.start([str(script), "0"], cwd=tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)  # its own session: its process group is its pid
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert starter.start([str(script), "6"], cwd=tmp_path).wait(timeout=60) == 6  # free again


def test_a_second_child_while_the_first_runs_is_a_new_interpreter(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # a helper of its own (start_process keys helpers by it)
    first = start_process([str(script), "77"], env=env, cwd=tmp_path, preload=())
    second = start_process([str(script), "5"], env=env, cwd=tmp_path, preload=())
    try:
        assert isinstance(first, WarmProcess)
        assert isinstance(second, subprocess.Popen)
        assert second.wait(timeout=60) == 5
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)


def test_without_warm_start_it_is_a_new_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_WARM_START", "0")
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = start_process([str(script), "4"], cwd=tmp_path, preload=())
    assert isinstance(proc, subprocess.Popen)
    assert proc.args[0] == sys.executable
    assert proc.wait(timeout=60) == 4


def test_a_prestarted_helper_is_the_one_the_first_child_comes_from(tmp_path):
    from lit_compute import warm_start

    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "prestarted")}
    warm_start.prestart(env, preload=())
    helper = warm_start._STARTERS[warm_start.helper_key(env, ())]._proc
    assert helper is not None
    assert helper.poll() is None
    proc = start_process([str(script), "2"], env=env, cwd=tmp_path, preload=())
    assert isinstance(proc, WarmProcess)
    assert proc.starter._proc is helper
    assert proc.wait(timeout=60) == 2


GUARDED = """
import json, os, random, sys
import numpy, torch
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor, closed by now
        pass
print(json.dumps({"threads": torch.get_num_threads(), "numpy": int(numpy.random.randint(2**31)),
                  "random": random.random(), "null": sorted(int(fd) for fd, to in fds.items() if to == "/dev/null"),
                  "lightning": "lightning.pytorch" in sys.modules}))
"""


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_with_torch_and_lightning_preloaded_each_child_is_a_new_interpreters_equal(tmp_path):
    """#70 item 3, with the helper preloading torch and Lightning as the product does: a child asking for another
    OMP_NUM_THREADS gets a helper started with it (the value is read when torch loads, so a helper keyed by
    PYTHONPATH alone gave it the first child's 2 threads); two children draw different numbers from numpy's and
    Python's global random states; the helper's /dev/null descriptors do not leak (only fd 0 points there); a helper
    that is not safe to fork (here a preloaded module starts a thread) declines, and the child is a new
    interpreter."""
    import json

    from lit_compute.warm_start import PRELOAD

    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(GUARDED))
    seen = []
    for threads in ("2", "1", "1"):
        log = tmp_path / f"out{len(seen)}.log"
        env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(tmp_path)}
        with open(log, "w") as out:
            proc = start_process([str(script)], stdout=out, env=env, cwd=tmp_path, preload=PRELOAD)
            assert isinstance(proc, WarmProcess)
            assert proc.wait(timeout=300) == 0, log.read_text()[-2000:]
        seen.append(json.loads(log.read_text().splitlines()[-1]))
    assert [s["threads"] for s in seen] == [2, 1, 1]
    assert seen[1]["numpy"] != seen[2]["numpy"]  # the same helper forked both: each reseeded
    assert seen[1]["random"] != seen[2]["random"]
    assert all(s["null"] == [0] for s in seen)
    assert all(s["lightning"] for s in seen)  # preloaded: the child did not import it again
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with open(tmp_path / "declined.log", "w") as out:
        proc = start_process([str(script)], env=env, cwd=tmp_path, preload=("starts_a_thread",), stdout=out)
        assert isinstance(proc, subprocess.Popen)  # declined: "the helper runs 2 threads"
        assert proc.wait(timeout=300) == 0

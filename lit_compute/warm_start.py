"""Start Python processes from one that has already imported torch and Lightning: the import (about 5 s of each
new interpreter on a 2-core machine) is paid once, not once per process.

A :class:`WarmStarter` runs a helper interpreter (``python .../lit_compute/warm_start.py``) that imports the modules it
is given and then waits. Each :meth:`WarmStarter.start` forks it: the child takes the command's working directory,
environment, standard output file and arguments, becomes the leader of a new session (so its process group can be
stopped whole, as ``subprocess.Popen(start_new_session=True)``'s), and runs the module (``python -m``) or script
given, as a new interpreter would. :class:`WarmProcess` answers as ``subprocess.Popen`` does (``pid``, ``poll``,
``wait(timeout)``, ``returncode``).

What a fork keeps that a new interpreter would not: the helper imported its modules before any work, so no thread,
CUDA context or process group exists to be copied (torch's CUDA is never initialised in it); ``sys.path`` gains the
entries of the command's ``PYTHONPATH`` the helper lacks. Linux only (``os.fork`` and ``PR_SET_PDEATHSIG``): the helper
and every child it starts get SIGKILL when their parent dies, even by SIGKILL. Elsewhere, or when the helper cannot
start, :func:`start_process` falls back to ``subprocess.Popen``. One child at a time per helper (the tune's trials
run one after another).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["WarmProcess", "WarmStarter", "prestart", "start_process", "stop_group"]

PRELOAD = ("torch", "lightning.pytorch", "lightning.pytorch.cli")


def die_with_parent() -> None:
    """The kernel sends this process SIGKILL when its parent dies (Linux's PR_SET_PDEATHSIG); elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


class WarmProcess:
    """A child forked by the helper, answering as ``subprocess.Popen``: its exit status comes over the helper's pipe."""

    def __init__(self, starter: WarmStarter, pid: int, args: list[str]) -> None:
        self.starter, self.pid, self.args = starter, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.starter._read(timeout, self.args)
            self.returncode = int(reply["returncode"]) if reply is not None else -signal.SIGKILL
            self.starter._busy = False
        return self.returncode


class WarmStarter:
    """The helper interpreter and its pipes; started on the first :meth:`start`, ended by :meth:`close` (or when this
    process exits: the helper reads end-of-file, or the kernel kills it with its parent)."""

    def __init__(
        self, preload: tuple[str, ...] = PRELOAD, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.preload, self.cwd, self.env = tuple(preload), cwd or os.getcwd(), dict(env or os.environ)
        self._proc: subprocess.Popen | None = None
        self._busy = False
        self._buffer = b""

    def _ensure(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = {**self.env, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # a CUDA check that leaves no state to fork
            # run as a file, not with -m: importing lit_compute before Lightning would leave its strategy names
            # unregistered in every child (it registers them when Lightning is already loaded)
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), *self.preload],
                cwd=self.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_single_threaded(die_with_parent),
            )
            self._buffer = b""
            self._busy = False
        return self._proc

    def start(
        self,
        args: list[str],
        stdout: IO[Any] | int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> WarmProcess:
        """Fork the helper into ``python ARGS`` (``-m MODULE ...`` or ``SCRIPT ...``), output to ``stdout`` (a file
        object or descriptor; None: this process's). Raises OSError when the helper is gone or answers nothing."""
        if self._busy:
            raise OSError("warm_start: one child at a time per helper")
        proc = self._ensure()
        out = 1 if stdout is None else stdout if isinstance(stdout, int) else stdout.fileno()
        # the helper opens this process's descriptor before it forks and answers: closed here after start() returns,
        # the child's copy stays open
        request = {
            "args": list(args),
            "env": dict(env if env is not None else os.environ),
            "cwd": str(cwd or os.getcwd()),
            "stdout": f"/proc/{os.getpid()}/fd/{out}",
        }
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, ValueError) as err:
            raise OSError(f"warm_start: the helper is gone ({err})") from None
        self._busy = True
        reply = self._read(120.0, args)
        if reply is None or "pid" not in reply:
            self._busy = False
            self.close()
            raise OSError(f"warm_start: the helper did not start {args!r}: {reply}")
        return WarmProcess(self, int(reply["pid"]), list(args))

    def _read(self, timeout: float | None, args: list[str]) -> dict[str, Any] | None:
        """The helper's next reply line; TimeoutExpired after ``timeout`` s; None when the helper died."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired(args, timeout or 0.0)
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_STARTERS: dict[tuple[Any, ...], WarmStarter] = {}

#: variables read once, when an interpreter starts or imports torch (OpenMP's and MKL's thread pools, torch's own
#: switches, hash randomisation, preloaded libraries): a child whose values differ needs a helper started with them
START_UP_PREFIXES = ("OMP_", "MKL_", "KMP_", "TORCH_", "OPENBLAS_", "GOMP_")
START_UP_NAMES = ("PYTHONHASHSEED", "LD_PRELOAD", "PYTHONPATH", "MALLOC_ARENA_MAX")


def helper_key(env: dict[str, str], preload: tuple[str, ...]) -> tuple[Any, ...]:
    """Which helper a child with ``env`` may be forked from: one per preload list and per value of every start-up
    variable (:data:`START_UP_PREFIXES`, :data:`START_UP_NAMES`), so a child never inherits the helper's."""
    read = sorted((k, v) for k, v in env.items() if k in START_UP_NAMES or k.startswith(START_UP_PREFIXES))
    return (tuple(preload), tuple(read))


def start_process(
    args: list[str],
    stdout: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    preload: tuple[str, ...] = PRELOAD,
) -> WarmProcess | subprocess.Popen:
    """``python ARGS`` in a new session, forked from a warm helper where possible (one helper per ``PYTHONPATH`` and
    preload list, kept for this process's life), else a new ``subprocess.Popen``. Either answers
    ``pid``, ``poll()``, ``wait(timeout)`` and ``returncode``; its process group is its pid."""
    env = dict(env if env is not None else os.environ)
    where = str(cwd or os.getcwd())
    if sys.platform == "linux" and os.environ.get("LIT_COMPUTE_WARM_START", "1") != "0":
        key = helper_key(env, tuple(preload))  # a child takes its own working directory and environment
        if key not in _STARTERS:
            _STARTERS[key] = WarmStarter(preload, cwd=where, env=env)
        starter = _STARTERS[key]
        if not starter._busy:  # while its child runs, a second one starts as a new interpreter
            with contextlib.suppress(OSError):
                return starter.start(args, stdout=stdout, env=env, cwd=where)
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        env=env,
        cwd=where,
        start_new_session=True,
        preexec_fn=_single_threaded(die_with_parent),
    )


def _single_threaded(hook: Any) -> Any:
    """``hook`` as a ``preexec_fn`` only while this process runs one thread: after fork a threaded parent's child may
    find a lock held by a thread that is not there (Python's documentation warns against it); without it the child
    does not die with its parent, and its caller stops its group itself."""
    import threading

    return hook if threading.active_count() == 1 else None


def prestart(env: dict[str, str] | None = None, preload: tuple[str, ...] = PRELOAD) -> None:
    """Start the helper :func:`start_process` will use for ``env`` now, without waiting: its imports run while the
    caller does other work (the tune's own imports) instead of before the first child. Nothing where warm start is
    off or not possible."""
    env = dict(env if env is not None else os.environ)
    if sys.platform != "linux" or os.environ.get("LIT_COMPUTE_WARM_START", "1") == "0":
        return
    key = helper_key(env, tuple(preload))
    if key not in _STARTERS:
        _STARTERS[key] = WarmStarter(preload, env=env)
    with contextlib.suppress(OSError):
        _STARTERS[key]._ensure()


def stop_group(proc: subprocess.Popen | WarmProcess) -> None:
    """SIGTERM the child's process group (its DataLoader workers and ranks), SIGKILL what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# -- the helper ----------------------------------------------------------------------------------------------
def _child(request: dict[str, Any], channel: tuple[int, int], out: int) -> None:
    """In the forked child: become the command the request describes, then exit with its status (never return)."""
    status = 1
    try:
        os.setsid()
        die_with_parent()
        for fd in channel:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        for fd in {out, devnull} - {0, 1, 2}:
            os.close(fd)
        _reseed()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for entry in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        if os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(AttributeError, ValueError):
                    stream.reconfigure(write_through=True)  # type: ignore[union-attr]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        status = _run(request["args"])
    except SystemExit as exit_:
        code = exit_.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child reports what a new interpreter would print, then exits
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        _exit(status)


def _reseed() -> None:
    """A forked child's random states as a new interpreter's would be: fresh from the OS, not the helper's copy
    (Python's ``random``, and numpy's global state where the helper imported numpy)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


def _unsafe_to_fork() -> str | None:
    """Why the helper must not fork now (a new interpreter is started instead): a CUDA context, a process group or
    a second thread would be copied half-alive into the child. None when it is safe."""
    import threading

    if threading.active_count() > 1:
        return f"the helper runs {threading.active_count()} threads"
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_initialized():
            return "the helper initialised CUDA"
        distributed = getattr(torch, "distributed", None)
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            return "the helper holds a process group"
    return None


def _exit(status: int) -> None:
    """What an interpreter does at exit (non-daemon threads joined, atexit handlers run, streams flushed), then exit."""
    import atexit
    import threading

    for step in (
        getattr(threading, "_shutdown", None),
        getattr(atexit, "_run_exitfuncs", None),
        sys.stdout.flush,
        sys.stderr.flush,
    ):
        with contextlib.suppress(BaseException):
            if step is not None:
                step()
    os._exit(status)


def _run(args: list[str]) -> int:
    """``python ARGS`` in this process: ``-m MODULE ...`` or ``SCRIPT ...`` as ``__main__``."""
    import runpy

    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = str(Path(args[0]).resolve().parent)  # as `python SCRIPT` puts the script's folder first
        runpy.run_path(args[0], run_name="__main__")
    return 0


def _serve(preload: list[str]) -> None:
    """The helper: import ``preload``, then fork one child per request line on stdin, answering its pid, then its exit
    status, on stdout; end at end-of-file."""
    import importlib

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which stops its children itself
    channel = (os.dup(0), os.dup(1))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if null > 2:
        os.close(null)
    for name in preload:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    requests = os.fdopen(channel[0], "rb")
    replies = os.fdopen(channel[1], "wb", buffering=0)
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        unsafe = _unsafe_to_fork()
        if unsafe is not None:  # the caller starts a new interpreter instead
            replies.write((json.dumps({"declined": unsafe}) + "\n").encode())
            continue
        try:
            out = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND)
        except OSError as err:
            replies.write((json.dumps({"error": f"cannot open the output {request['stdout']}: {err}"}) + "\n").encode())
            continue
        pid = os.fork()
        if pid == 0:
            _child(request, channel, out)
        os.close(out)
        replies.write((json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        replies.write((json.dumps({"returncode": code}) + "\n").encode())


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not this file's folder (lit_compute/): its modules would shadow others by name
    _serve(sys.argv[1:])

"""Shared fixtures: a private dataset cache, a tiny CPU trainer, tiny model and data, event-file reading."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Keep the synthetic dataset of the test session out of the user's cache; set before lit_compute is used.
_CACHE = Path(os.environ.get("PYTEST_LIT_COMPUTE_CACHE", "/tmp/lit_compute_test_cache"))
os.environ["LIT_COMPUTE_CACHE"] = str(_CACHE)
# One torch (OpenMP) thread a process unless the caller says otherwise: the suite runs two pytest-xdist workers beside
# the ranks and scripts they start, on as few as two cores, and each process's pool of one thread a core spinning
# against the others made the suite 2-3x slower. Read when torch loads; set_num_threads below covers an earlier import
os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning.pytorch as pl  # noqa: E402 - after LIT_COMPUTE_CACHE is set
import torch  # noqa: E402 - after LIT_COMPUTE_CACHE is set
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402 - after LIT_COMPUTE_CACHE is set

from lit_compute import ImageClassifier, TorchvisionImageDataModule  # noqa: E402 - after LIT_COMPUTE_CACHE is set

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_DATA = {
    "batch_size": 8,
    "image_size": 32,
    "synthetic_num_classes": 4,
    "synthetic_images_per_class": 8,
    "num_workers": 0,
}


class RandomImages(torch.utils.data.Dataset):
    """``n`` seeded random images (4 classes), each taking ``sleep`` seconds to "load"."""

    def __init__(self, sleep: float = 0.0, n: int = 64, size: int = 32):
        self.sleep, self.n, self.size = sleep, n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % 4


def in_lit_compute(filename: str) -> bool:
    """A traceback frame in the installed lit_compute package (not just any path holding "lit_compute": a
    repository cloned into a folder of that name holds the tests and the virtual environment too)."""
    import lit_compute

    return os.path.abspath(filename).startswith(os.path.dirname(os.path.abspath(lit_compute.__file__)) + os.sep)


def tiny_model(**kwargs) -> ImageClassifier:
    kwargs.setdefault("arch", "resnet18")
    kwargs.setdefault("num_classes", 4)
    return ImageClassifier(**kwargs)


class TwoOptimizerGAN(pl.LightningModule):
    """Two optimizers, manual optimization: one step per batch, whatever global_step does; the discriminator steps,
    then the generator's loss runs through it again."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.g = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        self.d = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_g, opt_d = self.optimizers()
        fake = self.g(torch.randn_like(x))
        d_loss = (
            torch.nn.functional.softplus(-self.d(x)).mean() + torch.nn.functional.softplus(self.d(fake.detach())).mean()
        )
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = torch.nn.functional.softplus(-self.d(fake)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log("train/d_loss", d_loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.g.parameters()), torch.optim.Adam(self.d.parameters())


class SmallNet(torch.nn.Module):
    """Convolutions with BatchNorm and a residual block, a few thousand parameters: the demo's kinds of layer for tests
    whose precision is slow on a CPU (float16 anywhere; bf16 without bf16 instructions, where a ResNet-18 step takes
    seconds)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(x.mean(dim=(2, 3)))


def small_model(**kwargs) -> ImageClassifier:
    """:func:`tiny_model` with :class:`SmallNet` inside (an ImageClassifier still: its steps, metrics, optimizer)."""
    model = tiny_model(**kwargs)
    model.net = SmallNet(model.hparams.get("num_classes", 4))
    return model


def tiny_data(**kwargs) -> TorchvisionImageDataModule:
    return TorchvisionImageDataModule(**{**TINY_DATA, **kwargs})


def make_trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    """A tiny CPU trainer writing TensorBoard events under ``tmp_path``."""
    defaults = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 3,
        "limit_train_batches": 3,
        "limit_val_batches": 1,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(tmp_path),
        "logger": pl.loggers.TensorBoardLogger(str(tmp_path), name="logs"),
    }
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


# Ranks started by a forkserver that imported torch and Lightning once for the whole session: each rank is a fork of
# that clean process (no thread or process group of this one's), not a new interpreter paying the imports again
torch.multiprocessing.set_forkserver_preload(["torch", "lightning.pytorch"])


class SpawnDDP(pl.strategies.DDPStrategy):
    """Lightning's DDP with ranks started by the session's forkserver (a new interpreter's state, without its imports)
    that destroy their process group at teardown (left to interpreter exit, gloo's threads can abort a rank at
    random; TunedDDPStrategy does the same)."""

    def __init__(self, start_method: str = "forkserver", **kwargs):
        super().__init__(start_method=start_method, **kwargs)

    def teardown(self):
        super().teardown()
        from lit_compute.distributed.tuned_ddp import destroy_process_group

        destroy_process_group()


def read_events(log_dir: str | Path) -> EventAccumulator:
    """Load every event file under ``log_dir`` with TensorBoard's own reader (scalars and text)."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_values(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def text_values(acc: EventAccumulator, tag: str) -> list[str]:
    """Text written with ``add_text`` (stored as tensors by the text plugin)."""
    out = []
    for ev in acc.Tensors(tag + "/text_summary"):
        out.extend(s.decode() for s in ev.tensor_proto.string_val)
    return out


@pytest.fixture
def trainer_factory(tmp_path):
    def factory(**kwargs) -> pl.Trainer:
        return make_trainer(tmp_path, **kwargs)

    return factory


@pytest.fixture(autouse=True)
def _fresh_master_port(monkeypatch):
    """Lightning keeps the MASTER_PORT of the first DDP run in os.environ; each test picks a fresh free port."""
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)


class DrivenClock:
    """A clock the test advances by hand: install it as a trainer's timeline clock
    (``timeline_for(trainer).clock = clock``) so every lit_compute figure is exact and independent of load."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class TimedImages(torch.utils.data.Dataset):
    """Random images whose loading advances ``clock`` by ``load_s`` per item (in-process loading only)."""

    def __init__(self, clock: DrivenClock, load_s: float = 0.0, n: int = 64, size: int = 16) -> None:
        self.clock, self.load_s, self.n, self.size = clock, load_s, n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        self.clock.advance(self.load_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % 4


class TimedNet(pl.LightningModule):
    """A small conv net whose training step advances ``clock`` by ``compute_s`` (``slow`` maps a step to its own
    compute time); logs ``train/loss`` like any LightningModule."""

    def __init__(self, clock: DrivenClock | None = None, compute_s: float = 0.01, slow: dict | None = None) -> None:
        super().__init__()
        self.clock, self.compute_s, self.slow = clock, compute_s, dict(slow or {})
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 4),
        )

    def training_step(self, batch, batch_idx):
        if self.clock is not None:
            self.clock.advance(self.slow.get(self.global_step, self.compute_s))
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def clocked_trainer(tmp_path: Path, clock: DrivenClock, **kwargs) -> pl.Trainer:
    """:func:`make_trainer` whose lit_compute timeline runs on ``clock``."""
    from lit_compute.timeline import timeline_for

    trainer = make_trainer(tmp_path, **kwargs)
    timeline_for(trainer).clock = clock
    return trainer


def run_script(tmp_path: Path, source: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``source`` as a Python script in a new process group; a run past ``timeout`` seconds is killed with
    all its processes (DDP ranks included) and fails the test instead of hanging the suite."""
    import contextlib
    import select
    import signal
    import textwrap

    from lit_compute.warm_start import start_process

    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_", "GROUP_RANK", "NCCL_"))
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    # forked from a helper that has imported torch and Lightning (lit_compute.warm_start): the script starts in a
    # fraction of a second instead of paying the imports again; a new interpreter where that is not possible
    read, write = os.pipe()
    try:
        proc = start_process([str(script), *args], stdout=write, env=env, cwd=tmp_path)
    finally:
        os.close(write)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read, "rb") as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(pipe.fileno(), 65536) if ready else None
            if not chunk:
                break
            chunks.append(chunk)
    out = b"".join(chunks).decode(errors="replace")
    if chunk is None:  # the deadline passed with the pipe still open
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the script did not finish within {timeout} s (a hang?); its output ended with:\n{out[-3000:]}")
    return subprocess.CompletedProcess([sys.executable, str(script), *args], proc.wait(), out, "")


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """A strategy launched in-process (popen with one device) keeps its process group, as Lightning's DDP does;
    each test starts without one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

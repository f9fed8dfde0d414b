"""PrometheusLogger: every metric logged through Lightning, as gauges on a Prometheus endpoint."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import time
from argparse import Namespace
from pathlib import Path
from typing import Annotated, Any, Literal

from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from lightning.pytorch.loggers import Logger

from lit_compute._validate import Check, validated
from lit_compute.files import write_whole
from lit_compute.monitoring.device_labels import device_labels
from lit_compute.writer import link_loggers

_RESERVED = ("step", "up", "scrape_duration_seconds")


def prometheus_name(key: str, prefix: str = "lit_compute") -> str:
    """A metric key as a valid Prometheus metric name:
    ``compute/tflops_per_sec`` -> ``lit_compute_compute_tflops_per_sec``."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    name = re.sub(r"_+", "_", name).strip("_")
    full = f"{prefix}_{name}" if prefix else name
    if not re.match(r"[a-zA-Z_]", full):
        full = "_" + full
    return full


def _current_device() -> Any:
    """The device to label before the trainer has said: the current CUDA device where CUDA is in use, else the CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:6]


class PrometheusLogger(Logger):
    """A Lightning logger that exposes every logged metric as a Prometheus gauge.

    Combine it with TensorBoard: ``Trainer(logger=[TensorBoardLogger("."), PrometheusLogger()])``. Every metric
    logged through Lightning (lit_compute's and the model's own ``self.log``) becomes a gauge named
    ``<prefix>_<key>`` (sanitised to Prometheus rules: ``train/loss`` -> ``lit_compute_train_loss``) with labels
    ``run`` and ``rank``; ``<prefix>_step`` holds the step of the latest values.

    With ``dcgm_labels=True`` (the default) every series also carries the labels NVIDIA's DCGM exporter puts on the
    GPU this rank trains on: ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, the node's name
    (``Hostname``; dcgm-exporter releases from May 2026 spell it ``hostname``: set ``hostname_label``), and on a
    MIG instance ``GPU_I_PROFILE`` and ``GPU_I_ID``. So ``lit_compute_compute_mfu * on(UUID) group_left()
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` joins a run to its GPUs. On a CPU they carry the host's values
    (:mod:`lit_compute.monitoring.device_labels`). Two keys that sanitise to the same
    name (``train-loss`` and ``train/loss``), a key that sanitises to a reserved name (``step``) or to nothing
    (non-ASCII tags) get a deterministic suffix from the key's hash (``lit_compute_train_loss_3fa4c1``), with one
    warning naming both.

    The endpoint is ``http://<host>:<port>/metrics``, bound to ``127.0.0.1`` unless you ask for all interfaces
    with ``host="0.0.0.0"``. It starts when the trainer first talks to its loggers (fit start) and stops when
    the run ends (``finalize``) unless ``keep_serving=True``. When the port is taken (another exporter, a second
    demo) ``on_port_in_use="next_free"`` (the default) serves on the next free port above it and says which;
    ``"error"`` raises. Under DDP, ``ranks="all"`` serves every rank's metrics (rank r from ``port + r`` up);
    ``ranks="zero"`` rank 0 only. With ``file_sd_dir`` each serving rank writes a Prometheus ``file_sd`` target
    file there (``<run>_rank<r>.json``, removed when serving stops), so a Prometheus server with
    ``file_sd_configs: [{files: ["<dir>/*.json"]}]`` finds every endpoint, with the ``run`` and ``rank`` labels.

    When the trainer also has a TensorBoard logger, the default ``run`` label and the ``version`` (what the
    progress bar shows as ``v_num``) follow it: ``lightning_logs/version_3`` and ``3``.

    Args:
        port: TCP port (rank r uses ``port + r``); 0 picks a free port (see :attr:`port_in_use`).
        host: Address to bind: ``"127.0.0.1"`` (default) or ``"0.0.0.0"`` for all interfaces.
        prefix: Metric-name prefix.
        run_name: The ``run`` label (default: the TensorBoard run, else ``run-<start time>``).
        ranks: ``"all"`` or ``"zero"``.
        keep_serving: Keep the endpoint up after the run ends (until :meth:`close` or the process ends).
        on_port_in_use: ``"next_free"`` or ``"error"``.
        file_sd_dir: Folder for Prometheus ``file_sd`` target files (None: none written).
        dcgm_labels: Add DCGM exporter's device labels to every series.
        hostname_label: The node label's name: ``"Hostname"`` (dcgm-exporter before May 2026) or ``"hostname"``.

    Raises:
        OSError: at fit start, when the address cannot be served (the message names host, port and the fix).

    Example:
        >>> logger = PrometheusLogger(port=0)
    """

    @validated
    def __init__(
        self,
        port: Annotated[int, Check(ge=0, le=65535, hint="0 picks a free port")] = 9464,
        host: str = "127.0.0.1",
        prefix: Annotated[
            str, Check(hint="letters, digits and underscores, not starting with a digit")
        ] = "lit_compute",
        run_name: str | None = None,
        ranks: Literal["all", "zero"] = "all",
        keep_serving: bool = False,
        on_port_in_use: Literal["next_free", "error"] = "next_free",
        file_sd_dir: str | None = None,
        dcgm_labels: bool = True,
        hostname_label: Literal["Hostname", "hostname"] = "Hostname",
    ) -> None:
        super().__init__()
        if prefix and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", prefix):
            raise ValueError(f"PrometheusLogger(prefix={prefix!r}) must match [a-zA-Z_][a-zA-Z0-9_]*")
        if not host:
            raise ValueError("PrometheusLogger(host='') must be an address such as '127.0.0.1' or '0.0.0.0'")
        self.base_port = port
        self.host = host
        self.prefix = prefix
        self._run_given = run_name is not None
        self.run_name = run_name or time.strftime("run-%Y%m%d-%H%M%S")
        self.ranks = ranks
        self.keep_serving = keep_serving
        self.on_port_in_use = on_port_in_use
        self.file_sd_dir = file_sd_dir
        self.dcgm_labels = dcgm_labels
        self.hostname_label = hostname_label
        self._device: Any = None  # the rank's torch device, from the trainer (log_graph)
        self._device_labels: dict[str, str] | None = None
        self._version: Any = None
        self._names: dict[str, str] = {}  # metric key -> series name
        self._owners: dict[str, str] = {prometheus_name(r, prefix): f"<reserved {r}>" for r in _RESERVED}
        self._state: dict[str, Any] | None = None  # registry, gauges, server: never pickled

    # -- Logger API -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "prometheus"

    @property
    def version(self) -> Any:
        return self._version if self._version is not None else self.run_name

    @property
    def rank(self) -> int:
        return int(getattr(rank_zero_only, "rank", 0) or 0)

    @property
    def port_in_use(self) -> int | None:
        """The port actually served on (after start), None before."""
        return self._state["port"] if self._state else None

    def follow(self, run: str, version: Any) -> None:
        """Take another logger's run (``lightning_logs/version_3``) as the default ``run`` label, and its version.

        A logger that keeps serving into a second run takes that run's label: run 2's values become new series
        beside run 1's (never overwriting them), and the ``file_sd`` target file is renamed with the run."""
        self._version = version
        if self._run_given or run == self.run_name:
            return
        self.run_name = run
        if self._state is not None and self._state.get("target"):
            Path(self._state["target"]).unlink(missing_ok=True)
            self._state["target"] = self._write_target(self._state["port"])

    @property
    def every_rank(self) -> bool:
        """Whether every rank serves its own metrics (``ranks="all"``): lit_compute's callbacks then send each rank's
        figures here, not rank 0's alone."""
        return self.ranks == "all"

    def _active(self) -> bool:
        return self.ranks == "all" or self.rank == 0

    def start(self) -> None:
        """Start the HTTP endpoint now (idempotent). Raises ``OSError`` naming host, port and the fix."""
        if self._state is not None or not self._active():
            return
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        registry = CollectorRegistry()
        wanted = self.base_port + self.rank if self.base_port else 0
        result, port = None, wanted
        for attempt in range(100 if self.on_port_in_use == "next_free" and wanted else 1):
            port = wanted + attempt
            try:
                result = start_http_server(port, addr=self.host, registry=registry)
                break
            except OSError as err:
                if err.errno == errno.EADDRINUSE and attempt < 99 and self.on_port_in_use == "next_free" and wanted:
                    continue
                raise OSError(err.errno, self._bind_error(port, err)) from err
        server = result[0] if isinstance(result, tuple) else None
        actual = server.server_address[1] if server is not None else port
        if wanted and actual != wanted:
            rank_zero_warn(
                f"PrometheusLogger: port {wanted} on {self.host} is in use; serving on port {actual} instead "
                "(on_port_in_use='error' refuses).",
                category=UserWarning,
            )
        self._state = {
            "registry": registry,
            "gauges": {},
            "server": server,
            "port": actual,
            "Gauge": Gauge,
            "target": self._write_target(actual),
        }
        rank_zero_info(f"PrometheusLogger: serving http://{self.host}:{actual}/metrics (rank {self.rank})")

    def _bind_error(self, port: int, err: OSError) -> str:
        where = f"PrometheusLogger(host={self.host!r}, port={self.base_port}): cannot serve on {self.host}:{port}"
        if err.errno == errno.EADDRINUSE:
            return (
                f"{where}: the port is already in use (rank {self.rank} serves on port + rank). Pass another port, "
                "port=0 for a free one, or on_port_in_use='next_free'."
            )
        if isinstance(err, socket.gaierror):
            return f"{where}: {self.host!r} is not a known address ({err}). Use '127.0.0.1' or '0.0.0.0'."
        if err.errno in (errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM):
            return (
                f"{where}: {os.strerror(err.errno)}. Use an address of this machine ('127.0.0.1', or '0.0.0.0' "
                "for all interfaces) and a port above 1023."
            )
        return f"{where}: {err}. Check host and port."

    def _write_target(self, port: int) -> str | None:
        if not self.file_sd_dir:
            return None
        folder = Path(self.file_sd_dir).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.run_name)}_rank{self.rank}.json"
        target = [{"targets": [f"{host}:{port}"], "labels": {"run": self.run_name, "rank": str(self.rank)}}]
        write_whole(path, json.dumps(target, indent=2))  # Prometheus never reads a half-written file
        return str(path)

    def series_name(self, key: str) -> str:
        """The series name of a metric key (stable for the logger's life; collisions get a hash suffix)."""
        name = self._names.get(key)
        if name is not None:
            return name
        name = prometheus_name(key, self.prefix)
        owner = self._owners.get(name)
        if owner is not None or name == f"{self.prefix}_" or not name.strip("_"):
            unique = f"{name.rstrip('_')}_{_digest(key)}"
            rank_zero_warn(
                f"PrometheusLogger: metric {key!r} would be series {name!r}"
                + (f", which {owner!r} already is" if owner else "")
                + f"; it is served as {unique!r}.",
                category=UserWarning,
            )
            name = unique
        self._names[key] = name
        self._owners[name] = key
        return name

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self.start()

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        # Lightning calls this at every run's start with the LightningModule: its trainer names the TensorBoard run
        # (the run label), with or without a lit_compute callback in the run
        trainer = getattr(model, "_trainer", None)
        if trainer is not None:
            link_loggers(trainer)
            self._device = trainer.strategy.root_device
        self.start()

    def labels(self) -> dict[str, str]:
        """The labels of every series this rank serves: ``run``, ``rank`` and (``dcgm_labels``) the device's."""
        if self._device_labels is None:
            self._device_labels = {}
            if self.dcgm_labels:
                self._device_labels = device_labels(self._device or _current_device(), self.hostname_label)
        return {"run": self.run_name, "rank": str(self.rank), **self._device_labels}

    def _gauge(self, name: str, documentation: str) -> Any:
        assert self._state is not None
        gauge = self._state["gauges"].get(name)
        if gauge is None:
            gauge = self._state["Gauge"](name, documentation, list(self.labels()), registry=self._state["registry"])
            self._state["gauges"][name] = gauge
        return gauge

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.start()
        if self._state is None:
            return
        labels = self.labels()
        for key, value in metrics.items():
            self._gauge(self.series_name(key), f"lit_compute metric {key}").labels(**labels).set(float(value))
        if step is not None:
            self._gauge(prometheus_name("step", self.prefix), "Trainer step of the latest values").labels(**labels).set(
                step
            )

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        if not self.keep_serving:
            self.close()

    def close(self) -> None:
        """Stop the HTTP endpoint (and remove the file_sd target file)."""
        state, self._state = self._state, None
        if not state:
            return
        if state.get("server") is not None:
            state["server"].shutdown()
            state["server"].server_close()
        if state.get("target"):
            Path(state["target"]).unlink(missing_ok=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_state"] = None  # sockets and threads do not cross process boundaries (ddp_spawn)
        state["_device_labels"] = state["_device"] = None  # each rank labels its own device
        return state

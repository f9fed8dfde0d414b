"""PrometheusLogger: every metric logged through Lightning, as gauges on a Prometheus endpoint."""

from __future__ import annotations

import errno
import re
import time
from argparse import Namespace
from typing import Any, Literal

from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning.pytorch.loggers import Logger


def prometheus_name(key: str, prefix: str = "lit_compute") -> str:
    """A metric key as a valid Prometheus metric name: ``compute/tflops_per_sec`` -> ``lit_compute_compute_tflops_per_sec``."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    name = re.sub(r"_+", "_", name).strip("_")
    full = f"{prefix}_{name}" if prefix else name
    if not re.match(r"[a-zA-Z_]", full):
        full = "_" + full
    return full


class PrometheusLogger(Logger):
    """A Lightning logger that exposes every logged metric as a Prometheus gauge.

    Combine it with TensorBoard: ``Trainer(logger=[TensorBoardLogger("."), PrometheusLogger()])``. Every metric
    logged through Lightning (lit_compute's and the model's own ``self.log``) becomes a gauge named
    ``<prefix>_<key>`` (sanitised to Prometheus rules: ``train/loss`` -> ``lit_compute_train_loss``) with
    labels ``run`` and ``rank``; ``<prefix>_step`` holds the step of the latest values.

    The endpoint is ``http://<host>:<port>/metrics``. It binds to ``127.0.0.1`` by default; it listens on all
    interfaces only when you ask for it with ``host="0.0.0.0"`` (then anyone who can reach the machine can
    read your metrics). It starts when the trainer first talks to its loggers (fit start) and keeps serving
    after fit (so the last values can be scraped) until :meth:`close` or the process ends.

    Under DDP, ``ranks="all"`` serves every rank's metrics, rank r on ``port + r``; ``ranks="zero"`` serves
    rank 0 only.

    Args:
        port: TCP port (rank r uses ``port + r``); 0 picks a free port (see :attr:`port_in_use`).
        host: Address to bind. ``"127.0.0.1"`` (default) or ``"0.0.0.0"`` for all interfaces.
        prefix: Metric-name prefix.
        run_name: The ``run`` label (default: ``run-<start time>``).
        ranks: ``"all"`` or ``"zero"``.

    Raises:
        OSError: at fit start, when the port is already in use (the message names it).

    Example:
        >>> logger = PrometheusLogger(port=0)
    """

    def __init__(
        self,
        port: int = 9464,
        host: str = "127.0.0.1",
        prefix: str = "lit_compute",
        run_name: str | None = None,
        ranks: Literal["all", "zero"] = "all",
    ) -> None:
        super().__init__()
        if not 0 <= port <= 65535:
            raise ValueError(f"PrometheusLogger(port={port}) must be in 0..65535 (0 picks a free port)")
        if ranks not in ("all", "zero"):
            raise ValueError(f"PrometheusLogger(ranks={ranks!r}) must be 'all' or 'zero'")
        if prefix and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", prefix):
            raise ValueError(f"PrometheusLogger(prefix={prefix!r}) must match [a-zA-Z_][a-zA-Z0-9_]*")
        self.base_port = port
        self.host = host
        self.prefix = prefix
        self.run_name = run_name or time.strftime("run-%Y%m%d-%H%M%S")
        self.ranks = ranks
        self._state: dict[str, Any] | None = None  # registry, gauges, server: never pickled

    # -- Logger API -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "prometheus"

    @property
    def version(self) -> str:
        return self.run_name

    @property
    def rank(self) -> int:
        return int(getattr(rank_zero_only, "rank", 0) or 0)

    @property
    def port_in_use(self) -> int | None:
        """The port actually served on (after start), None before."""
        return self._state["port"] if self._state else None

    def _active(self) -> bool:
        return self.ranks == "all" or self.rank == 0

    def start(self) -> None:
        """Start the HTTP endpoint now (idempotent). Raises ``OSError`` naming the port when it is taken."""
        if self._state is not None or not self._active():
            return
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        registry = CollectorRegistry()
        port = self.base_port + self.rank if self.base_port else 0
        try:
            result = start_http_server(port, addr=self.host, registry=registry)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise OSError(
                    err.errno,
                    f"PrometheusLogger(port={self.base_port}): port {port} on {self.host} is already in use "
                    f"(rank {self.rank} serves on port + rank). Pass another port, or port=0 for a free one.",
                ) from err
            raise
        server = result[0] if isinstance(result, tuple) else None
        actual = server.server_address[1] if server is not None else port
        step = Gauge(prometheus_name("step", self.prefix), "Trainer step of the latest values", ["run", "rank"],
                     registry=registry)
        self._state = {"registry": registry, "gauges": {}, "server": server, "port": actual, "step": step,
                       "Gauge": Gauge}
        rank_zero_info(f"PrometheusLogger: serving http://{self.host}:{actual}/metrics (rank {self.rank})")

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self.start()

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        self.start()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.start()
        if self._state is None:
            return
        labels = {"run": self.run_name, "rank": str(self.rank)}
        gauges = self._state["gauges"]
        for key, value in metrics.items():
            name = prometheus_name(key, self.prefix)
            gauge = gauges.get(name)
            if gauge is None:
                gauge = self._state["Gauge"](name, f"lit_compute metric {key}", ["run", "rank"],
                                             registry=self._state["registry"])
                gauges[name] = gauge
            gauge.labels(**labels).set(float(value))
        if step is not None:
            self._state["step"].labels(**labels).set(step)

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        pass  # keep serving: the last values stay scrapeable after fit

    def close(self) -> None:
        """Stop the HTTP endpoint."""
        if self._state and self._state.get("server") is not None:
            self._state["server"].shutdown()
            self._state["server"].server_close()
        self._state = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_state"] = None  # sockets and threads do not cross process boundaries (ddp_spawn)
        return state

"""TunedDDPStrategy: Lightning's DDP with validated NCCL settings, bucket and comm-hook options, measured bandwidth."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, Literal, cast

import torch
import torch.distributed as dist
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_compute._validate import Check, validated
from lit_compute.distributed.comm_benchmark import default_sizes, log_results, timed_sweep
from lit_compute.distributed.nccl_settings import NCCLSettings
from lit_compute.formatting import markdown_table
from lit_compute.writer import log_text


def destroy_process_group(barrier: bool = True) -> None:
    """Destroy the default process group, all ranks together.

    Left to interpreter exit, gloo's worker threads can be destroyed while still joinable ("terminate called
    without an active exception"), which aborts a spawned rank. A later fit creates a new group.
    """
    if dist.is_available() and dist.is_initialized():
        try:
            if barrier:
                dist.barrier()
        finally:
            dist.destroy_process_group()


_destroy_registered = False


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group at interpreter exit (once per process, no barrier: other ranks may be gone).

    Lightning does this for NCCL only; a gloo group left to interpreter finalization can abort the process with
    SIGABRT ("terminate called without an active exception"), which a torchrun agent reports as a failed node and the
    other nodes then lose the rendezvous store. Ranks started by torchrun, SLURM or Lightning's subprocess launcher
    keep the group after ``fit`` (the user's script may call ``test`` next), so it is destroyed at exit.
    """
    global _destroy_registered
    if not _destroy_registered:
        atexit.register(destroy_process_group, barrier=False)
        _destroy_registered = True


class TunedDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` with NCCL settings applied before the process group starts, comm hooks on every
    backend and a measured all-reduce bandwidth.

    A drop-in for ``lightning.pytorch.strategies.DDPStrategy``: it *is* one, and takes its whole constructor first
    (``accelerator``, ``parallel_devices``, ``cluster_environment``, ``checkpoint_io``, ``precision_plugin``,
    ``ddp_comm_state``, ``ddp_comm_hook``, ``ddp_comm_wrapper``, ``model_averaging_period``,
    ``process_group_backend``, ``timeout``, ``start_method``, and ``**kwargs`` forwarded untouched to
    ``DistributedDataParallel``) with Lightning's defaults. With none of the options below set it behaves as
    ``DDPStrategy``. Registered in Lightning's strategy registry as ``"ddp_tuned"`` (popen), ``"ddp_tuned_spawn"``,
    ``"ddp_tuned_fork"`` and ``"ddp_tuned_notebook"``, so YAML can say ``strategy: ddp_tuned``.

    Options (keyword-only):

    - ``nccl``: an :class:`NCCLSettings` (validated at construction). Its variables are written to the
      environment of every rank in ``setup_environment()``, before ``init_process_group`` and before any
      communicator exists, however the ranks were launched (Lightning's popen/spawn/fork launchers, torchrun,
      SLURM). A variable the user already exported with a different value is overridden, with one warning
      naming both values. On the gloo backend (CPU) they are recorded but inactive, said once.
    - ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``, ``find_unused_parameters``: the DDP
      arguments YAML users set most, typed; each is passed to ``DistributedDataParallel`` only when set (None
      keeps torch's default), like the same names in ``**kwargs``.
    - ``comm_hook``: ``"fp16"``/``"bf16"`` gradient compression or ``"powersgd"`` (torch's hooks), registered on
      every backend (Lightning registers ``ddp_comm_hook`` only on CUDA; torch's hooks work with gloo too).
    - ``benchmark_collectives``: an all-reduce bandwidth sweep at set-up (also available as the
      :class:`CommBenchmark` callback), logged as ``comm/allreduce_busbw_gbps`` per size and as a table.

    Differences from ``DDPStrategy`` when the options are unset: the effective configuration is logged once (text
    ``ddp/config``), and ranks started by Lightning's multiprocessing launcher (``start_method`` spawn, fork,
    forkserver) destroy their process group at teardown, all together (gloo's threads can otherwise abort a
    spawned rank at exit); a later ``fit``/``test`` on the same Trainer creates a new one. Like ``DDPStrategy``,
    an instance belongs to one Trainer.

    Logged metrics:
        - text ``ddp/config`` and hparams ``ddp/<setting>``: the effective configuration, once.
        - ``comm/allreduce_busbw_gbps``, ``comm/allreduce_algbw_gbps`` (step = message bytes) and text
          ``comm/allreduce_table``: with ``benchmark_collectives=True``.

    Args:
        accelerator: As ``DDPStrategy``.
        parallel_devices: As ``DDPStrategy``.
        cluster_environment: As ``DDPStrategy``.
        checkpoint_io: As ``DDPStrategy``.
        precision_plugin: As ``DDPStrategy``.
        ddp_comm_state: As ``DDPStrategy``.
        ddp_comm_hook: As ``DDPStrategy`` (a callable; mutually exclusive with ``comm_hook``).
        ddp_comm_wrapper: As ``DDPStrategy``.
        model_averaging_period: As ``DDPStrategy``.
        process_group_backend: ``"nccl"``, ``"gloo"``... (default: nccl on CUDA, gloo on CPU).
        timeout: The process group's timeout (``init_process_group``).
        start_method: Lightning's launcher: ``"popen"`` (scripts), ``"spawn"``, ``"fork"``, ``"forkserver"``.
        nccl: NCCL environment settings.
        bucket_cap_mb: DDP gradient bucket size in MiB (None: torch's 25).
        gradient_as_bucket_view: Gradients are views into the buckets (None: torch's False).
        static_graph: The model's graph and unused parameters do not change between iterations (None: False).
        find_unused_parameters: Search for parameters without gradients every step (None: False).
        comm_hook: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"powersgd"``.
        powersgd_rank: PowerSGD matrix approximation rank.
        powersgd_start_iter: Plain all-reduce before this iteration, PowerSGD after (>= 2).
        benchmark_collectives: Measure all-reduce bandwidth at set-up.
        benchmark_max_mb: Largest message of the sweep (MiB).
        benchmark_seconds: Time budget of the sweep.
        **kwargs: Forwarded to ``DistributedDataParallel``, as by ``DDPStrategy``.

    Raises:
        ValueError: at construction for bad values (NCCL values are checked by :class:`NCCLSettings`).

    Example:
        >>> strategy = TunedDDPStrategy(nccl=NCCLSettings(algo="Tree"), bucket_cap_mb=50, comm_hook="bf16")
    """

    @validated
    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable | None = None,
        ddp_comm_wrapper: Callable | None = None,
        model_averaging_period: Annotated[int | None, Check(ge=1)] = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        nccl: NCCLSettings | None = None,
        bucket_cap_mb: Annotated[float | None, Check(gt=0, hint="MiB; None: torch's 25")] = None,
        gradient_as_bucket_view: bool | None = None,
        static_graph: bool | None = None,
        find_unused_parameters: bool | None = None,
        comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none",
        powersgd_rank: Annotated[int, Check(ge=1)] = 1,
        powersgd_start_iter: Annotated[
            int, Check(ge=2, hint="PowerSGD's error feedback needs plain all-reduce steps first")
        ] = 1000,
        benchmark_collectives: bool = False,
        benchmark_max_mb: Annotated[float, Check(gt=0, hint="MiB")] = 64.0,
        benchmark_seconds: Annotated[float, Check(gt=0)] = 10.0,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if comm_hook != "none" and ddp_comm_hook is not None:
            raise ValueError(f"{name}(comm_hook={comm_hook!r}, ddp_comm_hook=...): give one of them, not both")
        for arg, value in (
            ("bucket_cap_mb", bucket_cap_mb),
            ("gradient_as_bucket_view", gradient_as_bucket_view),
            ("static_graph", static_graph),
            ("find_unused_parameters", find_unused_parameters),
        ):
            if value is not None:
                if arg in kwargs and kwargs[arg] != value:
                    raise ValueError(f"{name}({arg}=...) is given twice with different values")
                kwargs[arg] = value
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self.nccl = nccl
        self.bucket_cap_mb = bucket_cap_mb
        self.comm_hook = comm_hook
        self.powersgd_rank = powersgd_rank
        self.powersgd_start_iter = powersgd_start_iter
        self.benchmark_collectives = benchmark_collectives
        self.benchmark_max_mb = benchmark_max_mb
        self.benchmark_seconds = benchmark_seconds
        self.applied_env: dict[str, str] = {}
        self.benchmark_results: list[Any] = []

    def agreement_settings(self) -> dict[str, Any]:
        """What every rank must run with (:mod:`lit_compute.agreement` compares it at set-up): two nodes with
        different communication hooks or buckets exchange gradients that do not match."""
        ddp = {
            k: v
            for k, v in getattr(self, "_ddp_kwargs", {}).items()
            if isinstance(v, (bool, int, float, str, type(None)))
        }
        return {
            "comm_hook": self.comm_hook,
            "powersgd_rank": self.powersgd_rank,
            "powersgd_start_iter": self.powersgd_start_iter,
            "nccl": repr(self.nccl),
            "benchmark_collectives": self.benchmark_collectives,
            "benchmark_max_mb": self.benchmark_max_mb,
            "benchmark_seconds": self.benchmark_seconds,
            **ddp,
        }

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register ``ddp_tuned`` and its spawn/fork/notebook variants (not Lightning's own ``ddp`` names)."""
        for name, start_method in (
            ("ddp_tuned", "popen"),
            ("ddp_tuned_spawn", "spawn"),
            ("ddp_tuned_fork", "fork"),
            ("ddp_tuned_notebook", "fork"),
        ):
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"lit_compute's TunedDDPStrategy with start_method '{start_method}'",
                    start_method=start_method,
                )

    # -- environment, before the process group ----------------------------------------------------
    def setup_environment(self) -> None:
        self.apply_nccl_env()
        super().setup_environment()  # creates the process group
        if dist.is_available() and dist.is_initialized():
            destroy_process_group_at_exit()

    def apply_nccl_env(self) -> dict[str, str]:
        """Write the NCCL variables to this process's environment (idempotent)."""
        if self.nccl is None:
            return {}
        for key, value in self.nccl.env().items():
            previous = os.environ.get(key)
            if previous is not None and previous != value and self.applied_env.get(key) != value:
                rank_zero_warn(
                    f"TunedDDPStrategy: {key} was exported as {previous!r}; the explicit setting {value!r} wins."
                )
            os.environ[key] = value
            self.applied_env[key] = value
        return dict(self.applied_env)

    # -- comm hooks on every backend ----------------------------------------------------------------
    def _register_ddp_hooks(self) -> None:
        if self.comm_hook == "none":
            return super()._register_ddp_hooks()
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        model = cast(DistributedDataParallel, self.model)  # Lightning wraps the model before registering hooks
        if self.comm_hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "bf16":
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        else:
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.powersgd_start_iter,
            )
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return None

    # -- after set-up: the configuration, once -----------------------------------------------------
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        backend = dist.get_backend() if dist.is_initialized() else (self._process_group_backend or "none")
        if self.nccl is not None and backend != "nccl":
            rank_zero_info(
                f"TunedDDPStrategy: backend is {backend}; the NCCL settings are set in the environment but "
                "inactive (NCCL is not used)."
            )
        if getattr(trainer.state, "fn", None) != "fit":
            return  # test/validate after fit: the configuration and the benchmark were logged by the fit
        self._log_config(trainer, backend)
        if self.benchmark_collectives and dist.is_initialized() and trainer.world_size > 1:
            self.benchmark_results = timed_sweep(trainer, default_sizes(self.benchmark_max_mb), self.benchmark_seconds)
            log_results(trainer, self.benchmark_results, backend)

    def on_exception(self, exception: BaseException) -> None:
        self._failed = True  # no barrier at teardown: another rank may be gone
        super().on_exception(exception)

    def teardown(self) -> None:
        super().teardown()
        if self._start_method != "popen":  # ranks of Lightning's multiprocessing launcher: they end with the run
            destroy_process_group(barrier=not getattr(self, "_failed", False))
        self._failed = False

    def effective_config(self, backend: str) -> dict[str, Any]:
        nccl_version = None
        if backend == "nccl" and torch.cuda.is_available():
            try:
                nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001 - a version for the record only: unknown is fine
                nccl_version = None
        bucket = getattr(self.model, "bucket_bytes_cap", None)
        config: dict[str, Any] = {
            "backend": backend,
            "nccl_version": nccl_version or "n/a",
            "world_size": self.world_size,
            "bucket_cap_mb": bucket / 2**20 if bucket else (self.bucket_cap_mb or 25.0),
            "comm_hook": self.comm_hook
            if self._ddp_comm_hook is None
            else getattr(self._ddp_comm_hook, "__name__", "custom"),
            "gradient_as_bucket_view": self._ddp_kwargs.get("gradient_as_bucket_view", False),
            "static_graph": self._ddp_kwargs.get("static_graph", False),
            "find_unused_parameters": self._ddp_kwargs.get("find_unused_parameters", False),
        }
        for key, value in self.applied_env.items():
            config[key] = value + ("" if backend == "nccl" else " (inactive: not NCCL)")
        return config

    def _log_config(self, trainer: Any, backend: str) -> None:
        config = self.effective_config(backend)
        log_text(
            trainer, "ddp/config", markdown_table(["setting", "value"], [[k, v] for k, v in config.items()]), step=0
        )
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_hyperparams({f"ddp/{k}": v for k, v in config.items()})


TunedDDPStrategy.register_strategies(StrategyRegistry)

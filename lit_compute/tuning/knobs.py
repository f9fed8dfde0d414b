"""The knobs ``lit-compute tune`` tries, found by inspecting the model as the baseline trial built it.

Pure logic over the config (a dict) and the baseline's facts (``TrialRecorder``'s ``model_facts``): a knob that
applies has candidate values and edits the config; one that does not is listed with the reason. Every edit is
something ``lit-compute fit`` accepts unchanged (a trainer setting, a datamodule argument, a lit_compute plugin,
callback or strategy), so the tuned file is a plain config.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lit_compute.tuning.config_yaml import (
    add_callback,
    as_list,
    class_name,
    data_section,
    section,
    short,
)

Facts = Mapping[str, Any]


@dataclass
class Knob:
    """One setting the tune can change: its candidate values and how a value edits the config."""

    name: str
    values: list[Any]
    edit: Callable[[dict[str, Any], Any], None]
    describe: Callable[[Any], str]
    #: why a value changes the results by design ('' when it should not)
    changes_results: str = ""
    #: False when the knob feeds different batches (other crops, packed rows): the first-step loss then differs
    #: by design and only the trajectory is compared
    same_batches: bool = True
    #: knobs that, once accepted, make this one meaningless: name -> why
    excluded_by: dict[str, str] = field(default_factory=dict)
    #: extra seconds a trial with this knob needs before its steps run at speed (compilation)
    warmup_s: float = 0.0


@dataclass
class NotApplicable:
    name: str
    reason: str


@dataclass
class Machine:
    """What the tune measured about the device before the trials."""

    device: str = "cpu"
    bf16_fast: bool = False
    bf16_supported: bool = False
    note: str = ""
    dali: bool = False
    extras: dict[str, Any] = field(default_factory=dict)


# -- edits ---------------------------------------------------------------------------------------------------
def _drop_precision(trainer: dict[str, Any]) -> None:
    trainer.pop("precision", None)
    if "plugins" in trainer:
        plugins = [p for p in as_list(trainer, "plugins") if "Precision" not in short(class_name(p))]
        if plugins:
            trainer["plugins"] = plugins
        else:
            trainer.pop("plugins")


def _precision_edit(norms: list[str]) -> Callable[[dict[str, Any], Any], None]:
    others = [n for n in norms if "BatchNorm" not in n]  # every _BatchNorm is kept float32 anyway

    def edit(config: dict[str, Any], value: str) -> None:
        trainer = section(config, "trainer")
        _drop_precision(trainer)
        if not norms:
            trainer["precision"] = value
            return
        plugin = (
            "lit_compute.FP32BatchNormHalfPrecision"
            if value.endswith("-true")
            else "lit_compute.FP32BatchNormPrecision"
        )
        init_args: dict[str, Any] = {"precision": value}
        if others:
            init_args["fp32_norms"] = others
        as_list(trainer, "plugins").append({"class_path": plugin, "init_args": init_args})

    return edit


def _callback_edit(class_path: str) -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: Any) -> None:
        add_callback(config, class_path)

    return edit


def _data_edit(datamodule_class: str, **fixed: Any) -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: Any) -> None:
        data = data_section(config, datamodule_class)
        assert data is not None
        data["init_args"].update({k: (value if v is None else v) for k, v in fixed.items()})

    return edit


def _dali_edit(datamodule_class: str, dali_args: list[str]) -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: Any) -> None:
        data = data_section(config, datamodule_class)
        assert data is not None
        data["class_path"] = "lit_compute.data.DALIImageDataModule"
        data["init_args"] = {k: v for k, v in data["init_args"].items() if k in dali_args}

    return edit


def _micro_batch_edit(datamodule_class: str, batch_size: int, accumulate: int) -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: int) -> None:
        data = data_section(config, datamodule_class)
        assert data is not None
        data["init_args"]["batch_size"] = value
        section(config, "trainer")["accumulate_grad_batches"] = accumulate * batch_size // value

    return edit


def _ddp_edit(**settings: Any) -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: Any) -> None:
        trainer = section(config, "trainer")
        strategy = trainer.get("strategy")
        start = {"ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}.get(str(strategy), "popen")
        # TunedDDPStrategy's own arguments, or DDPStrategy's (the same names), carry over
        init_args = dict(strategy.get("init_args") or {}) if isinstance(strategy, dict) else {"start_method": start}
        init_args.update({k: (value if v is None else v) for k, v in settings.items()})
        trainer["strategy"] = {"class_path": "lit_compute.TunedDDPStrategy", "init_args": init_args}

    return edit


# -- the knobs -----------------------------------------------------------------------------------------------
def _precision(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    current = str(facts.get("precision", "32-true"))
    if current not in ("32-true", "32", "64-true", "64"):
        return NotApplicable("precision", f"already {current}")
    if machine.device == "cuda":
        values = ["bf16-mixed", "bf16-true"] if machine.bf16_supported else ["16-mixed"]
    elif machine.bf16_fast:
        values = ["bf16-mixed", "bf16-true"]
    else:
        return NotApplicable(
            "precision",
            f"bfloat16 is not faster than float32 on this {machine.device} ({machine.note}); 16-mixed needs a GPU",
        )
    norms = list(facts.get("norms") or [])
    kept = f" with {', '.join(norms)} in float32" if norms else ""
    return Knob(
        "precision",
        values,
        _precision_edit(norms),
        lambda v: f"precision {v}{kept}",
        changes_results="lower-precision arithmetic changes the losses slightly",
    )


def _tf32(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if machine.device != "cuda":
        return NotApplicable(
            "tf32", f"TF32 tensor cores are an NVIDIA GPU's (Ampere and later); this run is on the {machine.device}"
        )
    if not machine.extras.get("tf32"):
        return NotApplicable(
            "tf32",
            f"{machine.extras.get('device_name', 'this GPU')} has no TF32 tensor cores (compute capability below 8.0)",
        )
    if str(facts.get("precision", "32-true")) not in ("32-true", "32"):
        return NotApplicable("tf32", f"the run is {facts.get('precision')}: its matmuls are not float32")
    if facts.get("float32_matmul_precision", "highest") != "highest":
        return NotApplicable("tf32", f"float32 matmul precision is {facts.get('float32_matmul_precision')!r} already")
    return Knob(
        "tf32",
        ["high"],
        _float32_matmul_edit(),
        lambda v: f"float32 matmuls and convolutions on TF32 tensor cores (Float32MatmulPrecision('{v}'))",
        changes_results="TF32 rounds matmul inputs to 10 mantissa bits",
        excluded_by={"precision": "the matmuls run in 16 bits once the precision changed"},
    )


def _float32_matmul_edit() -> Callable[[dict[str, Any], Any], None]:
    def edit(config: dict[str, Any], value: Any) -> None:
        add_callback(config, "lit_compute.speedup.Float32MatmulPrecision", {"precision": value})

    return edit


def _cudnn_benchmark(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if machine.device != "cuda":
        return NotApplicable(
            "cudnn_benchmark", f"cuDNN's autotuner picks GPU convolution kernels; this run is on the {machine.device}"
        )
    if not facts.get("conv2d"):
        return NotApplicable("cudnn_benchmark", "the model has no 2-D convolutions for cuDNN to autotune")
    if facts.get("cudnn_benchmark"):
        return NotApplicable("cudnn_benchmark", "cudnn.benchmark is on already")

    def edit(config: dict[str, Any], value: Any) -> None:
        section(config, "trainer")["benchmark"] = value

    return Knob(
        "cudnn_benchmark",
        [True],
        edit,
        lambda v: "cuDNN autotuning of each convolution shape (Trainer(benchmark=True))",
    )


def _channels_last(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if not facts.get("conv2d"):
        return NotApplicable("channels_last", "the model has no 2-D convolutions")
    if facts.get("channels_last"):
        return NotApplicable("channels_last", "the convolution weights are channels-last already")
    return Knob(
        "channels_last",
        [True],
        _callback_edit("lit_compute.speedup.ChannelsLast"),
        lambda v: "channels-last convolution weights (ChannelsLast)",
    )


def _data_class(facts: Facts) -> str:
    return str(facts.get("datamodule_class") or "")


def _own_loaders(facts: Facts) -> str | None:
    if not facts.get("datamodule_class"):
        return "the LightningModule builds its own DataLoader in code (no datamodule argument to set)"
    return None


def _dali(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if (reason := _own_loaders(facts)) is not None:
        return NotApplicable("dali", reason)
    if short(_data_class(facts)) != "TorchvisionImageDataModule":
        return NotApplicable(
            "dali", f"{short(_data_class(facts))} is not an image-folder datamodule DALIImageDataModule replaces"
        )
    if not machine.dali:
        return NotApplicable("dali", "NVIDIA DALI is not installed (pip install 'lit-compute[dali]')")
    dali_args = list(machine.extras.get("dali_args") or [])
    return Knob(
        "dali",
        [True],
        _dali_edit(_data_class(facts), dali_args),
        lambda v: "DALIImageDataModule (decode and augment in DALI) instead of torchvision",
        changes_results="DALI's resize and crop differ from torchvision's: different pixels",
        same_batches=False,
        warmup_s=60.0,
    )  # DALI's import, pipeline build and first prefetch before the steps run at speed


def _workers(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if (reason := _own_loaders(facts)) is not None:
        return NotApplicable("loader", reason)
    args = set(facts.get("datamodule_args") or [])
    loader = facts.get("loader") or {}
    if "num_workers" not in args:
        return NotApplicable("loader", f"{short(_data_class(facts))} takes no num_workers argument")
    if "num_workers" not in loader:
        return NotApplicable("loader", f"{short(loader.get('class', '?'))} is not a torch DataLoader")
    if loader["num_workers"] > 0:
        return NotApplicable("loader", f"already {loader['num_workers']} worker(s)")
    workers = max(1, int(0.75 * int(facts.get("cpu_count") or 1)))
    fixed: dict[str, Any] = {"num_workers": None}
    if "persistent_workers" in args:
        fixed["persistent_workers"] = True
    if "pin_memory" in args and machine.device == "cuda":
        fixed["pin_memory"] = True
    if "prefetch_factor" in args:
        fixed["prefetch_factor"] = 4
    extra = ", ".join(f"{k}={v}" for k, v in fixed.items() if v is not None)
    return Knob(
        "loader",
        [workers],
        _data_edit(_data_class(facts), **fixed),
        lambda v: f"DataLoader num_workers={v}" + (f", {extra}" if extra else ""),
        excluded_by={"dali": "DALIImageDataModule decodes in DALI's own threads: no DataLoader workers"},
    )


def _packing(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if "mode" not in (facts.get("datamodule_args") or []) or short(_data_class(facts)) != "TokenDataModule":
        return NotApplicable("packing", "not a TokenDataModule (only its documents can be packed into rows)")
    if facts.get("datamodule_mode") != "padded":
        return NotApplicable("packing", f"documents are {facts.get('datamodule_mode')} already")
    return Knob(
        "packing",
        ["packed"],
        _data_edit(_data_class(facts), mode=None),
        lambda v: "documents packed into full rows instead of padded",
        changes_results="packed rows hold more real tokens per step: different batches",
        same_batches=False,
    )


def _fused(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    optimizers = list(facts.get("optimizers") or [])
    if not optimizers:
        return NotApplicable("fused_optimizer", "the module configures no optimizer")
    if all(o.get("fused") for o in optimizers):
        return NotApplicable("fused_optimizer", "the optimizers are fused already")
    not_fusable = [o for o in optimizers if not o.get("fusable")]
    if not_fusable:
        return NotApplicable("fused_optimizer", str(not_fusable[0].get("why_not")))
    names = ", ".join(sorted({short(o["class"]) for o in optimizers}))
    return Knob(
        "fused_optimizer",
        [True],
        _callback_edit("lit_compute.speedup.FusedOptimizer"),
        lambda v: f"fused {names} step (FusedOptimizer)",
    )


def _micro_batch(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if (reason := _own_loaders(facts)) is not None:
        return NotApplicable("micro_batch", reason)
    if not facts.get("automatic_optimization", True):
        return NotApplicable("micro_batch", "manual optimization: the module accumulates gradients itself")
    if "batch_size" not in (facts.get("datamodule_args") or []):
        return NotApplicable("micro_batch", f"{short(_data_class(facts))} takes no batch_size argument")
    batch = (facts.get("loader") or {}).get("batch_size")
    if not isinstance(batch, int) or batch < 4 or batch % 2:
        return NotApplicable("micro_batch", f"batch size {batch} cannot be halved evenly")
    accumulate = int(facts.get("accumulate_grad_batches") or 1)
    note = (
        " (BatchNorm statistics over the smaller batch)"
        if any("BatchNorm" in n for n in facts.get("norms") or [])
        else ""
    )
    # half the micro-batch with twice the accumulation; with accumulation, twice the micro-batch with half of it
    # (fewer, larger steps where memory allows: `--device-memory` leaves out what is predicted not to fit)
    values = [batch // 2] + ([batch * 2] if accumulate % 2 == 0 else [])
    return Knob(
        "micro_batch",
        values,
        _micro_batch_edit(_data_class(facts), batch, accumulate),
        lambda v: f"micro-batch {v} x {accumulate * batch // v} accumulated (same global batch {batch * accumulate})",
        changes_results=f"the same global batch in other micro-batches{note}" if note else "",
    )


def _ddp(facts: Facts, machine: Machine) -> list[Knob | NotApplicable]:
    if not facts.get("ddp") or int(facts.get("world_size") or 1) < 2:
        reason = (
            "one process: no gradient all-reduce to tune"
            if int(facts.get("world_size") or 1) < 2
            else (f"{short(str(facts.get('strategy')))} is not a DDP strategy")
        )
        return [NotApplicable(name, reason) for name in ("ddp_buckets", "ddp_static_graph", "ddp_comm_hook")]
    hook = "bf16" if machine.bf16_supported or machine.device == "cpu" else "fp16"
    return [
        Knob(
            "ddp_buckets",
            [100],
            _ddp_edit(bucket_cap_mb=None, gradient_as_bucket_view=True),
            lambda v: f"TunedDDPStrategy bucket_cap_mb={v}, gradient_as_bucket_view",
        ),
        Knob("ddp_static_graph", [True], _ddp_edit(static_graph=None), lambda v: "DDP static_graph"),
        Knob(
            "ddp_comm_hook",
            [hook],
            _ddp_edit(comm_hook=None),
            lambda v: f"{v}-compressed gradient all-reduce",
            changes_results="gradients are averaged in 16 bits",
        ),
    ]


def _compile(facts: Facts, machine: Machine) -> Knob | NotApplicable:
    if facts.get("compiled"):
        return NotApplicable("compile", "the model is compiled already")
    return Knob(
        "compile",
        [True],
        _callback_edit("lit_compute.speedup.CompileModules"),
        lambda v: "torch.compile of the submodules (CompileModules)",
        warmup_s=120.0,
    )


#: the order the greedy search visits the knobs: the largest expected gains first; the slow ones to try (DALI's
#: pipeline build, compilation) after the cheap ones, so a spent budget leaves out the slow ones, never the cheap
KNOB_ORDER = (
    "precision",
    "tf32",
    "cudnn_benchmark",
    "channels_last",
    "loader",
    "packing",
    "fused_optimizer",
    "micro_batch",
    "dali",
    "ddp_buckets",
    "ddp_static_graph",
    "ddp_comm_hook",
    "compile",
)


def find_knobs(
    facts: Facts, machine: Machine, only: list[str] | None = None, skip: list[str] | None = None
) -> tuple[list[Knob], list[NotApplicable]]:
    """The knobs that apply to this model (in :data:`KNOB_ORDER`) and the ones that do not, with reasons."""
    found: list[Knob | NotApplicable] = [
        _precision(facts, machine),
        _tf32(facts, machine),
        _cudnn_benchmark(facts, machine),
        _channels_last(facts, machine),
        _dali(facts, machine),
        _workers(facts, machine),
        _packing(facts, machine),
        _fused(facts, machine),
        _micro_batch(facts, machine),
        *_ddp(facts, machine),
        _compile(facts, machine),
    ]
    knobs: list[Knob] = []
    skipped: list[NotApplicable] = []
    for item in found:
        if isinstance(item, Knob) and only is not None and item.name not in only:
            skipped.append(NotApplicable(item.name, "not among --knobs"))
        elif isinstance(item, Knob) and skip and item.name in skip:
            skipped.append(NotApplicable(item.name, "left out by --skip"))
        elif isinstance(item, Knob):
            knobs.append(item)
        else:
            skipped.append(item)
    knobs.sort(key=lambda k: KNOB_ORDER.index(k.name))
    return knobs, skipped


def apply_settings(config: dict[str, Any], knobs: list[Knob], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each knob of ``settings`` set (in knob order, so later edits see earlier ones)."""
    out = copy.deepcopy(config)
    for knob in knobs:
        if knob.name in settings:
            knob.edit(out, settings[knob.name])
    return out


def describe(knobs: list[Knob], settings: Mapping[str, Any]) -> str:
    parts = [k.describe(settings[k.name]) for k in knobs if k.name in settings]
    return " + ".join(parts) if parts else "baseline (your config)"

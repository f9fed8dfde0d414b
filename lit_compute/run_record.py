"""One typed record of a run: what it ran on and how, written once as JSON beside its event files (``run.json``)
and read back by ``lit-compute report``, ``whatif`` and the tune. The run-info table in TensorBoard (text
``lit_compute/run``) is this record rendered for people; no reader parses it, except :func:`from_legacy` for runs
written by lit_compute 0.3.0, which had only the table.

The writer creates the record at a run's first logging event (:func:`lit_compute.writer.run_record`) and writes it
again when FlopsLogger adds a counted op-class table (the micro-batch's: the largest batch counted). Pure data: no
Lightning here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lit_compute.files import write_whole
from lit_compute.formatting import markdown_table, read_key_value_table

__all__ = ["RECORD_FILE", "RunRecord", "from_legacy", "legacy_op_classes", "read_record", "write_record"]

#: the record's file name in the run's TensorBoard folder
RECORD_FILE = "run.json"
_FORMAT = 1
_OP_CLASSES_MARK = "<!-- lit_compute op classes: "


@dataclass
class RunRecord:
    """What a run ran on and how (per device unless said otherwise).

    Attributes:
        precision: Lightning's precision string (``bf16-mixed``).
        precision_plugin: The precision plugin's class name.
        device: The device as torch names it (``NVIDIA H200``), or ``cpu``.
        chip: The device's key in the hardware table (``h200-sxm``); None for a CPU or a device the table lacks.
        cpu: The CPU's model name (what a CPU run's peak was measured on).
        nodes, devices_per_node, world_size: The job's shape.
        data_parallel, tensor_parallel: The replicas and the tensor-parallel peers sharing a batch.
        strategy: The strategy's class name; data: the datamodule's class name or ``dataloaders``.
        cpu_cores, torch_threads: The cores each process could run on, and its compute threads.
        loader_workers: The training loader's worker processes (None: unknown).
        torch, lightning: Versions.
        planned_steps, planned_epochs: What the run set out to train (``max_steps`` or ``max_epochs``).
        cudnn_allow_tf32, float32_matmul_precision, matmul_tf32: torch's float32 switches when the run started
            (``torch.backends.cudnn.allow_tf32``, ``torch.get_float32_matmul_precision()``, and whether matmuls may
            run on TF32); None: a run recorded before they were kept.
        compiled: Whether the LightningModule ran ``torch.compile``d (None: not recorded).
        op_classes: The micro-batch's counted op-class table (FlopsLogger): ``by_class`` (op class -> hardware FLOPs,
            bytes, kernels per batch), ``samples``, ``model_flops``, parameters, precision, accumulation and the
            communication facts (``ddp_bucket_cap_mb``, ``fsdp_units``).
    """

    precision: str = "32-true"
    precision_plugin: str = ""
    device: str = "cpu"
    chip: str | None = None
    cpu: str | None = None
    nodes: int = 1
    devices_per_node: int = 1
    world_size: int = 1
    data_parallel: int = 1
    tensor_parallel: int = 1
    strategy: str = ""
    data: str = ""
    cpu_cores: int | None = None
    torch_threads: int | None = None
    loader_workers: int | None = None
    torch: str = ""
    lightning: str = ""
    planned_steps: int | None = None
    planned_epochs: int | None = None
    cudnn_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    matmul_tf32: bool | None = None
    compiled: bool | None = None
    op_classes: dict[str, Any] | None = None
    format: int = _FORMAT
    extras: dict[str, Any] = field(default_factory=dict)  # fields of a newer format, kept as read

    @property
    def on_gpu(self) -> bool:
        return self.device.lower() != "cpu"

    def planned(self) -> str:
        """What the run set out to train, in words (``64 steps``, ``2 epochs``, ``n/a``)."""
        if self.planned_steps:
            return f"{self.planned_steps} steps"
        return f"{self.planned_epochs} epochs" if self.planned_epochs is not None else "n/a"

    def layout(self) -> str:
        return f"data parallel {self.data_parallel} x tensor parallel {self.tensor_parallel}"

    def table(self) -> str:
        """The record for people: the run-info table TensorBoard shows as text ``lit_compute/run``."""
        device = self.device if not self.chip else f"{self.device} ({self.chip})"
        rows = [
            ("precision", self.precision),
            ("precision plugin", self.precision_plugin),
            ("device", device),
            ("world size", self.world_size),
            ("nodes x devices", f"{self.nodes} x {self.devices_per_node}"),
            ("parallel layout", self.layout()),
            ("strategy", self.strategy),
            ("data", self.data),
            ("cpu cores", _text(self.cpu_cores)),
            ("torch", self.torch),
            ("lightning", self.lightning),
            ("planned", self.planned()),
            ("loader workers", _text(self.loader_workers)),
            ("torch threads", _text(self.torch_threads)),
        ]
        if self.cudnn_allow_tf32 is not None and self.matmul_tf32 is not None:
            rows.append(
                (
                    "float32 switches",
                    f"cudnn.allow_tf32 {self.cudnn_allow_tf32}, matmul precision "
                    f"{self.float32_matmul_precision!r} (TF32 matmuls: {self.matmul_tf32})",
                )
            )
        if self.compiled is not None:
            rows.append(("compiled", "yes" if self.compiled else "no"))
        return markdown_table(["key", "value"], [[k, v] for k, v in rows])

    def with_op_classes(self, table: dict[str, Any]) -> bool:
        """Keep ``table`` when it is the micro-batch's: the largest batch counted (an epoch's last, partial batch is
        counted too when its shape is new; of equal ones, the latest). Returns whether the record changed."""
        samples = _whole(table.get("samples"))
        if not table.get("by_class") or not samples:
            return False
        held = _whole((self.op_classes or {}).get("samples")) or 0
        if samples < held or table == self.op_classes:
            return False
        self.op_classes = table
        return True

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(data.pop("extras"))
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """A record from its JSON; unknown keys (a newer format) are kept in ``extras``, missing ones take the
        defaults."""
        known = {f.name for f in fields(cls)} - {"extras"}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.extras = {k: v for k, v in data.items() if k not in known}
        return record


def _text(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _whole(value: Any) -> int | None:
    """An int from a JSON value or a table cell (``"8"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def write_record(folder: str | Path, record: RunRecord) -> None:
    """Write ``record`` whole (or not at all) as ``run.json`` in ``folder``; an ``OSError`` propagates."""
    write_whole(Path(folder) / RECORD_FILE, json.dumps(record.as_json(), indent=1, sort_keys=True))


def read_record(folder: str | Path) -> RunRecord | None:
    """The record in ``folder`` (None when there is none or it is not a record)."""
    try:
        data = json.loads((Path(folder) / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return RunRecord.from_json(data) if isinstance(data, dict) else None


# -- runs written by lit_compute 0.3.0: the Markdown table and the op-class text only --------------------------------
def _pair(text: str, sep: str) -> tuple[int, int] | None:
    """``"2 x 1"`` -> (2, 1) (the old table's "nodes x devices"), with ``sep`` between two whole numbers."""
    left, found, right = text.partition(sep)
    a, b = _whole(left), _whole(right)
    return (a, b) if found and a is not None and b is not None else None


def legacy_op_classes(text: str) -> dict[str, Any] | None:
    """The figures an 0.3.0 op-class text carried as JSON in an HTML comment (None when it holds none)."""
    start = text.find(_OP_CLASSES_MARK)
    end = text.find(" -->", start)
    if start < 0 or end < 0:
        return None
    try:
        data = json.loads(text[start + len(_OP_CLASSES_MARK) : end])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def from_legacy(tables: list[str], op_class_texts: list[str]) -> RunRecord | None:
    """The record of a run written by lit_compute 0.3.0, from its run-info tables (text ``lit_compute/run``) and its
    op-class texts (``compute/op_classes``); None when it has neither."""
    info: dict[str, str] = {}
    for text in tables:
        for key, value in read_key_value_table(text).items():
            info.setdefault(key, value)
    record = RunRecord()
    for text in op_class_texts:
        table = legacy_op_classes(text)
        if table:
            record.with_op_classes(table)
    if not info and record.op_classes is None:
        return None
    layout = info.get("parallel layout", "").removeprefix("data parallel ")
    dp_tp = _pair(layout, " x tensor parallel ")
    nodes = _pair(info.get("nodes x devices", ""), " x ")
    planned = info.get("planned", "")
    number, _, unit = planned.partition(" ")
    record.precision = info.get("precision") or str((record.op_classes or {}).get("precision") or "32-true")
    record.precision_plugin = info.get("precision plugin", "")
    record.device = info.get("device") or "cpu"
    record.world_size = _whole(info.get("world size")) or 1
    record.nodes, record.devices_per_node = nodes or (1, record.world_size)
    record.data_parallel, record.tensor_parallel = dp_tp or (record.world_size, 1)
    record.strategy, record.data = info.get("strategy", ""), info.get("data", "")
    record.cpu_cores, record.torch_threads = _whole(info.get("cpu cores")), _whole(info.get("torch threads"))
    record.loader_workers = _whole(info.get("loader workers"))
    record.torch, record.lightning = info.get("torch", ""), info.get("lightning", "")
    record.planned_steps = _whole(number) if unit == "steps" else None
    record.planned_epochs = _whole(number) if unit == "epochs" else None
    record.format = 0
    return record

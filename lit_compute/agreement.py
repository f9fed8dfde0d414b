"""What every rank of a job must agree on, checked once at set-up, so a job whose nodes were started with different
settings stops with one line naming the setting instead of hanging.

Every lit_compute logging event is one all-reduce whose layout each rank decides from its own configuration (its
``log_every_n_steps``, its measuring callbacks); every rank's number of steps comes from its own ``max_steps``,
limits and batch size. Two nodes started with files that differ in any of these call different collectives (or
one calls none) and wait for each other forever, or die later with a transport error that names nothing. So at
set-up - the one point besides the logging event where lit_compute calls a collective - every rank contributes a
digest of those settings (:func:`settings`) to **one** all-reduce (the maximum of ``[digest, -digest]``: equal
everywhere when all digests are equal). Only when they differ are the settings themselves gathered, and every rank
raises the same :class:`ConfigMismatchError`::

    log_every_n_steps: 2 on node 0 rank 0, 3 on node 1 rank 1

What is compared: the trainer's loop settings (logging interval, step, epoch and batch limits, accumulation,
validation schedule, precision, nodes and devices), the strategy's class (and its own ``agreement_settings()`` when
it has one), each measuring callback in order with its event layout and constructor arguments, the datamodule's
and the model's hyperparameters, and the whole resolved config of ``lit-compute fit`` (:func:`register_config`).
Settings that name something local to a machine (keys ending in ``dir``, ``path``, ``file``, ``root``, ``port``,
``host``) and ``seed_everything`` (LightningCLI draws one per process) are left out.

Limit: a rank that runs no lit_compute measuring callback at all takes no part in the check; the other ranks then
wait in the all-reduce until the process group's timeout.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["ConfigMismatchError", "check", "describe_mismatch", "register_config", "settings"]

TRAINER_SETTINGS = (
    "log_every_n_steps",
    "max_steps",
    "max_epochs",
    "min_steps",
    "min_epochs",
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "limit_predict_batches",
    "val_check_interval",
    "check_val_every_n_epoch",
    "accumulate_grad_batches",
    "num_sanity_val_steps",
    "precision",
    "num_nodes",
    "num_devices",
    "world_size",
)
_LOCAL = re.compile(r"(dir|dirs|path|paths|file|files|root|port|host|addr|address|seed_everything)$", re.I)
_CONFIGS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


class ConfigMismatchError(RuntimeError):
    """The ranks of one job were started with settings that must be equal (the message names the first one and
    each rank's value)."""


_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")


def _text(value: Any) -> str:
    """JSON text of a value; objects by their repr, without the memory address that differs between processes."""
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return _ADDRESS.sub("", text)


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested mapping (a resolved config, hyperparameters) as ``{"dotted.key": "json text"}``, local keys left out."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping) or hasattr(value, "items") and callable(value.items):
        for key, item in value.items():
            if _LOCAL.search(str(key)) or str(key).startswith("_"):
                continue
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) or hasattr(v, "items") for v in value):
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    out[prefix] = _text(value)
    return out


def register_config(trainer: pl.Trainer, config: Any) -> None:
    """Compare ``config`` (``lit-compute fit``'s resolved configuration) between ranks too."""
    _CONFIGS[trainer] = flatten(config)


def _arguments(component: Any) -> dict[str, Any]:
    """A component's constructor arguments as it holds them (the constructor is the configuration)."""
    try:
        names = [n for n in inspect.signature(type(component).__init__).parameters if n not in ("self", "kwargs")]
    except (TypeError, ValueError):
        return {}
    return {n: getattr(component, n) for n in names if hasattr(component, n) and not _LOCAL.search(n)}


def settings(trainer: pl.Trainer, pl_module: Any, participants: Sequence[Any]) -> dict[str, str]:
    """Everything the ranks of one job must agree on (see the module docstring), as ``{name: json text}``."""
    out = {key: _text(getattr(trainer, key, None)) for key in TRAINER_SETTINGS}
    strategy = trainer.strategy
    out["strategy"] = type(strategy).__name__
    extra = getattr(strategy, "agreement_settings", None)
    if callable(extra):
        out.update({f"strategy.{k}": _text(v) for k, v in extra().items()})
    for i, callback in enumerate(participants):
        layout = {"reduce_keys": {k: list(v) for k, v in sorted(callback.reduce_keys.items())}, **_arguments(callback)}
        out[f"callbacks[{i}]"] = type(callback).__name__
        out.update({f"callbacks[{i}] {type(callback).__name__}.{k}": _text(v) for k, v in layout.items()})
    out[f"callbacks[{len(participants)}]"] = "(none)"  # a rank with fewer callbacks differs here
    datamodule = getattr(trainer, "datamodule", None)
    for name, holder in (("data", datamodule), ("model", pl_module)):
        hparams = getattr(holder, "hparams", None)
        if hparams:
            out.update({f"{name}.{k}": v for k, v in flatten(dict(hparams)).items()})
    # a strategy that says what it runs with is compared by its resolved settings: the config's way of writing it
    # (``ddp_tuned`` on one node, a class_path with init_args on the other) is not a difference
    resolved = callable(extra)
    out.update(
        {
            f"config.{k}": v
            for k, v in _CONFIGS.get(trainer, {}).items()
            if not (resolved and k.startswith("trainer.strategy"))
        }
    )
    return out


def digest(values: Mapping[str, str]) -> int:
    """A 62-bit digest of the settings (the same on every rank that has the same settings)."""
    text = json.dumps(sorted(values.items()))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 2


def _where(entry: Mapping[str, Any]) -> str:
    return f"node {entry['node']} rank {entry['rank']}"


def describe_mismatch(entries: Sequence[Mapping[str, Any]], most: int = 3) -> str:
    """One line naming the settings the ranks disagree on (the first ``most``, trainer settings first) and each
    distinct value with where it is (``log_every_n_steps: 2 on node 0 rank 0, 3 on node 1 rank 1``). ``entries``:
    per rank, ``node``, ``rank`` and ``settings``."""
    keys = sorted({k for e in entries for k in e["settings"]}, key=_order)
    found = []
    for key in keys:
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for entry in entries:
            groups.setdefault(entry["settings"].get(key, "(not set)"), []).append(entry)
        if len(groups) < 2:
            continue
        parts = []
        for value, members in sorted(groups.items(), key=lambda g: g[1][0]["rank"]):
            others = f" (and {len(members) - 1} other ranks)" if len(members) > 1 else ""
            parts.append(f"{_shown(value)} on {_where(members[0])}{others}")
        found.append(f"{key}: {', '.join(parts)}")
    if not found:
        return "the ranks of this job were started with different settings"
    more = f"; and {len(found) - most} more" if len(found) > most else ""
    return (
        f"the ranks of this job were started with different settings: {'; '.join(found[:most])}{more}. Start every "
        "node with the same config (lit_compute checks this once at set-up; different settings would make the "
        "ranks wait for each other forever)"
    )


def _shown(value: str) -> str:
    try:
        loaded = json.loads(value)
    except ValueError:
        return value
    return loaded if isinstance(loaded, str) else value


def _order(key: str) -> tuple[int, str]:
    """Trainer settings first (the usual culprits, in their listed order), then the strategy's resolved settings
    (its class, then each setting: ``strategy.comm_hook``), then the rest alphabetically."""
    if key in TRAINER_SETTINGS:
        return TRAINER_SETTINGS.index(key), ""
    if key == "strategy" or key.startswith("strategy."):
        return len(TRAINER_SETTINGS), key
    return len(TRAINER_SETTINGS) + 1, key


def check(trainer: pl.Trainer, values: Mapping[str, str]) -> None:
    """One all-reduce of the settings' digest on every rank; on a mismatch the settings are gathered and every
    rank raises the same :class:`ConfigMismatchError`. Nothing happens on one process."""
    if trainer.world_size <= 1 or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    import torch.distributed as dist

    value = digest(values)
    both = torch.tensor([value, -value], dtype=torch.int64, device=trainer.strategy.root_device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if int(both[0]) == -int(both[1]):
        return
    entries: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, {"node": trainer.node_rank, "rank": trainer.global_rank, "settings": dict(values)})
    raise ConfigMismatchError(describe_mismatch(entries))

"""What a batch holds, read the way Lightning reads batches: tensors inside mappings, sequences, namedtuples,
dataclasses and plain objects holding tensors; the batch size; the tokens of a language-model batch.

This module only reads batches: it knows nothing of trainers, timelines or callbacks."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities.data import extract_batch_size

from lit_compute._validate import check_dataclass

_MAX_DEPTH = 8
_MAX_LEAVES = 4096


def tensor_leaves(batch: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in ``batch``, in a deterministic order.

    Follows what Lightning's batch utilities follow (``apply_to_collection``: mappings, sequences, namedtuples,
    dataclasses) and, beyond them, the attributes of plain objects holding tensors, so a change of shape
    anywhere in a custom batch is seen. Stops at depth 8 and after 4096 tensors."""
    count = 0
    stack: list[tuple[str, Any, int]] = [("", batch, 0)]
    seen: set[int] = set()
    while stack:
        path, obj, depth = stack.pop()
        if isinstance(obj, torch.Tensor):
            yield path, obj
            count += 1
            if count >= _MAX_LEAVES:
                return
            continue
        if depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)):
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        children = _children(obj)
        # reversed: the stack pops the first child first
        stack.extend((f"{path}.{name}" if path else str(name), child, depth + 1) for name, child in reversed(children))


def _children(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        try:
            keys = sorted(obj, key=str)
        except TypeError:
            keys = list(obj)
        return [(str(k), obj[k]) for k in keys]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if isinstance(obj, (Sequence, set, frozenset)):
        items = list(obj) if not isinstance(obj, (set, frozenset)) else sorted(obj, key=repr)
        return [(str(i), item) for i, item in enumerate(items)]
    if isinstance(obj, (torch.nn.Module, type)) or callable(obj):
        return []
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return [(k, attrs[k]) for k in sorted(attrs) if not k.startswith("__")]
    return []


def signature(stage: str, batch: Any) -> tuple:
    """Shapes and dtypes of every tensor in the batch, with their paths, and the stage."""
    return (
        stage,
        tuple((path, tuple(t.shape), str(t.dtype).replace("torch.", "")) for path, t in tensor_leaves(batch)),
    )


def batch_size(batch: Any) -> int | None:
    """The batch size as Lightning infers it (its first tensor's first dimension), or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # Lightning warns about ambiguous collections; a measurement needs no warning
            return int(extract_batch_size(batch))
    except Exception:  # noqa: BLE001 - dataclasses and custom objects: Lightning does not look inside them
        pass
    for _, tensor in tensor_leaves(batch):
        if tensor.dim() >= 1:
            return int(tensor.shape[0])
    return None


@dataclass(frozen=True)
class TokenSpec:
    """Where a batch's tokens are, for lit_compute's token metrics (``time/tokens_per_sec``,
    ``compute/padding_fraction``).

    Args:
        key: The batch entry (mapping key or attribute) holding token ids ``(B, T)``.
        mask_key: The entry holding the padding mask (1 = real token, 0 = padding), or None.
        pad_id: The padding token id, used where the batch has no mask (None: no padding).

    The default finds Hugging Face style batches (``input_ids``/``attention_mask``); a datamodule with a
    ``pad_token_id`` attribute (:class:`~lit_compute.data.TokenDataModule`) supplies ``pad_id``.
    """

    key: str = "input_ids"
    mask_key: str | None = "attention_mask"
    pad_id: int | None = None

    def __post_init__(self) -> None:
        check_dataclass(self)


_DEFAULT_SPEC = TokenSpec()


def _field(batch: Any, key: str) -> Any:
    if isinstance(batch, Mapping):
        return batch.get(key)
    return getattr(batch, key, None) if not isinstance(batch, (torch.Tensor, Sequence)) else None


def token_counts(batch: Any, spec: TokenSpec | None = None) -> tuple[int, Any] | None:
    """``(positions computed, non-padding positions or None)`` of a token batch, or None for other batches.

    The non-padding count stays a device tensor (no synchronisation); read it at logging steps."""
    spec = spec or _DEFAULT_SPEC
    ids = _field(batch, spec.key)
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point:
        return None
    mask = _field(batch, spec.mask_key) if spec.mask_key else None
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        return ids.numel(), mask.detach().sum()
    if spec.pad_id is not None:
        return ids.numel(), (ids.detach() != spec.pad_id).sum()
    return ids.numel(), None


@dataclass
class BatchFacts:
    """What a batch holds, read once per batch by the timeline for every consumer."""

    samples: int | None = None
    tokens: int | None = None  # positions computed (``input_ids.numel()``), when the batch has tokens
    real_tokens: Any = None  # non-padding positions: an int, or a device tensor read only at logging steps


def read_batch(batch: Any, spec: TokenSpec | None = None) -> BatchFacts:
    """Samples and tokens of a batch. Tokens: a mapping with ``input_ids`` (positions computed) and, with an
    ``attention_mask``, the non-padding positions (kept on the device until read)."""
    facts = BatchFacts(samples=batch_size(batch))
    counts = token_counts(batch, spec)
    if counts is not None:
        facts.tokens, facts.real_tokens = counts
    return facts

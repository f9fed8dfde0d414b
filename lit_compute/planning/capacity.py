"""The memory a job must fit into: a size (``80GB``, ``24GiB``, ``512MB``) or a chip of the hardware table, by its
key or its device name, as ``lit-compute whatif --hardware`` accepts them."""

from __future__ import annotations

import math
import re

from lit_compute.hardware.chips import HardwareError, find_chip

__all__ = ["CapacityError", "capacity_of", "parse_memory"]


class CapacityError(ValueError):
    """A size that is not one, or a device the table does not know: the message names the option and the fix."""


def parse_memory(text: str | float, option: str = "--memory") -> int:
    """``80GB`` (1e9), ``24GiB`` (2**30), ``512MB``, or bytes, as bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?[bB])?\s*", str(text))
        if not match:
            raise CapacityError(f"{option} {text!r} is not a size; write it as 80GB, 24GiB or 512MB")
        number, unit = float(match.group(1)), (match.group(2) or "B").lower()
        scale = {
            "b": 1,
            "kb": 1e3,
            "mb": 1e6,
            "gb": 1e9,
            "tb": 1e12,
            "kib": 2**10,
            "mib": 2**20,
            "gib": 2**30,
            "tib": 2**40,
        }[unit]
        value = number * scale
    if not math.isfinite(value) or value <= 0:
        raise CapacityError(f"{option} {text!r} must be a positive size")
    return int(value)


def capacity_of(device: str | None, memory: str | float | None) -> tuple[int | None, str]:
    """The capacity to fit into and where it came from: ``memory`` when given, else the ``device``'s row of the
    hardware table (a key such as ``h100-sxm`` or a device name such as ``NVIDIA A100-SXM4-40GB``)."""
    if memory is not None:
        return parse_memory(memory), f"--memory {memory}"
    if device is None:
        return None, "no capacity given (--device or --memory)"
    try:
        chip = find_chip(device, option="--device")
    except HardwareError as err:
        raise CapacityError(str(err).replace("(or add it with --hardware-file)", "(or give --memory 80GB)")) from None
    if not math.isfinite(chip.memory):
        raise CapacityError(f"--device {device!r}: the table has no memory for {chip.name}; give --memory 80GB")
    capacity = chip.memory
    return int(capacity), (
        f"{chip.name}: {capacity / 2**30:.0f} GiB = {capacity / 1e9:.1f} GB ({chip.sources.get('memory', chip.source)})"
    )

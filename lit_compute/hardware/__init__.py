"""The hardware room: every chip and link (:mod:`~lit_compute.hardware.chips`), precision strings and the TF32 rules
(:mod:`~lit_compute.hardware.dtypes`), measuring a device (:mod:`~lit_compute.hardware.measure`) and this machine,
measured once and cached (:mod:`~lit_compute.hardware.this_machine`: its ``this_machine()``). Below every component: it
imports nothing of lit_compute but the ground floor."""

from lit_compute.hardware.chips import (
    CHIPS,
    LINKS,
    Chip,
    HardwareError,
    Link,
    find_chip,
    find_link,
    load_hardware_file,
)
from lit_compute.hardware.this_machine import bf16_fast, cached_peak_flops

__all__ = [
    "CHIPS",
    "LINKS",
    "Chip",
    "HardwareError",
    "Link",
    "bf16_fast",
    "cached_peak_flops",
    "find_chip",
    "find_link",
    "load_hardware_file",
]

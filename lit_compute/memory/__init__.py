"""Memory per device: measured every step (:class:`MemoryMonitor`) and predicted before the run
(:func:`estimate`), with what it is made of."""

from lit_compute.memory.memory_monitor import MemoryMonitor
from lit_compute.memory.tracker import PARTS, MemoryBreakdown, StorageTracker

__all__ = ["PARTS", "MemoryBreakdown", "MemoryMonitor", "StorageTracker"]

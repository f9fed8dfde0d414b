"""Callbacks that make a user's own model train faster without touching its code: channels-last weights,
compiled submodules, fused optimizer steps. ``lit-compute tune`` writes them into the configs it tunes."""

from lit_compute.speedup.channels_last import ChannelsLast
from lit_compute.speedup.compile_modules import CompileModules
from lit_compute.speedup.float32_matmul import Float32MatmulPrecision
from lit_compute.speedup.fused_optimizer import FusedOptimizer

__all__ = ["ChannelsLast", "CompileModules", "Float32MatmulPrecision", "FusedOptimizer"]

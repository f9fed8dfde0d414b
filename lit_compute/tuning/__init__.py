"""``lit-compute tune``: the fastest configuration of your own config on your machine, measured and guarded.

:func:`tune` is the Python entry (``lit_compute.tune(...)``); :class:`TrialRecorder` is the callback each trial
runs with.
"""

from lit_compute.tuning.recorder import TrialRecorder
from lit_compute.tuning.tune import TuneError, TuneResult, main, tune

__all__ = ["TrialRecorder", "TuneError", "TuneResult", "main", "tune"]

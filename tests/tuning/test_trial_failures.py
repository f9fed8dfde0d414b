"""How a failed trial's reason reads in the tune's table: the error line when the log has one, and how the process
ended when it has none (a signal, ``os._exit``) beside its last line, never a log line that looks like a reason."""

from __future__ import annotations

import signal

from lit_compute.tuning.trials import _classify_failure


def test_a_trial_killed_by_a_signal_says_so_with_its_last_line():
    assert _classify_failure(-signal.SIGSEGV, "GPU available: False\nSeed set to 0\n") == (
        "crashed",
        "killed by SIGSEGV: Seed set to 0",
    )
    assert _classify_failure(3, "") == ("crashed", "exit status 3")


def test_an_error_line_is_the_reason_and_sigkill_is_read_as_out_of_memory():
    log = "Seed set to 0\nTraceback (most recent call last):\nValueError: bad value for lr\n"
    assert _classify_failure(1, log) == ("crashed", "ValueError: bad value for lr")
    assert _classify_failure(-signal.SIGKILL, "Seed set to 0\n")[0] == "oom"

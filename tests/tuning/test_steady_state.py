"""#51: steady-state trials, no rejection inside the noise, knobs retried when the configuration under them
changes, run-level variance in every interval - the search's pure logic on made-up trials and a driven clock."""

from __future__ import annotations

import math
import random

import pytest

from lit_compute.tuning.knobs import Knob
from lit_compute.tuning.recorder import steady_start
from lit_compute.tuning.search import Budget, Options, Search, paired_ratio, short_verdict
from lit_compute.tuning.trials import TrialResult, TrialSpec


def _knob(name: str, values: list) -> Knob:
    return Knob(name, values, edit=lambda config, value: None, describe=lambda value: f"{name}={value}")


def _result(spec: TrialSpec, rate: float, ci: float) -> TrialResult:
    steps = [rate * (1 + ci * (-1) ** i / 3) for i in range(12)]
    return TrialResult(
        key=spec.key,
        slug=spec.slug(0),
        settings=dict(spec.settings),
        rung=spec.rung,
        repeat=spec.repeat,
        status="ok",
        rate=rate,
        ci=ci,
        measured={"losses": [2.3, 2.2, 2.1], "step_rates": steps, "facts": {}},
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _search(knobs: list[Knob], rate_of, total: float = 2000.0) -> tuple[Search, list[TrialSpec]]:
    clock, ran = Clock(), []

    def measure(spec: TrialSpec, estimate: float, limit: float) -> TrialResult:
        clock.t += 10.0
        ran.append(spec)
        return _result(spec, *rate_of(spec))

    return Search(knobs, measure, Budget(total, clock=clock), Options(short_s=5, long_s=10), lambda spec: 10.0), ran


def test_the_settling_steps_of_a_run_are_found_and_left_out():
    r = random.Random(0)
    warming = [0.30, 0.26, 0.22, 0.18, 0.15, 0.13, 0.12, 0.11] + [0.10 + r.uniform(-0.004, 0.004) for _ in range(30)]
    steady = [0.10 + r.uniform(-0.004, 0.004) for _ in range(38)]
    assert steady_start(warming) == 10
    assert steady_start(steady) == 0
    assert steady_start([0.3, 0.1, 0.1]) == 0  # too few steps to tell: none dropped


def test_a_short_trial_is_faster_slower_beyond_the_noise_or_unclear():
    incumbent = _result(TrialSpec({}, "long", 0), 20.0, 0.02)
    options = Options()
    assert short_verdict(_result(TrialSpec({"k": 1}, "short", 0), 22.0, 0.05), incumbent, options) == ""
    slower = short_verdict(_result(TrialSpec({"k": 1}, "short", 0), 15.0, 0.05), incumbent, options)
    assert slower.startswith("slower beyond the noise: 15 vs 20 samples/s over the same steady-state steps (0.75x")
    unclear = short_verdict(_result(TrialSpec({"k": 1}, "short", 0), 19.6, 0.05), incumbent, options)
    assert unclear.startswith("unclear, measured as a pair: 19.6 vs 20 samples/s")


def test_a_knob_inside_the_noise_is_measured_as_a_pair_and_one_clearly_slower_is_not():
    """bf16's short trial runs 0.98x inside a wide interval (its kernels' one-off preparation): measured as a pair,
    it is 1.5x and accepted; a loader worker's short trial is 0.5x beyond the noise: rejected, never run long."""

    def rate_of(spec: TrialSpec) -> tuple[float, float]:
        if spec.settings.get("loader"):
            return 10.0, 0.02
        if spec.settings.get("precision"):
            return (19.6, 0.06) if spec.rung == "short" else (30.0, 0.01)
        return 20.0, 0.01

    search, ran = _search([_knob("precision", ["bf16-mixed"]), _knob("loader", [1])], rate_of)
    outcome = search.run(_result(TrialSpec({}, "long", 0), 20.0, 0.01))
    assert outcome.settings == {"precision": "bf16-mixed"}
    short = {v.knob: v.reason for v in outcome.verdicts if v.result.rung == "short"}
    assert short["precision"].startswith("unclear, measured as a pair: ")
    assert short["loader"].startswith("slower beyond the noise: ")
    assert not [s for s in ran if s.rung == "long" and "loader" in s.settings]


def test_a_knob_not_taken_is_tried_again_once_the_configuration_under_it_changed():
    """channels-last alone is 0.9x (rejected); bf16 is then accepted; with bf16 on, channels-last is 1.1x: tried
    again on the new configuration and accepted (two interacting knobs, both found)."""

    def rate_of(spec: TrialSpec) -> tuple[float, float]:
        rate = 20.0
        if spec.settings.get("precision"):
            rate *= 1.5
        if spec.settings.get("channels_last"):
            rate *= 1.1 if spec.settings.get("precision") else 0.9
        return rate, 0.005

    search, ran = _search([_knob("channels_last", [True]), _knob("precision", ["bf16-mixed"])], rate_of)
    outcome = search.run(_result(TrialSpec({}, "long", 0), 20.0, 0.005))
    assert outcome.settings == {"precision": "bf16-mixed", "channels_last": True}
    tried = [(s.rung, dict(s.settings)) for s in ran if "channels_last" in s.settings and s.rung == "short"]
    assert tried == [("short", {"channels_last": True}), ("short", {"precision": "bf16-mixed", "channels_last": True})]
    off = Options(short_s=5, long_s=10, retry=False)
    search, _ = _search([_knob("channels_last", [True]), _knob("precision", ["bf16-mixed"])], rate_of)
    search.options = off
    assert search.run(_result(TrialSpec({}, "long", 0), 20.0, 0.005)).settings == {"precision": "bf16-mixed"}


def test_every_interval_carries_the_spread_between_runs():
    """Steps within a run do not show how much two runs of one configuration differ: one pair whose steps agree
    exactly still gets an interval as wide as two runs' spread, and the tune measures that spread itself."""
    a = _result(TrialSpec({"k": 1}, "long", 0), 22.0, 0.0)
    b = _result(TrialSpec({}, "pair", 0), 20.0, 0.0)
    a.measured["step_rates"] = [22.0] * 10
    b.measured["step_rates"] = [20.0] * 10
    tight, honest = paired_ratio([(a, b)]), paired_ratio([(a, b)], run_noise=0.05)
    assert tight.low == pytest.approx(1.1)
    assert tight.high == pytest.approx(1.1)
    half = 1.96 * math.sqrt(2 * 0.05**2)
    assert honest.low == pytest.approx(1.1 * math.exp(-half))
    assert honest.high == pytest.approx(1.1 * math.exp(half))
    rates = iter([20.0, 22.0])
    search, _ = _search([], lambda spec: (next(rates), 0.0))
    assert search.run_noise() == Options().run_noise  # nothing run twice yet: the prior
    for repeat in (0, 1):  # the same configuration run long twice: 20 and 22 samples/s
        search._measured(TrialSpec({}, "pair", repeat, 10.0), 10.0, 100.0)
    assert search.run_noise() == pytest.approx(math.log(22 / 20) / math.sqrt(2))

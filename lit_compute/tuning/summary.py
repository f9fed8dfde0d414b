"""What a tune prints and writes: the table of trials, the tuned YAML with a comment per changed line, and the
final line that turns the measured speed-up into time and device-hours."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Mapping
from typing import Any

from lit_compute.formatting import markdown_table
from lit_compute.tuning.config_yaml import ConfigPath, dump_yaml, paths_differing
from lit_compute.tuning.knobs import Knob, NotApplicable, apply_settings
from lit_compute.tuning.search import Outcome, Verdict, rate_text
from lit_compute.tuning.trials import TrialResult


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _rate(result: TrialResult) -> str:
    if result.rate is None:
        return "n/a"
    ci = f" +-{100 * result.ci:.1f}%" if result.ci is not None else ""
    return f"{rate_text(result.rate)}{ci}"


def mfu(result: TrialResult, peaks: Mapping[str, float], precision: str,
        flops_by_shape: Mapping[Any, float] | None = None) -> float | None:
    """Model FLOPs utilisation: counted FLOPs per sample x samples/s over the measured peak in the trial's
    dtype (None without a FLOP count or a peak). A trial too short for FlopsLogger's first logging step takes the
    count of another trial with the same batch shapes (``flops_by_shape``)."""
    flops = result.measured.get("flops_per_sample") or (flops_by_shape or {}).get(_shape_key(result))
    samples = result.measured.get("samples_per_sec")
    dtype = "bfloat16" if precision.startswith("bf16") else "float16" if precision.startswith("16") else "float32"
    peak = peaks.get(dtype)
    if not flops or not samples or not peak:
        return None
    return flops * samples / peak


def _shape_key(result: TrialResult) -> Any:
    """The knobs that change what one sample is (packed rows, DALI's crops); the rest keep FLOPs per sample."""
    return tuple((k, result.settings.get(k)) for k in ("packing", "dali"))


def trial_precision(result: TrialResult, baseline: TrialResult) -> str:
    return str(result.settings.get("precision") or baseline.measured.get("facts", {}).get("precision", "32-true"))


def table(outcome: Outcome, knobs: list[Knob], peaks: Mapping[str, float]) -> str:
    """Every trial: configuration, rung, throughput with its interval, MFU, data wait, peak memory, the ratio to
    the baseline, and the verdict (accepted, rejected and why)."""
    base = outcome.baseline
    unit = base.unit
    by_knob = {k.name: k for k in knobs}
    rows: list[list[Any]] = []
    trials = [base, *(v.result for v in outcome.verdicts), *outcome.final_baseline, *outcome.final_tuned]
    flops_by_shape = {_shape_key(r): r.measured["flops_per_sample"] for r in trials if r.measured.get("flops_per_sample")}

    def row(result: TrialResult, verdict: str, knob: str | None) -> None:
        ratio = f"{result.rate / base.rate:.2f}x" if result.rate and base.rate else "n/a"
        if knob is None:  # the baseline and the side-by-side rows name the whole configuration
            name = "baseline (your config)" if not result.settings else "tuned: " + ", ".join(
                f"{k}={v}" for k, v in result.settings.items())
        else:  # a search row names the knob it adds to the configuration accepted so far
            name = "+ " + by_knob[knob].describe(result.settings[knob])
            if verdict.startswith("accepted") and by_knob[knob].changes_results:
                verdict += f" (changes results by design: {by_knob[knob].changes_results})"
        memory = result.measured.get("peak_memory_gb")
        rows.append([result.slug.split("_", 1)[0], name, result.rung, _rate(result),
                     _pct(mfu(result, peaks, trial_precision(result, base), flops_by_shape)), _pct(result.measured.get("data_wait")),
                     f"{memory:.2f} GB" if memory else "n/a", ratio, verdict])

    row(base, "baseline", None)
    for verdict in outcome.verdicts:
        row(verdict.result, _verdict_text(verdict), verdict.knob)
    for base_run, tuned_run in zip(outcome.final_baseline, outcome.final_tuned):
        row(base_run, "side by side: baseline", None)
        row(tuned_run, "side by side: tuned", None)
    header = ["trial", "configuration", "rung", f"{unit} per device (95% CI)", "MFU", "data wait", "peak memory",
              "vs baseline", "verdict"]
    return markdown_table(header, rows)


def _verdict_text(verdict: Verdict) -> str:
    if verdict.accepted:
        return verdict.reason
    return f"rejected: {verdict.reason}" if verdict.reason else "promising"


def not_applied(skipped: list[NotApplicable], outcome: Outcome) -> list[str]:
    lines = [f"- {item.name}: {item.reason}" for item in skipped]
    lines += [f"- {name}: not tried: {why}" for name, why in outcome.not_tried]
    return lines


def _gains(outcome: Outcome) -> dict[str, Verdict]:
    return {v.knob: v for v in outcome.verdicts if v.accepted}


def tuned_yaml(config: dict[str, Any], knobs: list[Knob], outcome: Outcome, source: str,
               skipped: list[NotApplicable], final: str) -> str:
    """The user's config with the accepted knobs applied, a comment on each line a knob changed saying what it
    bought, and a header naming the source, the date and the measured speed-up."""
    comments: dict[ConfigPath, str] = {}
    tuned = dict(config)
    gains = _gains(outcome)
    settings: dict[str, Any] = {}
    for knob in knobs:
        if knob.name not in outcome.settings:
            continue
        settings[knob.name] = outcome.settings[knob.name]
        after = apply_settings(config, knobs, settings)
        verdict = gains.get(knob.name)
        bought = verdict.reason.removeprefix("accepted: ") if verdict else ""
        for path in paths_differing(tuned, after):
            comments[path] = f"tune: {knob.describe(settings[knob.name])}: {bought}"
        tuned = after
    date = datetime.date.today().isoformat()
    header = [f"Tuned by `lit-compute tune --config {source}` on {date}.", final, "",
              "Changed lines end in a `# tune:` comment saying what each bought (throughput ratio to the configuration",
              "before it). Knobs left as they were:"]
    header += [f"  {line[2:]}" for line in not_applied(skipped, outcome)] or ["  (none)"]
    rejected = [v for v in outcome.verdicts if not v.accepted and v.reason]
    header += ["Tried and rejected:"] + ([f"  {v.knob}={v.result.settings.get(v.knob)} ({v.result.rung}): {v.reason}"
                                          for v in rejected] or ["  (none)"])
    return dump_yaml(tuned, comments, header=header)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:,.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:,.3g} min"
    return f"{seconds:,.3g} s"


def final_line(outcome: Outcome) -> str:
    """The measured speed-up and what it means: time and device-hours per epoch and per million samples or tokens,
    at the baseline's and the tuned throughput."""
    base_runs = [r for r in outcome.final_baseline if r.ok] or [outcome.baseline]
    tuned_runs = [r for r in outcome.final_tuned if r.ok]
    unit = outcome.baseline.unit
    facts = outcome.baseline.measured.get("facts", {})
    devices = int(facts.get("world_size") or 1)
    base_rate = statistics.fmean(r.rate or 0.0 for r in base_runs)
    if not tuned_runs:
        return (f"No faster configuration found: the baseline's {rate_text(base_rate)} {unit} per device stands "
                f"({devices} device(s)); the table says what each knob did.")
    tuned_rate = statistics.fmean(r.rate or 0.0 for r in tuned_runs)
    what = "tokens" if unit == "tokens/s" else "samples"
    per_batch = outcome.baseline.measured.get("tokens_per_batch" if what == "tokens" else "samples_per_batch")
    batches = facts.get("num_training_batches")
    lines = [f"Tuned: {tuned_rate / base_rate:.2f}x {unit} measured side by side ({len(tuned_runs)} run(s) each, "
             f"alternating): baseline {rate_text(base_rate)}, tuned {rate_text(tuned_rate)} {unit} per device, {devices} device(s)."]
    parts = []
    if per_batch and batches:
        epoch = float(per_batch) * int(batches) * devices
        parts.append(f"an epoch ({epoch:,.0f} {what}) takes {_duration(epoch / (base_rate * devices))} -> "
                     f"{_duration(epoch / (tuned_rate * devices))}")
    million_base, million_tuned = 1e6 / (base_rate * devices), 1e6 / (tuned_rate * devices)
    parts.append(f"a million {what} {_duration(million_base)} -> {_duration(million_tuned)} "
                 f"({million_base * devices / 3600:,.3g} -> {million_tuned * devices / 3600:,.3g} device-hours)")
    return lines[0] + " " + "; ".join(parts).capitalize() + "."

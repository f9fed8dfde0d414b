"""What a tune prints and writes: the table of trials, the tuned YAML with a comment per changed line, and the
final line that turns the measured speed-up into time and device-hours."""

from __future__ import annotations

import datetime
import itertools
import statistics
from collections.abc import Mapping
from typing import Any

from lit_compute.formatting import markdown_table
from lit_compute.tuning.config_yaml import ConfigPath, dump_yaml, paths_differing, user_comments
from lit_compute.tuning.knobs import Knob, NotApplicable, apply_settings
from lit_compute.tuning.search import UNCLEAR, Options, Outcome, Verdict, paired_ratio, rate_text
from lit_compute.tuning.trials import TrialResult


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _rate(result: TrialResult) -> str:
    if result.rate is None:
        return "n/a"
    ci = f" +-{100 * result.ci:.1f}%" if result.ci is not None else ""
    return f"{rate_text(result.rate)}{ci}"


def mfu(
    result: TrialResult, peaks: Mapping[str, float], precision: str, flops_by_shape: Mapping[Any, float] | None = None
) -> float | None:
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
    flops_by_shape = {_shape_key(r): float(f) for r in trials if (f := r.measured.get("flops_per_sample"))}

    def row(result: TrialResult, verdict: str, knob: str | None, whole: str = "tuned: ") -> None:
        ratio = f"{result.rate / base.rate:.2f}x" if result.rate and base.rate else "n/a"
        if knob is None:  # the baseline and the side-by-side rows name the whole configuration
            name = (
                "baseline (your config)"
                if not result.settings
                else whole + ", ".join(f"{k}={v}" for k, v in result.settings.items())
            )
        else:  # a search row names the knob it adds to the configuration accepted so far
            name = "+ " + by_knob[knob].describe(result.settings[knob])
            if verdict.startswith("accepted") and by_knob[knob].changes_results:
                verdict += f" (changes results by design: {by_knob[knob].changes_results})"
        memory = result.measured.get("peak_memory_gb")
        others = result.measured.get("other_cores")
        rows.append(
            [
                result.slug.split("_", 1)[0],
                name,
                result.rung,
                _rate(result),
                _pct(mfu(result, peaks, trial_precision(result, base), flops_by_shape)),
                _pct(result.measured.get("data_wait")),
                f"{memory:.2f} GB" if memory else "n/a",
                "n/a" if others is None else f"{others:.2f}",
                ratio,
                verdict,
            ]
        )

    row(base, "baseline", None)
    for verdict in outcome.verdicts:
        for run in verdict.runs or [verdict.result]:  # a paired verdict: its candidate runs and the runs beside them
            if run is verdict.result:
                row(run, _verdict_text(verdict), verdict.knob)
            elif run.rung == "pair":
                row(run, "beside it: the configuration before it, run again", None, whole="before it: ")
            else:
                row(run, "paired (the verdict is on its last run)", verdict.knob)
    for base_run, tuned_run, *rivals in itertools.zip_longest(
        outcome.final_baseline, outcome.final_tuned, *(r.runs for r in outcome.rivals)
    ):
        if base_run is not None:
            row(base_run, "side by side: baseline", None)
        if tuned_run is not None:
            row(tuned_run, "side by side: tuned", None)
        for rival_run in rivals:
            if rival_run is not None:
                row(rival_run, "side by side: another combination the search measured", None, whole="rival: ")
    header = [
        "trial",
        "configuration",
        "rung",
        f"{unit} per device (95% CI)",
        "MFU",
        "data wait",
        "peak memory",
        "others' CPUs",
        "vs baseline",
        "verdict",
    ]
    return markdown_table(header, rows)


def _verdict_text(verdict: Verdict) -> str:
    """The verdict column: a short trial inside the noise (:data:`~lit_compute.tuning.search.UNCLEAR`) goes on to a
    paired measurement and is not rejected, so it is not printed as a rejection."""
    if verdict.accepted or verdict.reason.startswith(("inconclusive", UNCLEAR)):
        return verdict.reason
    return f"rejected: {verdict.reason}" if verdict.reason else "promising"


def not_applied(skipped: list[NotApplicable], outcome: Outcome) -> list[str]:
    lines = [f"- {item.name}: {item.reason}" for item in skipped]
    lines += [f"- {name}: not tried: {why}" for name, why in outcome.not_tried]
    return lines


def _gains(outcome: Outcome) -> dict[str, Verdict]:
    return {v.knob: v for v in outcome.verdicts if v.accepted}


def tuned_yaml(
    config: dict[str, Any],
    knobs: list[Knob],
    outcome: Outcome,
    source: str,
    skipped: list[NotApplicable],
    final: str,
    source_text: str | None = None,
) -> str:
    """The user's config with the accepted knobs applied, a comment on each line a knob changed saying what it
    bought, and a header naming the source, the date and the measured speed-up. With ``source_text`` (the user's
    file) its comments are kept beside the same settings; on a line a knob changed, the user's comment moves
    above it and the line ends in the tune's."""
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
        if verdict is not None and verdict.result.settings.get(knob.name) == settings[knob.name]:
            bought = verdict.reason.removeprefix("accepted: ")
        else:  # a rival's knob the search did not take: the finals chose it
            bought = outcome.switched
        for path in paths_differing(tuned, after):
            comments[path] = f"tune: {knob.describe(settings[knob.name])}: {bought}"
        tuned = after
    date = datetime.date.today().isoformat()
    header = [
        f"Tuned by `lit-compute tune --config {source}` on {date}.",
        final,
        "",
        "Changed lines end in a `# tune:` comment saying what each bought (throughput ratio to the configuration",
        "before it). Knobs left as they were:",
    ]
    header += _left_and_tried(outcome, skipped, "Tried and rejected:")
    inline, above = user_comments(source_text) if source_text else ({}, {})
    above = {path: list(lines) for path, lines in above.items()}
    for path, text in inline.items():
        if path in comments:
            above.setdefault(path, []).append(text)
        else:
            comments[path] = text
    return dump_yaml(tuned, comments, header=header + [""], above=above)


def _left_and_tried(outcome: Outcome, skipped: list[NotApplicable], tried_title: str) -> list[str]:
    """The header lines of an --out file after "Knobs left as they were:": each knob not applied, and each trial
    that was not accepted, with why."""
    lines = [f"  {line[2:]}" for line in not_applied(skipped, outcome)] or ["  (none)"]
    tried = [v for v in outcome.verdicts if not v.accepted and v.reason]
    return (
        lines
        + [tried_title]
        + ([f"  {v.knob}={v.result.settings.get(v.knob)} ({v.result.rung}): {v.reason}" for v in tried] or ["  (none)"])
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:,.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:,.3g} min"
    return f"{seconds:,.3g} s"


#: Other processes keeping at least this many CPUs busy on average during a timed trial make the machine contended.
CONTENDED_CPUS = 0.25


def _all_runs(outcome: Outcome) -> list[TrialResult]:
    runs = [outcome.baseline]
    for verdict in outcome.verdicts:
        runs += verdict.runs or [verdict.result]
    return runs + outcome.final_baseline + outcome.final_tuned + [r for rival in outcome.rivals for r in rival.runs]


def contention(outcome: Outcome) -> str:
    """A sentence saying how contended the machine was while trials were timed ("" when quiet or unknown)."""
    sampled = [(r, float(v)) for r in _all_runs(outcome) if (v := r.measured.get("other_cores")) is not None]
    if not sampled or max(v for _, v in sampled) < CONTENDED_CPUS:
        return ""
    worst, most = max(sampled, key=lambda item: item[1])
    cpus = worst.measured.get("cpu_count") or "?"
    return (
        f"The machine was contended: other processes kept {statistics.fmean(v for _, v in sampled):.2f} of its "
        f"{cpus} CPUs busy on average while trials were timed (the most, {most:.2f}, during "
        f'{worst.slug.split("_", 1)[0]}); every ratio here carries that noise (column "others\' CPUs").'
    )


def final_line(outcome: Outcome) -> str:
    """:func:`_final_line`, :func:`rivals_line` and, when other processes used the CPUs, :func:`contention`."""
    return " ".join(part for part in (_final_line(outcome), rivals_line(outcome), contention(outcome)) if part)


def rivals_line(outcome: Outcome) -> str:
    """What the other combinations run in the finals measured beside the answer, and whether one replaced it."""
    judged = [r for r in outcome.rivals if r.paired is not None]
    if not judged:
        return ""
    text = (
        "Beside the answer in the finals: "
        + "; ".join(f"{r.name()} {r.paired.text()}" for r in judged if r.paired is not None)
        + "."
    )
    if outcome.switched:
        text += f" The search's answer was replaced: {outcome.switched}."
    return text


def _final_line(outcome: Outcome) -> str:
    """The measured speed-up and what it means: time and device-hours per epoch and per million samples or tokens,
    at the baseline's and the tuned throughput. Side by side only when both sides of the final pairs finished; a
    tuned configuration measured no faster there is not called tuned."""
    base_runs = [r for r in outcome.final_baseline if r.ok]
    tuned_runs = [r for r in outcome.final_tuned if r.ok]
    unit = outcome.baseline.unit
    facts = outcome.baseline.measured.get("facts", {})
    devices = int(facts.get("world_size") or 1)
    side_by_side = bool(base_runs)
    base_rate = statistics.fmean(r.rate or 0.0 for r in base_runs or [outcome.baseline])
    if not tuned_runs:
        tried = (
            ""
            if not outcome.settings
            else (
                " (the accepted knobs' final runs failed: "
                + ", ".join(f"{k}={v}" for k, v in outcome.settings.items())
                + ")"
            )
        )
        return (
            f"No faster configuration found{tried}: the baseline's {rate_text(base_rate)} {unit} per device stands "
            f"({devices} device(s)); the table says what each knob did."
        )
    tuned_rate = statistics.fmean(r.rate or 0.0 for r in tuned_runs)
    pairs = [(t, b) for t, b in zip(outcome.final_tuned, outcome.final_baseline) if t.ok and b.ok]
    noise = Options().run_noise if len(pairs) < 2 else None  # one pair: the tune's prior; from two, their spread
    paired = paired_ratio(pairs, noise, spread_from=2) if pairs else None
    interval = f" (95% interval {paired.low:.2f}-{paired.high:.2f}x over {paired.pairs} pair(s))" if paired else ""
    how = (
        f"measured side by side ({len(tuned_runs)} run(s) each, alternating){interval}"
        if side_by_side
        else "against the search's first baseline run (no side-by-side baseline run finished: not side by side)"
    )
    if tuned_rate <= base_rate:
        knobs = ", ".join(f"{k}={v}" for k, v in outcome.settings.items())
        return (
            f"No faster configuration found: the accepted knobs ({knobs}) "
            f"measured {tuned_rate / base_rate:.2f}x {how}; your config stands ({rate_text(base_rate)} {unit} per "
            f"device, {devices} device(s))."
        )
    what = "tokens" if unit == "tokens/s" else "samples"
    measured = outcome.baseline.measured
    per_batch = measured.get("tokens_per_batch") if what == "tokens" else measured.get("samples_per_batch")
    batches = facts.get("num_training_batches")
    lines = [
        f"Tuned: {tuned_rate / base_rate:.2f}x {unit} {how}: baseline {rate_text(base_rate)}, tuned "
        f"{rate_text(tuned_rate)} {unit} per device, {devices} device(s)."
    ]
    parts = []
    epoch = facts.get("epoch_samples") if what == "samples" else None  # the dataset's own size (a last short batch)
    if not epoch and per_batch and batches:
        epoch = float(per_batch) * int(batches)
    if epoch:
        epoch = float(epoch) * devices
        parts.append(
            f"an epoch ({epoch:,.0f} {what}) takes {_duration(epoch / (base_rate * devices))} -> "
            f"{_duration(epoch / (tuned_rate * devices))}"
        )
    million_base, million_tuned = 1e6 / (base_rate * devices), 1e6 / (tuned_rate * devices)
    parts.append(
        f"a million {what} {_duration(million_base)} -> {_duration(million_tuned)} "
        f"({million_base * devices / 3600:,.3g} -> {million_tuned * devices / 3600:,.3g} device-hours)"
    )
    return lines[0] + " " + "; ".join(parts).capitalize() + "."


def tuned_faster(outcome: Outcome) -> bool:
    """Whether the accepted knobs measured faster than the baseline in the final runs (what makes a tuned file)."""
    return bool(outcome.settings) and outcome.speedup is not None and outcome.speedup > 1.0


def untuned_yaml(source_text: str, source: str, final: str, outcome: Outcome, skipped: list[NotApplicable]) -> str:
    """``--out`` when nothing beat the baseline: the user's file as it is (comments and all) under a header saying
    what was tried."""
    date = datetime.date.today().isoformat()
    header = [
        f"lit-compute tune --config {source} on {date}: nothing beat the baseline; this is your config unchanged.",
        final,
        "Knobs left as they were:",
    ]
    header += _left_and_tried(outcome, skipped, "Tried:")
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + "\n" + source_text


_LOWER_IS_BETTER = ("loss", "err", "perplexity", "ppl", "mse", "mae", "nll", "wer", "cer")
_HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "bleu", "iou", "map", "top1", "top5")


def _worse(name: str, rel: float) -> float | None:
    """How much worse a relative change of metric ``name`` is (positive: worse), None when its direction is unknown."""
    lowered = name.lower()
    if any(w in lowered for w in _LOWER_IS_BETTER):
        return rel
    if any(w in lowered for w in _HIGHER_IS_BETTER):
        return -rel
    return None


def drift_text(base: TrialResult, tuned: TrialResult, warmup: int, tolerance: float) -> str:
    """How far the tuned run's numerics drifted from the baseline's over a drift check (``--check-steps``): the
    training loss after warm-up and over the last quarter of the steps (the same seed and batches: the two
    trajectories are comparable step by step), and with ``--validate`` the validation metrics after the last step.
    A change for the worse beyond ``tolerance`` (relative; a loss higher, an accuracy lower) is called out; one as
    large for the better is reported as a different path, not a fault."""
    if not (base.status == "ok" and tuned.status == "ok"):
        failed = [
            f"the {name} run {r.status}: {r.reason}"
            for name, r in (("baseline", base), ("tuned", tuned))
            if r.status != "ok"
        ]
        return f"Numerics not checked: {'; '.join(failed)}."
    b, t = base.measured.get("losses") or [], tuned.measured.get("losses") or []
    n = min(len(b), len(t))
    if n <= warmup + 1:
        return (
            f"Numerics not checked: {n} step(s) with a loss on both sides (training_step returns no loss and "
            "logs none the tune can read)."
            if n == 0
            else f"Numerics not checked: only {n} step(s) with a loss."
        )
    start, last = warmup, max(warmup, n - max(1, n // 4))
    changes: list[tuple[str, float]] = []  # (metric name, relative change tuned vs baseline)
    parts = []
    for label, lo in (
        (f"after warm-up (steps {start + 1}-{n})", start),
        (f"over the last quarter (steps {last + 1}-{n})", last),
    ):
        mb, mt = statistics.fmean(b[lo:n]), statistics.fmean(t[lo:n])
        rel = (mt - mb) / abs(mb) if mb else 0.0
        changes.append(("loss", rel))
        parts.append(f"{label} {mt:.4g} vs {mb:.4g} ({100 * rel:+.1f}%)")
    text = f"Numerics over {n} steps (same seed and batches): the tuned run's training loss " + "; ".join(parts)
    vb, vt = base.measured.get("val_metrics") or {}, tuned.measured.get("val_metrics") or {}
    shared = sorted(set(vb) & set(vt))
    if shared:
        values = []
        for key in shared:
            rel = (vt[key] - vb[key]) / abs(vb[key]) if vb[key] else 0.0
            changes.append((key, rel))
            values.append(f"{key} {vt[key]:.4g} vs {vb[key]:.4g} ({100 * rel:+.1f}%)")
        text += "; validation after the last step: " + ", ".join(values)
    elif vb or vt:
        text += "; validation: no metric both runs logged"
    worse = [(name, w) for name, rel in changes if (w := _worse(name, rel)) is not None and w > tolerance]
    unknown = [(name, rel) for name, rel in changes if _worse(name, rel) is None and abs(rel) > tolerance]
    biggest = max((abs(rel) for _, rel in changes), default=0.0)
    if worse or unknown:
        name, value = max(worse + unknown, key=lambda item: abs(item[1]))
        return text + (
            f" - {name} {'worse' if worse else 'different'} by {100 * abs(value):.1f}%, more than the "
            f"{100 * tolerance:g}% tolerance (--loss-tolerance): check the tuned config's accuracy before "
            "relying on it."
        )
    if biggest > tolerance:
        return text + (
            f" - the runs took different paths (up to {100 * biggest:.1f}% apart), every difference "
            "for the better: no sign that the tuned numerics hurt."
        )
    return text + f" - within the {100 * tolerance:g}% tolerance (--loss-tolerance)."

"""The tune's search: greedy one knob at a time from the baseline, with successive halving inside each knob.

Pure logic: trials are run by a ``measure(spec) -> TrialResult`` callable and time is read from a
:class:`Budget`, so the search is tested with made-up results and a driven clock.

For each knob (in :data:`~lit_compute.tuning.knobs.KNOB_ORDER`) every candidate value is tried on top of the
best configuration so far in a *short* trial; the better half of those that pass the guards and look faster
than the incumbent are measured *long*, each paired with a fresh run of the incumbent (alternating order, the same
step window), and a knob is accepted only when the paired interval of its gain clears ``min_gain``: when the
interval straddles it another pair is measured while the budget allows, and the knob is "inconclusive"
otherwise. Never a grid: ``k`` knobs with ``v`` values cost about ``k * v`` short and ``k`` paired long trials. At
the end the baseline and the winner are measured side by side, alternately, so drift hits both alike.

A finished tune replays from its journal: a trial the journal holds costs nothing, so the budget never stops a
replay short of what the first run did (:class:`Search` ``cached``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_compute.formatting import human
from lit_compute.intervals import half_width, t95
from lit_compute.tuning.knobs import Knob
from lit_compute.tuning.trials import TrialResult, TrialSpec


def rate_text(value: float | None) -> str:
    """A throughput as people read it: ``8,925``, ``36.7``, ``0.4512`` (never scientific notation)."""
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else human(value, 4)


class Budget:
    """Seconds allowed in all, those spent before this session (from the journal) and a clock."""

    def __init__(
        self, total_s: float, spent_before_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total_s = total_s
        self.spent_before_s = spent_before_s
        self._clock = clock
        self._start = clock()

    def spent(self) -> float:
        return self.spent_before_s + self._clock() - self._start

    def left(self) -> float:
        return self.total_s - self.spent()


@dataclass
class Options:
    short_s: float = 10.0  # timed seconds of a short trial
    long_s: float = 30.0  # timed seconds of a long (and a final) trial
    min_gain: float = 0.03  # accept a knob only when it is at least this much faster
    loss_tolerance: float = 0.05  # first-step loss within this fraction of the baseline's
    trajectory_tolerance: float = 0.35  # mean loss of the first steps within this fraction of the baseline's
    max_skipped: int = 2  # fp16: skipped steps (inf/NaN gradients) allowed in the first steps
    final_share: float = 0.25  # budget kept for the side-by-side measurement
    final_pairs: int = 3
    final_rivals: int = 2  # the best other combinations measured long, run in the finals beside the tuned one
    max_pairs: int = 3  # paired long runs of a candidate and the incumbent before a knob is called inconclusive
    run_noise: float = 0.03  # the spread between two runs of one configuration until the tune has measured its own
    retry: bool = True  # a knob not taken is tried again once when a later knob changed the configuration under it


@dataclass
class Verdict:
    """A trial and what the search made of it."""

    result: TrialResult
    knob: str
    accepted: bool = False
    reason: str = ""
    paired: Paired | None = None  # a long candidate's comparison with the incumbent run beside it
    runs: list[TrialResult] = field(default_factory=list)  # a paired verdict's trials, in the order they ran


@dataclass
class Rival:
    """Another combination the search measured long, run in the finals beside the tuned one: its final runs and its
    paired ratio to the tuned configuration's runs of the same rounds."""

    settings: dict[str, Any]
    runs: list[TrialResult] = field(default_factory=list)
    paired: Paired | None = None

    def name(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings.items())


@dataclass
class Outcome:
    baseline: TrialResult
    settings: dict[str, Any]
    verdicts: list[Verdict] = field(default_factory=list)
    not_tried: list[tuple[str, str]] = field(default_factory=list)
    final_baseline: list[TrialResult] = field(default_factory=list)
    final_tuned: list[TrialResult] = field(default_factory=list)
    rivals: list[Rival] = field(default_factory=list)
    switched: str = ""  # why the finals replaced the search's answer by a rival ("" when they did not)

    @property
    def speedup(self) -> float | None:
        base = [r.rate for r in self.final_baseline if r.ok and r.rate]
        tuned = [r.rate for r in self.final_tuned if r.ok and r.rate]
        if base and tuned:
            return statistics.fmean(tuned) / statistics.fmean(base)
        return None


def numerics_problem(
    result: TrialResult, baseline: TrialResult, options: Options, same_batches: bool = True
) -> str | None:
    """Why ``result``'s numerics differ too much from the baseline's (None when they agree).

    Both start from the same seed: the first step's loss comes from the same weights and the same batch, so only
    the arithmetic differs (``loss_tolerance``); after a few updates early training is chaotic (any change of
    summation order moves a ResNet's loss by 10-20% within 8 steps), so the mean over the first steps only has
    to stay within ``trajectory_tolerance`` (it catches divergence); any non-finite loss, or more skipped fp16
    steps than ``max_skipped``, rejects the trial. Under a knob that feeds different batches by design
    (``same_batches=False``: other crops, packed rows) the first step is not compared.
    """
    losses = list(result.measured.get("losses") or [])
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(loss)]
    if bad:
        return f"the training loss is {losses[bad[0]]} at step {bad[0]} (the baseline's is finite)"
    skipped = int(result.measured.get("skipped_steps") or 0)
    if skipped > options.max_skipped:
        return f"it skipped {skipped} optimizer steps for inf/NaN gradients (allowed: {options.max_skipped})"
    reference = list(baseline.measured.get("losses") or [])
    n = min(len(losses), len(reference))
    if n == 0:
        return None
    first, theirs = losses[0], reference[0]
    if same_batches and abs(first - theirs) > options.loss_tolerance * max(abs(theirs), 1e-8):
        return (
            f"its first-step loss (same weights, same seed) is {first:.4g} vs the baseline's {theirs:.4g} "
            f"({100 * (first - theirs) / abs(theirs):+.1f}%; tolerance +-{100 * options.loss_tolerance:g}%)"
        )
    mine, theirs = statistics.fmean(losses[:n]), statistics.fmean(reference[:n])
    if abs(mine - theirs) > options.trajectory_tolerance * max(abs(theirs), 1e-8):
        return (
            f"its mean training loss over the first {n} steps is {mine:.4g} vs the baseline's {theirs:.4g} "
            f"({100 * (mine - theirs) / abs(theirs):+.1f}%; tolerance +-{100 * options.trajectory_tolerance:g}%)"
        )
    return None


def reference_rate(incumbent: TrialResult, result: TrialResult) -> float:
    """The incumbent's throughput over as many timed steps as ``result`` timed (a short trial is compared with
    the incumbent's first steps, not with its whole long run: early steps run at their own speed)."""
    assert incumbent.rate is not None
    mine, theirs = result.measured.get("step_rates") or [], incumbent.measured.get("step_rates") or []
    n = len(mine)
    if not n or len(theirs) <= n:
        return incumbent.rate
    return incumbent.rate * statistics.fmean(theirs[:n]) / statistics.fmean(theirs)


#: how a short trial's verdict begins when it is inside the noise: it is measured as a pair, never rejected
UNCLEAR = "unclear"


def short_verdict(result: TrialResult, incumbent: TrialResult, options: Options) -> str:
    """A short trial against the incumbent over the same steady-state steps: "" when it is faster (by half the
    minimum gain), a reason starting "slower beyond the noise" when even the top of the two runs' joint 95% interval
    (their own, and the spread between runs, ``options.run_noise``) is below the incumbent, else a reason starting
    :data:`UNCLEAR` (it goes on to a paired measurement)."""
    reference = reference_rate(incumbent, result)
    if result.rate is None or not reference:
        return ""
    ratio = result.rate / reference
    if ratio >= 1 + options.min_gain / 2:
        return ""
    # the two runs' own intervals and two runs' worth of the spread between runs of one configuration, in logs: an
    # interval of +-134% is exp(+-1.34), not a negative throughput
    noise = math.hypot(result.ci or 0.0, incumbent.ci or 0.0, 1.96 * math.sqrt(2) * options.run_noise)
    text = (
        f"{rate_text(result.rate)} vs {rate_text(reference)} {incumbent.unit} over the same steady-state steps "
        f"({ratio:.2f}x, 95% interval {ratio * math.exp(-noise):.2f}-{ratio * math.exp(noise):.2f}x with the "
        "spread between runs)"
    )
    if ratio * math.exp(noise) < 1.0:
        return f"slower beyond the noise: {text}"
    return f"{UNCLEAR}, measured as a pair: {text}"


def failure(
    result: TrialResult, baseline: TrialResult | None, options: Options, same_batches: bool = True
) -> str | None:
    """Why ``result`` cannot be used (a failure or the numerics), or None."""
    if baseline is not None:
        problem = numerics_problem(result, baseline, options, same_batches)
        if problem is not None:
            return problem
    if result.status != "ok":
        return f"{result.status}: {result.reason}"
    if not result.ok:
        return result.reason or "no throughput measured"
    return None


@dataclass
class Paired:
    """A candidate against the incumbent, measured in pairs of runs one beside the other. ``ratio`` is the
    candidate's throughput over the incumbent's (geometric mean over the pairs), ``low``-``high`` its 95% interval:
    from the pairs' step-by-step ratios (the same steps of the two runs), widened by the spread between pairs once
    there are three."""

    ratio: float
    low: float
    high: float
    pairs: int

    def text(self) -> str:
        return f"{self.ratio:.2f}x, 95% interval {self.low:.2f}-{self.high:.2f}x over {self.pairs} pair(s)"


def run_spread(groups: Iterable[Sequence[float]]) -> tuple[float, int] | None:
    """The spread between runs of one configuration, from rates measured more than once: the standard deviation of
    the log rates pooled over the groups (one per configuration) with at least two, and its degrees of freedom; None
    when no group has two."""
    logs = [[math.log(r) for r in g if r > 0] for g in groups]
    logs = [g for g in logs if len(g) >= 2]
    if not logs:
        return None
    dof = sum(len(g) - 1 for g in logs)
    return math.sqrt(sum((x - statistics.fmean(g)) ** 2 for g in logs for x in g) / dof), dof


def paired_ratio(
    pairs: list[tuple[TrialResult, TrialResult]],
    run_noise: float | None = None,
    noise_dof: int | None = None,
    spread_from: int = 3,
) -> Paired:
    """The paired comparison of ``(candidate, incumbent)`` runs (both finished with a rate). ``run_noise``: the
    relative spread (standard deviation of the log rate) between two runs of one configuration, which steps within a
    run cannot show; each pair's ratio carries two runs' worth of it, so the interval is widened by
    ``t sqrt(2 run_noise^2 / pairs)`` (in logs) from the first pair on, ``t`` the 95% quantile of Student's t at
    ``noise_dof`` degrees of freedom when the spread was measured on that few runs (1.96 for a prior). From
    ``spread_from`` pairs the spread between the pairs themselves bounds it too (Student's t at pairs - 1: two pairs
    that disagree give a wide interval, as they should)."""
    logs = [math.log((c.rate or 0.0) / (i.rate or 1.0)) for c, i in pairs]
    center = statistics.fmean(logs)
    step_logs: list[float] = []
    within: list[float] = []
    for c, i in pairs:
        mine, theirs = c.measured.get("step_rates") or [], i.measured.get("step_rates") or []
        n = min(len(mine), len(theirs))
        if n >= 3:
            step_logs += [math.log(a / b) for a, b in zip(mine[:n], theirs[:n]) if a > 0 and b > 0]
        else:  # too few steps to pair: the two runs' own intervals
            within.append(math.hypot(c.ci or 0.0, i.ci or 0.0))
    half = 0.0
    if len(step_logs) >= 3:
        half = half_width(step_logs)
    if within:
        half = math.hypot(half, math.sqrt(statistics.fmean(w * w for w in within) / len(pairs)))
    if run_noise:
        quantile = t95(noise_dof) if noise_dof else 1.96
        half = math.hypot(half, quantile * math.sqrt(2 * run_noise**2 / len(pairs)))
    if len(pairs) >= max(2, spread_from):
        half = max(half, half_width(logs))
    return Paired(ratio=math.exp(center), low=math.exp(center - half), high=math.exp(center + half), pairs=len(pairs))


class Search:
    """Run the greedy search over ``knobs`` with ``measure`` inside ``budget``."""

    def __init__(
        self,
        knobs: list[Knob],
        measure: Callable[[TrialSpec, float, float], TrialResult],
        budget: Budget,
        options: Options,
        estimate_s: Callable[[TrialSpec], float],
        cached: Callable[[TrialSpec], bool] = lambda spec: False,
    ) -> None:
        self.knobs = knobs
        self.measure = measure
        self.budget = budget
        self.options = options
        self.estimate_s = estimate_s
        self.cached = cached  # the journal holds this trial: replayed at no cost, whatever the budget says
        self._reruns: dict[str, int] = {}  # incumbent re-runs so far, by settings (their trials' repeat index)
        self._rates: dict[str, list[float]] = {}  # the long runs' rates by settings: the run-to-run spread

    def _measured(self, spec: TrialSpec, estimate: float, limit: float) -> TrialResult:
        result = self.measure(spec, estimate, limit)
        if result.ok and result.rate and spec.rung in ("long", "pair", "final"):
            self._rates.setdefault(repr(sorted(spec.settings.items())), []).append(result.rate)
        return result

    def run_noise(self) -> float:
        """The spread between runs of one configuration: pooled over the configurations this tune ran long more than
        once (the standard deviation of their log rates); the option's prior until there are any."""
        spread = run_spread(self._rates.values())
        return self.options.run_noise if spread is None else spread[0]

    def _cost(self, *specs: TrialSpec) -> float:
        """Seconds these trials will take: none for those the journal holds."""
        return sum(0.0 if self.cached(s) else self.estimate_s(s) for s in specs)

    def _affordable(self, left: float, *specs: TrialSpec) -> bool:
        cost = self._cost(*specs)
        return cost == 0 or left >= cost

    def _reserve(self) -> float:
        """Seconds kept for the side-by-side: a share of the budget, at least one pair of final trials."""
        final = TrialSpec({}, "final", 0, self.options.long_s)
        return max(self.options.final_share * self.budget.total_s, 2 * self.estimate_s(final))

    def _search_left(self) -> float:
        return self.budget.left() - self._reserve()

    def run(self, baseline: TrialResult) -> Outcome:
        o = self.options
        outcome = Outcome(baseline=baseline, settings={})
        incumbent = baseline
        not_taken: list[tuple[Knob, dict[str, Any]]] = []  # knobs tried and not taken, with the settings under them
        for knob in self.knobs:
            before, verdicts = dict(outcome.settings), len(outcome.verdicts)
            incumbent = self._try_knob(knob, incumbent, outcome)
            if knob.name not in outcome.settings and len(outcome.verdicts) > verdicts:
                not_taken.append((knob, before))
        # the configuration under a knob not taken has changed since (bf16 accepted after channels-last was
        # rejected): that knob is tried again, once, on what is there now
        for knob, before in not_taken if o.retry else []:
            if outcome.settings != before and knob.name not in outcome.settings:
                incumbent = self._try_knob(knob, incumbent, outcome, again=True)
        pairs = 0 if not outcome.settings else o.final_pairs
        outcome.rivals = self._rivals(outcome) if pairs else []
        racing = list(outcome.rivals)  # the rivals still in the finals
        for i in range(pairs):
            specs = [
                TrialSpec(settings, "final", i, o.long_s)
                for settings in [{}, dict(outcome.settings), *(dict(r.settings) for r in racing)]
            ]
            if racing and not self._affordable(self.budget.left(), *specs):
                outcome.not_tried.append(
                    (
                        f"final round {i + 1} of " + "; ".join(r.name() for r in racing),
                        "budget spent: the baseline and the tuned configuration ran on alone",
                    )
                )
                racing, specs = [], specs[:2]
            if i > 0 and not self._affordable(self.budget.left(), *specs):
                break
            # the order turns round by round: no side always runs first (a machine warming or cooling)
            turn = i % len(specs)
            for position, spec in enumerate(specs[turn:] + specs[:turn]):
                limit = self.budget.left() + 0.05 * self.budget.total_s  # never past 110% of the budget
                result = self._measured(spec, self.estimate_s(spec), limit / 2 if position == 0 else limit)
                if spec.settings == {}:
                    outcome.final_baseline.append(result)
                elif spec.settings == outcome.settings:
                    outcome.final_tuned.append(result)
                else:
                    next(r for r in racing if r.settings == spec.settings).runs.append(result)
        outcome.rivals = [r for r in outcome.rivals if r.runs]
        self._judge_rivals(outcome)
        return outcome

    def _rivals(self, outcome: Outcome) -> list[Rival]:
        """The best other combinations the search measured long and judged sound (a paired verdict: its numerics
        passed), by their long rate: up to ``final_rivals`` of them, never the baseline or the answer itself."""
        seen: dict[str, tuple[float, dict[str, Any]]] = {}
        for verdict in outcome.verdicts:
            result = verdict.result
            if verdict.paired is None or not result.ok or not result.rate or result.rung != "long":
                continue
            if result.settings in ({}, outcome.settings):
                continue
            key = repr(sorted(result.settings.items()))
            if key not in seen or result.rate > seen[key][0]:
                seen[key] = (result.rate, dict(result.settings))
        best = sorted(seen.values(), key=lambda item: -item[0])[: max(0, self.options.final_rivals)]
        return [Rival(settings) for _, settings in best]

    def _judge_rivals(self, outcome: Outcome) -> None:
        """Each rival's paired ratio to the tuned configuration over the rounds both finished; a rival faster by the
        search's own rule (its whole interval at least ``min_gain`` above 1) replaces the answer, and ``switched``
        says so."""
        best: Rival | None = None
        best_ratio, floor = 1.0, 1.0 + self.options.min_gain

        def finished(mine: list[TrialResult], theirs: list[TrialResult]) -> list[tuple[TrialResult, TrialResult]]:
            return [(a, b) for a, b in zip(mine, theirs) if a.ok and b.ok and a.rate and b.rate]  # same rounds

        for rival in outcome.rivals:
            pairs = finished(rival.runs, outcome.final_tuned)
            if pairs:
                rival.paired = paired_ratio(pairs, self.run_noise())
                if rival.paired.low >= floor and rival.paired.ratio > best_ratio:
                    best, best_ratio = rival, rival.paired.ratio
        if best is None or best.paired is None:
            return
        replaced = Rival(dict(outcome.settings), outcome.final_tuned)
        outcome.switched = (
            f"the finals measured {best.name()} {best.paired.text()} beside the search's answer "
            f"({replaced.name()}): it is the answer"
        )
        outcome.settings, outcome.final_tuned = dict(best.settings), best.runs
        replaced.paired = paired_ratio(finished(replaced.runs, best.runs), self.run_noise())
        outcome.rivals = [replaced if r is best else r for r in outcome.rivals]

    def _same_batches(self, settings: dict[str, Any]) -> bool:
        return all(k.same_batches for k in self.knobs if k.name in settings)

    def _try_knob(self, knob: Knob, incumbent: TrialResult, outcome: Outcome, again: bool = False) -> TrialResult:
        o = self.options
        assert incumbent.rate is not None
        short: list[Verdict] = []
        for name, why in knob.excluded_by.items():
            if name in outcome.settings:
                outcome.not_tried.append((knob.name, f"not applicable once {name} is on: {why}"))
                return incumbent
        for value in knob.values:
            spec = TrialSpec({**outcome.settings, knob.name: value}, "short", 1 if again else 0, o.short_s)
            cost = self.estimate_s(spec)
            if not self._affordable(self._search_left(), spec):
                outcome.not_tried.append((f"{knob.name}={value}", f"budget spent (a trial needs about {cost:.0f} s)"))
                continue
            result = self.measure(spec, cost, self._search_left())
            verdict = Verdict(
                result, knob.name, reason=failure(result, outcome.baseline, o, self._same_batches(spec.settings)) or ""
            )
            if not verdict.reason:
                verdict.reason = short_verdict(result, incumbent, o)
            outcome.verdicts.append(verdict)
            short.append(verdict)
        # values are listed in order of preference: a later one must be min_gain faster to be measured first
        order = {repr(v): i for i, v in enumerate(knob.values)}
        faster = sorted(
            (v for v in short if not v.reason),
            key=lambda v: (
                -(v.result.rate or 0.0) / (1 + o.min_gain) ** order.get(repr(v.result.settings.get(knob.name)), 0)
            ),
        )
        # the better half of the faster ones; every unclear one too (never a rejection inside the noise), after them
        unclear = sorted((v for v in short if v.reason.startswith(UNCLEAR)), key=lambda v: -(v.result.rate or 0.0))
        promising = faster[: max(1, len(short) // 2)] + unclear
        best: Verdict | None = None
        for verdict in promising:
            long_verdict = self._paired_long(knob, dict(verdict.result.settings), incumbent, outcome)
            if long_verdict is None:
                continue
            outcome.verdicts.append(long_verdict)
            if not long_verdict.reason and (
                best is None
                or (long_verdict.paired.ratio if long_verdict.paired else 0) > (best.paired.ratio if best.paired else 0)
            ):
                best = long_verdict
        if best is None:
            return incumbent
        best.accepted = True
        assert best.paired is not None
        best.reason = f"accepted: {best.paired.text()} beside the configuration before it"
        if not best.result.measured.get("losses"):
            best.reason += " (numerics not checked: the training step returned no loss and logged none)"
        outcome.settings[knob.name] = best.result.settings[knob.name]
        return best.result

    def _paired_long(
        self, knob: Knob, settings: dict[str, Any], incumbent: TrialResult, outcome: Outcome
    ) -> Verdict | None:
        """A candidate measured long beside fresh runs of the incumbent, pair after pair (alternating which runs
        first) until the paired interval of its gain clears ``min_gain`` or falls below it; None when not even
        one pair fits the budget."""
        o = self.options
        floor = 1 + o.min_gain
        pairs: list[tuple[TrialResult, TrialResult]] = []
        ran: list[TrialResult] = []
        verdict: Verdict | None = None
        for index in range(o.max_pairs):
            key = repr(sorted(incumbent.settings.items()))
            rerun = TrialSpec(dict(incumbent.settings), "pair", self._reruns.get(key, 0), o.long_s)
            candidate = TrialSpec(settings, "long", index, o.long_s)
            if not self._affordable(self._search_left(), rerun, candidate):
                outcome.not_tried.append(
                    (f"{knob.name}={settings[knob.name]} (long, pair {index + 1})", "budget spent")
                )
                break
            self._reruns[key] = rerun.repeat + 1
            order = (candidate, rerun) if index % 2 == 0 else (rerun, candidate)
            runs = {spec.rung: self._measured(spec, self.estimate_s(spec), self._search_left()) for spec in order}
            ran += [runs[spec.rung] for spec in order]
            result, beside = runs["long"], runs["pair"]
            problem = failure(result, outcome.baseline, o, self._same_batches(settings))
            verdict = Verdict(result, knob.name, reason=problem or "", runs=list(ran))
            if problem is not None:
                return verdict
            if not beside.ok:  # the incumbent failed beside it: its own earlier long run stands in
                beside = incumbent
            pairs.append((result, beside))
            verdict.paired = paired = paired_ratio(pairs, self.run_noise())
            if paired.low >= floor:
                return verdict
            if paired.high < floor:
                verdict.reason = f"gain below {100 * o.min_gain:g}%: {paired.text()} beside the configuration before it"
                return verdict
            verdict.reason = (
                f"inconclusive: {paired.text()} beside the configuration before it; the interval "
                f"straddles the {100 * o.min_gain:g}% minimum gain (the machine's noise)"
            )
        return verdict

"""``lit-compute bench configs A.yaml B.yaml ...``: whole configs measured side by side, as ratios to the first
and to the fastest.

Each config trains as a tune trial does (:func:`lit_compute.tuning.trials.run_trial`: a child process, the same
warm-up, timed steps and recorder, so a figure here means what a tune's does), in rounds: every config once per
round, the order reversed every other round, so slow drift of the machine falls on all of them alike. The ratio of
each config to the first (and to the fastest, the one of highest median rate) comes from the runs of the same round
(paired), with the 95% interval of
:func:`lit_compute.tuning.search.paired_ratio`; the column "others' CPUs" says how busy the rest of the machine
kept its CPUs while each was timed. This is how a tuned config is checked against hand-picked settings.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path
from typing import Any

from lit_compute.bench._common import emit, markdown
from lit_compute.packaged_configs import resolve_config
from lit_compute.tuning.config_yaml import ConfigError, load_config
from lit_compute.tuning.search import Options, Paired, paired_ratio, rate_text
from lit_compute.tuning.trials import TrialResult, TrialSpec, run_trial


def _name(path: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(path).stem) or "config"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def order(rounds: int, count: int) -> list[tuple[int, int]]:
    """(round, config index) in running order: forward in even rounds, reversed in odd ones."""
    out = []
    for r in range(rounds):
        indices = range(count) if r % 2 == 0 else reversed(range(count))
        out += [(r, i) for i in indices]
    return out


def _median_rate(results: list[TrialResult]) -> float | None:
    rates = [r.rate for r in results if r.ok and r.rate]
    return statistics.median(rates) if rates else None


def side_by_side(pairs: list[tuple[TrialResult, TrialResult]]) -> Paired:
    """A ratio of runs paired by round, with the spread between runs in its interval at any pair count: from two
    pairs the spread between the pairs' ratios (Student's t at pairs - 1: a slow spell of the machine in one round
    hits both configs of that round and cancels), with one pair the tune's prior (``Options.run_noise``)."""
    return paired_ratio(pairs, Options().run_noise if len(pairs) < 2 else None, spread_from=2)


def _ratio_to(mine: list[TrialResult], theirs: list[TrialResult]) -> str:
    pairs = [(c, b) for c, b in zip(mine, theirs) if c.ok and b.ok]
    return side_by_side(pairs).text() if pairs else "n/a"


def compare(names: list[str], runs: dict[str, list[TrialResult]]) -> list[list[Any]]:
    """The table's rows: each config's runs, median rate, and ratios from same-round pairs to the first config (the
    reference) and to the fastest (the one of highest median rate: how far each is from the best found), each
    interval with the spread between runs in it (:func:`side_by_side`)."""
    first = runs[names[0]]
    medians = {name: _median_rate(runs[name]) for name in names}
    fastest = max((n for n in names if medians[n] is not None), key=lambda n: medians[n] or 0.0, default=None)
    rows: list[list[Any]] = []
    for name in names:
        mine = runs[name]
        rates = [r.rate for r in mine if r.ok and r.rate]
        others = [r.measured.get("other_cores") for r in mine if r.ok]
        busy = max((o for o in others if o is not None), default=None)
        failed = [r for r in mine if not r.ok]
        ratio = ("1 (reference)" if rates else "n/a") if name == names[0] else _ratio_to(mine, first)
        if fastest is None:
            to_fastest = "n/a"
        elif name == fastest:
            to_fastest = "1 (fastest)"
        else:
            to_fastest = _ratio_to(mine, runs[fastest])
        rows.append(
            [
                name,
                " / ".join(rate_text(r) for r in rates) or "n/a",
                rate_text(statistics.median(rates)) if rates else "n/a",
                ratio,
                to_fastest,
                "n/a" if busy is None else f"{busy:.2f}",
                "; ".join(f"{r.status}: {r.reason}" for r in failed) or "ok",
            ]
        )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench configs", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "configs",
        nargs="+",
        help="two or more lit-compute fit YAMLs (or packaged config names); the first is the reference",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds: each config runs once per round")
    parser.add_argument("--seconds", type=float, default=30.0, help="timed seconds of each run")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps before timing starts")
    parser.add_argument("--log-dir", default="bench_logs/configs", help="each run's TensorBoard run, config and log")
    args = parser.parse_args(argv)
    if len(args.configs) < 2:
        parser.error(
            f"configs: {len(args.configs)} given; give at least two YAMLs to compare (the first is the reference)"
        )
    if args.rounds < 1 or args.seconds <= 0:
        parser.error(
            f"--rounds {args.rounds} / --seconds {args.seconds}: both must be positive (e.g. --rounds 3 --seconds 30)"
        )
    if args.warmup_steps < 0:
        parser.error(f"--warmup-steps {args.warmup_steps}: give 0 or more steps to run before timing (default 3)")
    configs: list[tuple[str, dict[str, Any]]] = []
    taken: set[str] = set()
    for value in args.configs:
        try:
            config = load_config(resolve_config(value))
        except ConfigError as err:
            parser.error(str(err).replace("--config ", "config "))
        configs.append((_name(value, taken), config))
    names = [n for n, _ in configs]
    recorder = {"warmup_steps": args.warmup_steps, "loss_steps": args.warmup_steps}
    timeout = 10 * args.seconds + 600  # a hang, not a slow config, is what stops a run
    runs: dict[str, list[TrialResult]] = {n: [] for n in names}
    emit(
        f"{len(names)} configs x {args.rounds} round(s), {args.seconds:g} s timed each, order reversed every other "
        f"round; logs under {args.log_dir}/"
    )
    for index, (r, i) in enumerate(order(args.rounds, len(configs))):
        name, config = configs[i]
        result = run_trial(
            config, TrialSpec({}, "final", r, args.seconds), index, Path(args.log_dir) / name, timeout, recorder
        )
        runs[name].append(result)
        emit(
            f"  round {r + 1}, {name}: "
            + (rate_text(result.rate) + f" {result.unit}" if result.ok else f"{result.status}: {result.reason}")
        )
    unit = next((r.unit for rs in runs.values() for r in rs if r.ok), "samples/s")
    emit("")
    emit(
        markdown(
            [
                "config",
                f"{unit} per device, each round",
                "median",
                f"vs {names[0]} (same-round pairs)",
                "vs the fastest (same-round pairs)",
                "others' CPUs (max)",
                "runs",
            ],
            compare(names, runs),
        )
    )
    return 0 if all(r.ok for rs in runs.values() for r in rs) else 1

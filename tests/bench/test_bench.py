"""Benchmarks are not tests: these only check that each runs on tiny settings and prints its table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lit_compute.cli import main


def _rows(out: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("|") and not line.startswith("|-") and not line.startswith("|--")
    ]


@pytest.mark.parametrize(
    ("argv", "header"),
    [
        (["flops", "--models", "resnet18", "vit_b_32", "--plain-on", "meta"], "ours / published"),
        (
            [
                "overhead",
                "--callback",
                "flops",
                "--steps",
                "5",
                "--rounds",
                "2",
                "--resolve",
                "50",
                "--max-rounds",
                "3",
                "--image-size",
                "32",
                "--batch-size",
                "4",
            ],
            "ratio to without",
        ),
        (
            [
                "overhead",
                "--callback",
                "profiler",
                "--steps",
                "5",
                "--rounds",
                "1",
                "--image-size",
                "32",
                "--batch-size",
                "4",
            ],
            "ratio to without",
        ),
        pytest.param(
            [
                "precision",
                "--model",
                "resnet18",
                "--image-size",
                "32",
                "--batch-size",
                "4",
                "--steps",
                "4",
                "--rounds",
                "1",
            ],
            "speed-up vs 32-true",
            marks=pytest.mark.heavy,
        ),
        (
            ["loaders", "--image-size", "32", "--images-per-class", "4", "--rounds", "1", "--batch-size", "8"],
            "ratio to torchvision",
        ),
        pytest.param(
            ["allreduce", "--nprocs", "2", "--max-mb", "0.1", "--seconds", "2"], "busbw (GB/s)", marks=pytest.mark.heavy
        ),
        (["flops", "--zoo", "transformers"], "ours / analytic"),
        (["overhead", "--callback", "flops", "--variable-length", "--steps", "6", "--rounds", "2"], "ratio to without"),
    ],
    ids=[
        "flops",
        "overhead-flops",
        "overhead-profiler",
        "precision",
        "loaders",
        "allreduce",
        "flops-zoo",
        "overhead-variable-length",
    ],
)
@pytest.mark.slow
def test_bench_runs_and_prints_a_table(argv, header, capsys, monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert main(["bench", *argv]) == 0
    out = capsys.readouterr().out
    assert header in out
    rows = _rows(out)
    assert len(rows) >= 3  # header + at least two rows
    if argv[0] == "overhead":  # the callback's own hook time, measured directly, next to the ratio
        assert re.search(r"time inside \w+'s hooks: median [0-9.]+ ms per step \([0-9.]+% of the median step", out)
        interval = re.search(
            r"ratio over the paired rounds: ([0-9.]+), 95% interval ([0-9.]+)-([0-9.a-z]+) \((\d+) rounds", out
        )
        assert interval, out
        center, low, high = (float(interval.group(k)) for k in (1, 2, 3))
        assert low <= center <= high
        if "--resolve" in argv:  # two rounds, then on until +-50% or three
            rounds = int(interval.group(4))
            assert rounds in (2, 3)
            verdict = re.search(r"resolved to \+-50% after (\d+) rounds|not resolved to \+-50% in 3 rounds", out)
            assert verdict, out
            assert verdict.group(1) in (None, str(rounds))


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_recipe_table_has_every_row_and_ratios_from_measured_times(tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "recipe",
                "--model",
                "resnet18",
                "--image-size",
                "32",
                "--batch-size",
                "8",
                "--steps",
                "6",
                "--images-per-class",
                "8",
                "--log-dir",
                str(tmp_path / "logs"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = _rows(out)[1:]
    assert [r[0].split(":")[0].split(" (")[0] for r in rows][:2] == ["baseline", "+ DataLoader workers"]
    assert len(rows) == 5
    assert rows[-1][0].startswith("+ DALIImageDataModule")
    base = float(rows[0][1].replace(",", ""))
    for row in rows:  # 4 significant digits at any speed: the ratios hold on a slow or busy machine too
        sps, ratio = float(row[1].replace(",", "")), float(row[5].rstrip("x"))
        assert ratio == pytest.approx(sps / base, abs=0.01)
        assert float(row[2].replace(",", "")) == pytest.approx(1e3 / sps, rel=0.01)
    runs = sorted(p.parts[-3] for p in (tmp_path / "logs").glob("*/version_0/events.out.tfevents.*"))
    assert len(runs) == 5
    assert runs[0] == "0_baseline"
    assert runs[-1] == "4_dali_optimised"
    assert re.search(r"optimised / baseline samples per second: [0-9.]+x", out)


def test_bench_gpu_without_a_gpu_says_so_and_exits_0(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: bench gpu would run the real checks")
    assert main(["bench", "gpu"]) == 0
    assert "no NVIDIA GPU" in capsys.readouterr().out


@pytest.mark.slow
def test_recipe_without_dali_says_so_before_training_and_no_dali_keeps_torchvision(tmp_path, capsys, monkeypatch):
    import lit_compute.bench.recipe as recipe

    monkeypatch.setattr(recipe, "dali_available", lambda: False)
    argv = [
        "bench",
        "recipe",
        "--model",
        "resnet18",
        "--image-size",
        "32",
        "--batch-size",
        "8",
        "--steps",
        "6",
        "--images-per-class",
        "8",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "NVIDIA DALI is not installed" in err
    assert "--no-dali" in err
    assert not (tmp_path / "logs").exists()  # nothing trained
    # --no-dali: the same rows, the last on the torchvision loader (the rows' runs are the test above's, which trains
    # rows 0-3 on that loader and the DALI row)
    import argparse

    args = argparse.Namespace(no_dali=True, devices=1)
    names = [(row["slug"], row["name"], row["dali"]) for row in recipe.rows_for(args, "cpu")]
    assert len(names) == 5
    assert names[-1][:2] == ("4_optimised", "+ FlopsLogger on (optimised, torchvision loader)")
    assert not any(dali for _, _, dali in names)


def test_gpt_recipe_rows_are_computed_from_measured_tokens_and_times(tmp_path, capsys):
    from lit_compute.bench import recipe_gpt

    argv = [
        "recipe",
        "--model",
        "gpt",
        "--steps",
        "6",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--seq-len",
        "64",
        "--max-tokens",
        "20000",
        "--batch-size",
        "4",
        "--log-dir",
        str(tmp_path),
    ]
    assert main(["bench", *argv]) == 0
    rows = _rows(capsys.readouterr().out)
    header, body = rows[0], rows[1:]
    assert header[:3] == ["configuration", "tokens/s", "rows/s"]
    assert [r[0] for r in body] == [r["name"] for r in recipe_gpt.rows_for("cpu")]
    tokens = [float(r[1].replace(",", "")) for r in body]
    ratios = [float(r[-1].rstrip("x")) for r in body]
    assert all(t > 0 for t in tokens)
    for t, ratio in zip(tokens, ratios):
        # both rates are printed to at least 4 significant figures and the ratio to 2 decimals: the rounding of all
        # three, never the machine's speed, bounds how far the printed ratio may be from the printed rates' (59.96x
        # against 59.970 failed a fixed 0.01 on a fast row)
        assert ratio == pytest.approx(t / tokens[0], rel=1e-3, abs=0.006)
    assert body[0][4] != "0.0%"
    assert body[2][4] == "0.0%"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(r["slug"] for r in recipe_gpt.rows_for("cpu"))


def test_markdown_writes_what_the_bench_printed_under_the_figure_header(tmp_path, capsys):
    figure = tmp_path / "figures" / "flops.md"
    assert main(["bench", "flops", "--models", "resnet18", "--plain-on", "meta", "--markdown", str(figure)]) == 0
    out = capsys.readouterr().out
    text = figure.read_text()
    first = text.splitlines()[0]
    assert re.match(r"<!-- written by `lit-compute bench flops --models resnet18 --plain-on meta` at commit \S+", first)
    assert re.search(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC; machine: .+ torch threads", first)
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table
    assert all(line in text for line in table)
    assert f"written: {figure}" in out


def test_markdown_without_a_file_name_is_refused(capsys):
    assert main(["bench", "flops", "--markdown"]) == 2
    assert "--markdown needs a file name" in capsys.readouterr().err


def test_bench_configs_alternates_the_order_and_pairs_each_round(tmp_path, capsys, monkeypatch):
    """The trials themselves are the tune's (tested there): here a stand-in gives config B 2x config A's rate in
    every step of every round, and the table must say 2.00x with a tight interval, the runs in reversed order in
    the second round."""
    from lit_compute.bench import configs_bench
    from lit_compute.tuning.trials import TrialResult

    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(f"trainer:\n  max_steps: 1\nmodel:\n  name: {name}\n")
    ran = []

    def fake_trial(config, spec, index, log_dir, timeout, recorder):
        name = config["model"]["name"]
        ran.append((spec.repeat, name))
        rate = 10.0 * (2 if name == "b" else 1) * (1 + 0.1 * spec.repeat)  # the machine slows down in round 2
        return TrialResult(
            key=spec.key,
            slug=spec.slug(index),
            settings={},
            rung=spec.rung,
            repeat=spec.repeat,
            status="ok",
            rate=rate,
            measured={"step_rates": [rate * f for f in (0.99, 1.0, 1.01)] * 3, "other_cores": 0.5},
        )

    monkeypatch.setattr(configs_bench, "run_trial", fake_trial)
    assert (
        main(
            [
                "bench",
                "configs",
                str(tmp_path / "a.yaml"),
                str(tmp_path / "b.yaml"),
                "--rounds",
                "2",
                "--log-dir",
                str(tmp_path / "logs"),
            ]
        )
        == 0
    )
    assert ran == [(0, "a"), (0, "b"), (1, "b"), (1, "a")]
    rows = {r[0]: r for r in _rows(capsys.readouterr().out)}
    assert rows["b"][3] == "2.00x, 95% interval 2.00-2.00x over 2 pair(s)"
    assert rows["a"][3] == "1 (reference)"
    assert rows["a"][5] == "0.50"
    # #51 item 5: each config against the fastest as well as against the first
    assert rows["b"][4] == "1 (fastest)"
    assert rows["a"][4] == "0.50x, 95% interval 0.50-0.50x over 2 pair(s)"


def test_bench_configs_names_a_config_it_cannot_read(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "configs", str(tmp_path / "missing.yaml"), "quickstart"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "missing.yaml" in err
    assert "no such file" in err


def test_bench_configs_refuses_a_negative_warm_up_before_starting_a_run(tmp_path, capsys):
    """#47 item 13: ``--warmup-steps -2`` started all six trials, each crashed, exit 1 and nothing on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "configs", "quickstart", "quickstart", "--warmup-steps", "-2", "--log-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--warmup-steps -2: give 0 or more steps" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_bench_whatif_refuses_zero_repeats_before_running_anything(capsys):
    """#68 item 3: ``--repeats`` sets the cpu part's runs of each configuration; none is refused before a run."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "whatif", "--only", "cpu", "--repeats", "0"])
    assert exit_info.value.code == 2
    assert "--repeats 0: give 1 or more runs of each configuration" in capsys.readouterr().err


def _table_rows(markdown_text: str, title: str) -> list[list[str]]:
    """The rows of the table under ``### title`` in a figure file."""
    section = markdown_text.split(f"### {title}", 1)[1].split("\n### ", 1)[0]
    return _rows(section)


def _check_rows_agree(kept: dict, table: list[list[str]]) -> int:
    """How many check rows of ``--errors``' JSON are the table's own check rows (predicted, published and error as
    printed); every JSON row must be one of them."""
    printed = {
        (r[1].split(" on ")[0], r[1].split(" on ")[1].split(",")[0], r[3], r[4], r[5])
        for r in table[1:]
        if r[0] == "check"
    }
    for row in kept["rows"]:
        error = f"{(row['predicted'] / row['published'] - 1) * 100:+.1f}%"
        assert (row["model"], row["chip"], f"{row['predicted']:,.0f}", f"{row['published']:,.0f}", error) in printed
    return len(kept["rows"])


def test_the_check_sets_errors_by_generation_are_signed_medians_over_its_rows_only():
    """``bench whatif --only gpu``'s line by generation: the check rows (never the fit rows) grouped by architecture
    and precision class, each group's signed median and range, oldest generation first."""
    from lit_compute.bench.whatif.gpu import generation, generations_summary

    assert [
        generation(c)
        for c in ("v100-sxm", "a100-40gb", "a10", "rtx-3090", "rtx-4090", "h100-pcie", "h200-sxm", "tpu-v3")
    ] == ["Volta", "Ampere", "Ampere", "Ampere", "Ada", "Hopper", "Hopper", "tpu-v3"]
    rows = [
        {"set": s, "chip": c, "precision": p, "predicted": x, "samples_per_s": 100.0}
        for s, c, p, x in (
            ("check", "h100-sxm", "16-mixed", 150.0),
            ("check", "h200-sxm", "bf16-mixed", 110.0),
            ("check", "h200-sxm", "tf32", 80.0),
            ("check", "v100-sxm", "32-true", 90.0),
            ("fit", "a100", "16-mixed", 500.0),
        )
    ]
    assert generations_summary(rows) == (
        "- **check set by generation** (signed: + predicted faster than published): Volta at float32: 1 row(s), "
        "median -10.0% (-10.0% to -10.0%); Hopper at 16 bits: 2 row(s), median +30.0% (+10.0% to +50.0%); Hopper at "
        "TF32: 1 row(s), median -20.0% (-20.0% to -20.0%)"
    )
    assert generations_summary([r for r in rows if r["set"] == "fit"]) == ""


def test_whatifs_quoted_errors_are_the_committed_figures_check_rows():
    """The file whatif quotes beside a prediction at the default efficiencies was written with
    docs/figures/whatif_gpu.md (the same command, the same commit) at the efficiencies in the code now: its rows are
    the figure's check rows, every one of them. Refitting the defaults without running the bench again fails here."""
    from lit_compute.planning.whatif import CHECKED_FILE, DEFAULT_EFFICIENCY

    kept = json.loads(CHECKED_FILE.read_text())
    committed = (Path(__file__).resolve().parents[2] / "docs" / "figures" / "whatif_gpu.md").read_text()
    assert kept["command"].startswith("lit-compute bench whatif --only gpu --errors ")
    assert f" at commit {kept['commit']} on " in committed.splitlines()[0]
    assert kept["efficiencies"] == DEFAULT_EFFICIENCY
    table = _table_rows(committed, "Published GPU training throughputs (samples/s)")
    assert _check_rows_agree(kept, table) == sum(r[0] == "check" for r in table[1:]) >= 20


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_bench_whatif_gpu_reproduces_its_figure_file(tmp_path, monkeypatch):
    """``bench whatif --only gpu`` (published GPU throughputs, counted on fake tensors, priced arithmetically) writes
    the rows docs/figures/whatif_gpu.md holds (the GPU rows are the only ones independent of this machine). Two
    cheap models of both sets (each traced model costs seconds; every row is the same code): the whole file and
    ``--fit-defaults`` reproducing the defaults take over a minute on 2 cores, too long for the suite, and are run
    with the bench."""
    from pathlib import Path

    from lit_compute.bench.whatif import gpu

    every = gpu.published_rows()
    chosen = [
        r
        for r in every
        if r["model"] in ("resnet50", "gpt") and r["chip"] != "h200-sxm" or (r["model"], r["batch"]) == ("gpt", 16)
    ]
    assert len({r["set"] for r in chosen}) == 2
    assert len(chosen) < len(every)
    # the fit rows' steps --fit-defaults kept are the steps traced now (the fast test fits the defaults on them)
    from lit_compute.bench.whatif import fit, zoo

    kept = fit.kept_fit_facts()
    for key in [k for k in kept if k[0] == "resnet50"]:
        assert fit.facts_record(kept[key]) == json.loads(json.dumps(fit.facts_record(zoo.traced_facts(*key))))
    monkeypatch.setattr(gpu, "published_rows", lambda: chosen)
    out, errors = tmp_path / "whatif.md", tmp_path / "errors.json"
    assert main(["bench", "whatif", "--only", "gpu", "--markdown", str(out), "--errors", str(errors)]) == 0
    written = out.read_text()
    assert written.startswith("<!-- written by `lit-compute bench whatif --only gpu` at commit ")
    title = "Published GPU training throughputs (samples/s)"
    committed = (Path(__file__).resolve().parents[2] / "docs" / "figures" / "whatif_gpu.md").read_text()
    rows, kept = _table_rows(written, title), _table_rows(committed, title)
    assert rows[0] == kept[0] == ["set", "workload", "source", "predicted", "published", "error"]
    assert len(rows) - 1 == len(chosen)
    assert all(row in kept for row in rows[1:])
    assert len(kept) - 1 == sum(r["set"] in ("fit", "check") for r in every) >= 20  # the sealed rows never printed
    assert {r[0] for r in kept[1:]} == {"fit", "check"}
    # --errors: the check rows, as the table has them (what whatif quotes beside a prediction on their chips)
    kept_errors = json.loads(errors.read_text())
    assert kept_errors["command"] == f"lit-compute bench whatif --only gpu --errors {errors}"
    assert _check_rows_agree(kept_errors, _table_rows(written, title)) == sum(r["set"] == "check" for r in chosen)
    (by_generation,) = [x for x in written.splitlines() if x.startswith("- **check set by generation**")]
    hopper = sum(
        r["set"] == "check" and r["chip"].startswith(("h100", "h200")) and "16" in r["precision"] for r in chosen
    )
    assert f"Hopper at 16 bits: {hopper} row(s)" in by_generation
    assert "Volta at 16 bits: 1 row(s)" in by_generation
    assert "- **check set by generation**" in committed
    # the chosen rows hold every check row that convolved channels-first at 16 bits (Lambda's ResNet-50 runs): the
    # transposes' worth, priced and left out, is the committed file's line
    (line,) = [x for x in written.splitlines() if "convolving channels-first at 16 bits" in x]
    assert line in committed
    assert "with cuDNN's transposes priced" in line


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_bench_memory_writes_predicted_beside_measured_peaks(tmp_path):
    """``bench memory`` on one workload: estimate's predicted peak beside the allocator's peak over a real step (its
    profiler events: not the tracker), within the 10% the estimate promises, the profiler timeline and
    MemoryMonitor's tracked peak beside them, under its figure header."""
    out = tmp_path / "memory.md"
    assert main(["bench", "memory", "--only", "GPT, 2 layers", "--markdown", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<!-- written by `lit-compute bench memory --only GPT, 2 layers` at commit ")
    header, *rows = _rows(text)
    assert header == [
        "workload",
        "micro-batch",
        "predicted peak MB",
        "allocator peak MB",
        "error",
        "profiler timeline MB",
        "MemoryMonitor MB (tracing check)",
    ]
    assert [row[1] for row in rows] == ["4", "16"]
    for name, _, predicted, measured, error, timeline, monitor in rows:
        assert name == "GPT, 2 layers, packed (gpt.yaml)"
        assert float(predicted) == pytest.approx(float(measured), rel=0.10)
        # the error is the prediction's against the measured peak (from the bytes: the MB shown are rounded)
        assert float(error[:-1]) == pytest.approx(100 * (float(predicted) / float(measured) - 1), abs=0.2)
        assert abs(float(error[:-1])) <= 10
        assert float(timeline.split()[0]) > 0
        assert float(monitor) > 0
    assert float(rows[0][3]) < float(rows[1][3])  # more samples, more memory, measured
    assert "Largest error against the allocator: " in text
    assert "over 2 predictions; " in text


@pytest.mark.slow
def test_a_workload_whose_run_fails_is_a_row_that_says_why_and_the_others_go_on(tmp_path, monkeypatch):
    """A run that fails or runs past its time (a config that breaks, a compile that hangs) is its own row, not
    measured, with the reason; the bench goes on and its summary counts it."""
    import subprocess

    from lit_compute.bench import memory_bench

    def refuse(config, overrides, size, processes):
        if size == 16:
            raise subprocess.TimeoutExpired(["fit", config], 900)
        raise RuntimeError(f"{config} at micro-batch {size} failed: out of memory")

    monkeypatch.setattr(memory_bench, "measured", refuse)
    out = tmp_path / "memory.md"
    assert main(["bench", "memory", "--only", "GPT, 2 layers", "--markdown", str(out)]) == 0
    _, *rows = _rows(out.read_text())
    assert [(r[1], r[3], r[4]) for r in rows] == [("4", "not measured", "n/a"), ("16", "not measured", "n/a")]
    assert rows[0][5] == "configs/gpt.yaml at micro-batch 4 failed: out of memory"
    assert "timed out after 900 seconds" in rows[1][5]
    assert float(rows[0][2]) > 0  # the prediction is still there
    assert "2 run(s) not measured" in out.read_text()


def test_published_gpu_results_span_three_generations_and_the_check_set_never_sets_a_default(monkeypatch):
    """#50 item 3: published_gpu.csv holds at least 20 cited rows over at least three GPU generations, each in the fit
    or the check set; --fit-defaults reads the fit set only: the check rows' published values can be anything without
    moving a fitted default."""
    from lit_compute.bench.whatif import fit, gpu, zoo
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import RunFacts

    rows = gpu.published_rows()
    assert len(rows) >= 20
    assert {r["set"] for r in rows} == {"fit", "check", "sealed"}
    assert all(r["source"] and r["samples_per_s"] > 0 and r["batch"] > 0 for r in rows)
    generations = {
        "v100": "Volta",
        "a100": "Ampere",
        "a10": "Ampere",
        "rtx-3090": "Ampere",
        "rtx-4090": "Ada",
        "h100": "Hopper",
        "h200": "Hopper",
    }
    assert len({g for r in rows for prefix, g in generations.items() if r["chip"].startswith(prefix)}) >= 3
    for r in rows:
        find_chip(r["chip"])  # every chip is in the table
    keys = [(r["model"], r["chip"], r["precision"], r["memory_format"], r["batch"]) for r in rows]
    assert len(keys) == len(set(keys))
    # a cheap stand-in for the traced step (the fit's arithmetic is the same; its work puts the fit inside the
    # bounds with the published rates a tenth), two parameters fitted
    facts = RunFacts(
        path=Path("traced"),
        by_class={"matmul": (1e12, 1e9, 100), "conv": (1e12, 1e9, 100)},
        samples=8,
        model_flops=2e12,
        trainable=1000,
        precision="32-true",
        device="traced",
    )
    monkeypatch.setattr(zoo, "traced_facts", lambda model, batch, memory_format: facts)
    monkeypatch.setattr(fit, "FITTED", {"tensor": (0.05, 1.0), "conv_tensor": (0.05, 1.0)})
    base = [{**r, "samples_per_s": r["samples_per_s"] / 10} for r in rows]
    monkeypatch.setattr(gpu, "published_rows", lambda: base)
    first = fit.fit_defaults()
    assert 0.05 < first["tensor"] < 1.0
    assert 0.05 < first["conv_tensor"] < 1.0
    moved = [{**r, "samples_per_s": r["samples_per_s"] * 10} if r["set"] == "check" else r for r in base]
    monkeypatch.setattr(gpu, "published_rows", lambda: moved)
    assert fit.fit_defaults() == first
    refit = [{**r, "samples_per_s": r["samples_per_s"] / 2} for r in base]
    monkeypatch.setattr(gpu, "published_rows", lambda: refit)
    assert fit.fit_defaults() != first  # the fit rows do move it


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_the_default_efficiencies_are_the_fit_on_the_fit_sets_kept_steps():
    """#70 item 4: ``--fit-defaults`` run on the fit rows' traced steps as that command kept them (``fit_facts.json``;
    the figure test below checks they are the steps traced now) gives ``DEFAULT_EFFICIENCY`` exactly: a value
    edited by hand, or a refit whose figures were not written again, fails here (about 15 s: no model is traced).
    The values the fit left on a bound of their range are named, and docs/whatif.md says which they are."""
    from lit_compute.bench.whatif import fit
    from lit_compute.planning.whatif import DEFAULT_EFFICIENCY

    facts = fit.kept_fit_facts()
    assert set(facts) == {(r["model"], r["batch"], r["memory_format"]) for r in fit.fit_rows()}
    assert fit.fit_defaults(facts) == DEFAULT_EFFICIENCY
    assert fit.on_bounds(DEFAULT_EFFICIENCY) == {"tf32"}
    text = (Path(__file__).resolve().parents[2] / "docs" / "whatif.md").read_text()
    assert "`tf32` sits on the top of its range" in text


def test_the_sealed_set_is_new_models_on_four_generations_never_priced_unless_asked(monkeypatch):
    """#68 item 4: the sealed rows (committed before the per-kernel pricing) are at least 12, on models no fit or check
    row has, with a transformer, a depthwise convnet and chips older and newer than Ampere; every one builds (on the
    meta device: no step is counted here, no prediction made); ``bench whatif --only gpu`` prices none of them unless
    ``--sealed`` says so, and ``--fit-defaults`` never reads them."""
    import torch

    from lit_compute.bench.whatif import gpu, zoo
    from lit_compute.hardware.chips import find_chip

    rows = gpu.published_rows()
    sealed = [r for r in rows if r["set"] == "sealed"]
    assert len(sealed) >= 12
    assert not {r["model"] for r in sealed} & {r["model"] for r in rows if r["set"] != "sealed"}
    assert {"timm/deit_small_patch16_224@224", "timm/mobilenetv3_large_100@224"} <= {r["model"] for r in sealed}
    architectures = {find_chip(r["chip"]).architecture for r in sealed}
    assert {"Volta", "Ampere", "Ada", "Hopper"} <= architectures
    for model in sorted({r["model"] for r in sealed}):
        with torch.device("meta"):
            net, step = zoo.zoo_model(model)
        assert callable(step)
        assert sum(p.numel() for p in net.parameters()) > 1e6
        assert zoo.zoo_optimizer(model, net).defaults["momentum"] == 0.9
    priced = []
    monkeypatch.setattr(gpu, "predicted_rate", lambda row, cal: priced.append(row["set"]) or 1.0)
    assert {r["set"] for r in gpu.gpu_predictions()} == {"fit", "check"}
    assert "sealed" not in priced
    assert [r["set"] for r in gpu.gpu_predictions(("check", "sealed"))].count("sealed") == len(sealed)
    with pytest.raises(SystemExit) as refused:
        main(["bench", "whatif", "--only", "cpu", "--sealed"])
    assert refused.value.code == 2


def test_the_gpu_check_from_run_folders_fails_when_the_cpu_runs_prediction_misses(monkeypatch, tmp_path):
    """#50 item 4: ``bench gpu`` trains the baseline config on the GPU and on the CPU with ``lit-compute fit`` and
    checks ``whatif CPU_RUN --hardware <this chip>`` against the GPU run's measured step: within 30% it passes and
    says both figures, beyond it fails (the run folders and whatif's rows stand in for the device here; the same
    function ran end to end on this CPU with accelerator="cpu")."""
    from types import SimpleNamespace

    from lit_compute.bench.whatif import on_gpu, training

    folders = iter([tmp_path / "gpu_run", tmp_path / "cpu_run"])
    monkeypatch.setattr(training, "fit_run", lambda args, out: next(folders))
    monkeypatch.setattr("lit_compute.planning.whatif.read_run", lambda path: SimpleNamespace(step_s=0.1))
    for predicted, passes in ((0.125, True), (0.135, False)):
        folders = iter([tmp_path / "gpu_run", tmp_path / "cpu_run"])
        rows = {
            "own": {"hardware": "h200-sxm", "step_time_s": 0.1, "bottleneck": "compute"},
            "cpu": {"hardware": "h200-sxm", "step_time_s": predicted, "bottleneck": "input"},
            "h100": {"hardware": "h100-sxm", "step_time_s": 0.12, "bottleneck": "compute"},
        }

        def answer(args, rows=rows):
            if args[0].endswith("cpu_run"):
                assert args[1:] == ["--hardware", "h200-sxm", "--precision", "bf16-mixed", "--micro-batch", "64"]
                return rows["cpu"]
            return rows["h100"] if "h100-sxm" in args else rows["own"]

        monkeypatch.setattr(on_gpu, "_whatif_json", answer)
        if passes:
            assert "125.0 ms a step (input-bound) against the h200-sxm run's measured 100.0 ms, +25.0%" in (
                on_gpu.check_whatif_runs("unused")
            )
        else:
            with pytest.raises(AssertionError, match=r"\+35\.0%.*missed by more than 30%"):
                on_gpu.check_whatif_runs("unused")


def test_fit_rows_measured_on_a_gpu_are_rows_the_fit_reads(monkeypatch, tmp_path):
    """#50: a Hopper chip has no published fit rows. ``bench gpu --only 'fit rows'`` measures the fit set's own models
    (not the check rows' ResNet-50 and GPT) on the lent GPU and writes them in published_gpu.csv's columns, set "fit".
    Appended to the file, they are read as fit rows of that chip; a workload that fails is named and the others
    kept."""
    from lit_compute.bench.whatif import gpu, on_gpu

    assert not {m for m, _, _ in on_gpu.FIT_RUNS} & {m for m, _, _ in on_gpu.WHATIF_RUNS}
    monkeypatch.setattr(on_gpu.torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setenv(on_gpu.FIT_ROWS_ENV, str(tmp_path / "fit_rows.csv"))
    monkeypatch.setenv("LIT_COMPUTE_COMMIT", "abc1234")

    def rate(model, batch, precision):
        if model == "bert-large" and precision == "tf32":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        return 1000.0 + batch

    monkeypatch.setattr(on_gpu, "measure_rate", rate)
    with pytest.raises(
        RuntimeError,
        match=r"5 of 6 fit rows written .*bert-large tf32 batch 128: RuntimeError: "
        r"CUDA out of memory\. Tried to allocate 2\.00 GiB$",
    ):
        on_gpu.check_fit_rows("unused")
    written = (tmp_path / "fit_rows.csv").read_text()
    published = gpu.PUBLISHED_FILE.read_text()
    combined = tmp_path / "published_gpu.csv"
    combined.write_text(published + written)
    monkeypatch.setattr(gpu, "PUBLISHED_FILE", combined)
    rows = [r for r in gpu.published_rows() if r["chip"] == "h200-sxm" and r["set"] == "fit"]
    assert [(r["model"], r["precision"], r["batch"], r["samples_per_s"]) for r in rows] == [
        ("resnext101-32x4d", "bf16-mixed", 128, 1128.0),
        ("resnext101-32x4d", "tf32", 128, 1128.0),
        ("efficientnet-b0", "bf16-mixed", 256, 1256.0),
        ("efficientnet-b0", "tf32", 256, 1256.0),
        ("bert-large", "bf16-mixed", 256, 1256.0),
    ]
    assert all("commit abc1234" in r["source"] and "1x NVIDIA H200" in r["source"] for r in rows)


def test_the_gpu_whatif_check_fails_on_a_miss(monkeypatch):
    """#50 item 4: ``bench gpu`` printed "pass" for a whatif check with 1 of 4 rows within 30%. A prediction that
    misses the rate measured on the GPU by more than 30% now fails the check (its table is still written)."""
    from lit_compute.bench.whatif import on_gpu
    from lit_compute.planning.whatif import RunFacts

    facts = RunFacts(
        path=Path("traced"),
        by_class={"matmul": (1e12, 1e9, 100)},
        samples=8,
        model_flops=1e12,
        trainable=1000,
        precision="32-true",
        device="traced",
    )
    monkeypatch.setattr(on_gpu.torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    traced = []  # the memory format each model is traced in: NVIDIA's ResNet-50 runs, and bench gpu's, channels-last
    monkeypatch.setattr(
        "lit_compute.bench.whatif.zoo.traced_facts",
        lambda model, batch, memory_format: traced.append(memory_format) or facts,
    )
    monkeypatch.setattr(on_gpu, "WHATIF_RUNS", [("resnet50", 8, "bf16-mixed")])
    monkeypatch.setattr("lit_compute.hardware.this_machine.host_dispatch_seconds", lambda: 0.0)  # the device's side
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import Scenario, default_calibration, predict

    rate = predict(facts, Scenario(find_chip("h100-sxm"), "bf16-mixed", 8), default_calibration()).samples_per_s
    for measured, passes in ((rate * 1.2, True), (rate * 1.5, False)):
        monkeypatch.setattr(on_gpu, "measure_rate", lambda *a, m=measured, **k: m)
        if passes:
            assert on_gpu.check_whatif("unused").startswith("table above: 1 of 1 within 30%")
        else:
            with pytest.raises(AssertionError, match="a prediction missed by more than 30%"):
                on_gpu.check_whatif("unused")
    assert traced == ["channels_last", "channels_last"]


def test_the_transposes_check_compares_the_predicted_and_measured_ratio_of_both_layouts(monkeypatch):
    """``bench gpu``'s transposes check trains ResNet-50 channels-first and channels-last and puts whatif's predicted
    ratio of the two rates (from the steps counted in each layout) beside the measured one: within its goal it passes
    with both figures, beyond it fails (the measured rates stand in for the device here)."""
    from lit_compute.bench.whatif import on_gpu
    from lit_compute.bench.whatif.zoo import traced_facts
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import Scenario, default_calibration, predict

    monkeypatch.setattr(on_gpu.torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("lit_compute.hardware.this_machine.host_dispatch_seconds", lambda: 0.0)
    monkeypatch.setattr(on_gpu, "TRANSPOSES_RUN", ("resnet50", 8, "bf16-mixed"))
    scenario = Scenario(find_chip("h100-sxm"), "bf16-mixed", 8)
    rates = {
        layout: predict(traced_facts("resnet50", 8, layout), scenario, default_calibration()).samples_per_s
        for layout in ("contiguous", "channels_last")
    }
    ratio = rates["channels_last"] / rates["contiguous"]
    assert ratio > 1.05  # channels-first pays the transposes at 16 bits
    for scale, passes in ((1.1, True), (1.3, False)):  # the measured channels-last rate this much faster
        measured = {"contiguous": 1000.0, "channels_last": 1000.0 * ratio * scale}
        monkeypatch.setattr(on_gpu, "measure_rate", lambda model, batch, precision, layout, m=measured: m[layout])
        if passes:
            assert on_gpu.check_transposes("unused") == (
                f"channels-last over channels-first: predicted {ratio:.2f}x, measured {ratio * 1.1:.2f}x (-9.1%)"
            )
        else:
            with pytest.raises(AssertionError, match="the predicted ratio missed by more than 15%"):
                on_gpu.check_transposes("unused")


def test_the_setup_probe_measures_inside_the_training_process_once(tmp_path, monkeypatch):
    """``bench whatif --only setup``'s probe: inside a Lightning run, at its step, the convolutions' set-up measured
    once and written as JSON (the measurement itself is driven: its own test times the intercept)."""
    from lit_compute.bench.whatif.conv_setup import SetupProbe
    from lit_compute.hardware import measure

    from ..conftest import make_trainer, tiny_data, tiny_model

    calls = []
    monkeypatch.setattr(
        measure, "measure_conv_setup", lambda dtype: calls.append(dtype) or measure.ConvSetup(7e-10, True)
    )
    path = tmp_path / "setup.json"
    make_trainer(tmp_path, max_steps=3, callbacks=[SetupProbe(str(path), step=2)]).fit(
        tiny_model(), datamodule=tiny_data()
    )
    assert json.loads(path.read_text()) == [7e-10, True]
    assert len(calls) == 1


def test_bench_warmstart_alternates_the_order_and_gives_the_ratio_with_its_interval(tmp_path, monkeypatch):
    """#70 item 3: forked and fresh runs of one config alternate who goes first; each pair's ratio is the fresh step
    over the forked one (the forked run's speed), and the summary's interval comes from the pairs' spread (driven
    step times here; the real runs are the bench's own)."""
    from lit_compute.bench import warm_start_bench

    order: list[bool] = []
    steps = {False: iter([0.100, 0.110, 0.100, 0.105]), True: iter([0.100, 0.100, 0.102, 0.100])}

    def one(args, out, warm):
        order.append(warm)
        return next(steps[warm]), 3.0 if warm else 8.0

    monkeypatch.setattr(warm_start_bench, "_one", one)
    out = tmp_path / "warm.md"
    assert main(["bench", "warmstart", "--pairs", "4", "--markdown", str(out)]) == 0
    assert order == [False, True, True, False, False, True, True, False]
    text = out.read_text()
    assert text.startswith("<!-- written by `lit-compute bench warmstart --pairs 4` at commit ")
    _, *rows = _rows(text)
    assert [r[4] for r in rows] == ["1.000x", "1.100x", "0.980x", "1.050x"]
    assert rows[0][5] == "8.0 / 3.0"
    assert "Forked over fresh, the step's speed: 1.032x, 95% interval " in text
    low, high = re.search(r"interval ([0-9.]+)-([0-9.]+)x over 4 pairs", text).groups()
    assert float(low) < 1.0 < float(high)
    with pytest.raises(SystemExit):
        main(["bench", "warmstart", "--pairs", "1"])


def test_the_overhead_interval_and_the_rounds_it_would_take():
    """Paired rounds' ratios give a geometric mean with Student's t interval; its width says whether a 1% cost can
    be told apart, and how many rounds at that spread would tell it."""
    import math

    from lit_compute.bench._common import ratio_interval
    from lit_compute.bench.overhead import resolved, rounds_to_resolve

    center, low, high = ratio_interval([1.0, 1.02, 0.98, 1.0])
    assert low < 1.0 < high
    assert center == pytest.approx(1.0, abs=1e-3)
    assert ratio_interval([1.05]) == (pytest.approx(1.05), 0.0, math.inf)  # one round: no interval
    one_percent = math.log1p(0.01)
    assert resolved([1.001, 0.999, 1.002, 0.998, 1.0], one_percent)
    assert not resolved([1.0, 1.02, 0.98, 1.0], one_percent)
    needed = rounds_to_resolve([1.0, 1.02, 0.98, 1.0], one_percent)
    assert needed is not None
    assert 4 < needed < 100
    assert rounds_to_resolve([1.0, 1.02], one_percent) is None  # too few rounds to know the spread


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds 0: at least 1 round"),
        (["--resolve", "0"], "--resolve 0.0: a percent between 0 and 100"),
        (["--resolve", "1", "--rounds", "8", "--max-rounds", "4"], "--max-rounds 4 is below --rounds 8"),
    ],
)
def test_bad_overhead_arguments_are_refused_before_training(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "overhead", "--callback", "step_time", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err

"""emunum.report on hand-made sweep trees: per-format statistics against Python's statistics module,
edge cases (not reached, diverged, failed jobs, missing or unreached baseline), the three renderings, the
TensorBoard curves and the convergence plot."""
from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from emunum.analysis import curves, report
from emunum.analysis.report import OutputFormat, Status


def make_run(root: Path, job: str, fmt: str, status: str, iters=None, seed=0, curve=None, *, target=0.9,
             best=None, spi=0.01, hydra=True, results=True, extra=None, eval_every=100) -> Path:
    """A run directory as train.py + Hydra lay it out: results.json, .hydra/config.yaml, tensorboard/."""
    d = root / job
    d.mkdir(parents=True)
    if hydra:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "config.yaml").write_text(f"format:\n  name: {fmt}\n  fmt: null\nseed: {seed}\n")
    if results:
        res = dict(format=fmt, status=status, iterations_to_accuracy=iters, target_accuracy=target,
                   best_accuracy=best if best is not None else (max(curve) if curve else None),
                   final_accuracy=curve[-1] if curve else None,
                   iterations_run=eval_every * len(curve) if curve else 0, seconds_per_iteration=spi, seed=seed)
        res.update(extra or {})
        (d / "results.json").write_text(json.dumps(res))
    if curve:
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(str(d / "tensorboard"))
        for k, v in enumerate(curve):
            w.add_scalar("val/accuracy", v, eval_every * (k + 1))
        w.close()
    return d


# fp32 reaches in 400 and 500; fp8 reaches once (600), once not; bf16 reaches at 300 and diverges once
CURVES = {
    "0": ("fp32", "reached", 400, 0, [0.3, 0.6, 0.85, 0.91]),
    "1": ("fp32", "reached", 500, 1, [0.3, 0.5, 0.8, 0.88, 0.92]),
    "2": ("fp8", "reached", 600, 0, [0.2, 0.4, 0.6, 0.8, 0.85, 0.91]),
    "3": ("fp8", "not_reached", None, 1, [0.2, 0.4, 0.6, 0.7, 0.8, 0.85, 0.86]),
    "4": ("bf16", "reached", 300, 0, [0.5, 0.8, 0.95]),
    "5": ("bf16", "diverged", None, 1, [0.5, 0.7]),
}


@pytest.fixture
def sweep(tmp_path) -> Path:
    for job, (fmt, st, it, seed, curve) in CURVES.items():
        make_run(tmp_path, job, fmt, st, it, seed, curve)
    return tmp_path


def _by(rep):
    return {s.format: s for s in rep.summaries}


def _observed(row):
    """A CURVES row's iterations: reached at its iterations, censored at the iterations it ran."""
    fmt, st, it, seed, curve = row
    return (it, False) if st == "reached" else (100 * len(curve), True)


def test_summary_matches_statistics_module_per_format(sweep):
    rep = report.summarize(report.load_sweep(sweep))
    s = _by(rep)
    assert [x.format for x in rep.summaries] == ["fp32", "fp8", "bf16"]  # baseline first, then first seen
    for fmt in ("fp32", "fp8", "bf16"):
        rows = [c for c in CURVES.values() if c[0] == fmt]
        obs = [_observed(c)[0] for c in rows]
        best = [max(c[4]) for c in rows]
        assert s[fmt].runs == len(rows)
        assert s[fmt].reached == sum(c[1] == "reached" for c in rows)
        assert s[fmt].iters_censored == sum(_observed(c)[1] for c in rows)
        assert s[fmt].iters_mean == statistics.fmean(obs)
        assert s[fmt].iters_median == statistics.median(obs)
        assert s[fmt].iters_std == statistics.stdev(obs)
        assert (s[fmt].iters_min, s[fmt].iters_max) == (min(obs), max(obs))
        assert s[fmt].best_acc_mean == pytest.approx(statistics.fmean(best), rel=0, abs=1e-15)
        assert s[fmt].best_acc_max == max(best)
        # seeds 0 and 1 in every format: the ratio is the paired one
        assert s[fmt].ratio == statistics.fmean(obs) / statistics.fmean([400, 500])
        assert s[fmt].ratio_paired is (fmt != "fp32")
    assert (s["bf16"].diverged, s["fp8"].diverged, s["fp32"].diverged) == (1, 0, 0)
    # a censored run opens the interval above, and its format's note says so
    assert s["fp32"].iters_ci_high == 500 and s["fp32"].iters_ci_low == 400
    assert s["fp8"].iters_ci_high == math.inf and s["fp8"].ratio_ci_high == math.inf
    assert [n.split(":")[0] for n in rep.notes] == ["fp8", "bf16"]


def test_not_reached_and_diverged_runs_are_censored_lower_bounds_not_dropped(tmp_path):
    make_run(tmp_path, "0", "fp32", "reached", 200, 0, [0.95, 0.96])
    make_run(tmp_path, "3", "fp32", "reached", 200, 1, [0.95, 0.96])
    make_run(tmp_path, "1", "fp8", "not_reached", None, 0, [0.5] * 40)  # ran 4000 iterations
    make_run(tmp_path, "2", "fp8", "diverged", None, 1, [0.1] * 3)  # ran 300
    s = _by(report.summarize(report.load_sweep(tmp_path)))["fp8"]
    assert (s.runs, s.reached, s.diverged, s.failed, s.iters_censored) == (2, 0, 1, 0, 2)
    assert s.iters_mean == 2150.0 and s.ratio == 2150.0 / 200
    assert s.iters_ci_high == math.inf and s.ratio_ci_high == math.inf
    text = report.render(report.summarize(report.load_sweep(tmp_path)))
    assert ">= 2150.0 [300, inf]" in text and "0/2" in text


def test_a_format_that_never_reaches_while_the_baseline_does_is_slower(tmp_path):
    for seed in range(3):
        make_run(tmp_path, f"a{seed}", "fp32", "reached", 300 + 100 * seed, seed, [0.95] * 5)
        make_run(tmp_path, f"b{seed}", "fp4", "not_reached", None, seed, [0.5] * 40)
    s = _by(report.summarize(report.load_sweep(tmp_path)))["fp4"]
    assert s.ratio_ci_low == 4000 / 500 and s.ratio_ci_high == math.inf and s.verdict == "slower"


def test_missing_baseline_gives_a_note_naming_it_and_no_ratios(sweep):
    rep = report.summarize(report.load_sweep(sweep), baseline="fp16")
    assert all(s.ratio is None and s.verdict == "not distinguishable" for s in rep.summaries)
    assert "'fp16' is not in the sweep" in rep.notes[0] and "fp32, fp8, bf16" in rep.notes[0]
    assert "note: baseline 'fp16' is not in the sweep" in report.render(rep, "text")


def test_baseline_that_never_reached_gives_a_note_and_no_ratios(tmp_path):
    make_run(tmp_path, "0", "fp32", "not_reached", None, 0, [0.5])
    make_run(tmp_path, "1", "bf16", "reached", 100, 0, [0.95])
    rep = report.summarize(report.load_sweep(tmp_path))
    assert _by(rep)["bf16"].ratio is None and _by(rep)["bf16"].iters_mean == 100
    assert rep.notes[0] == "baseline 'fp32' never reached the target in 1 run(s): no ratios"


def test_other_baseline_name_sets_the_ratios(sweep):
    s = _by(report.summarize(report.load_sweep(sweep), baseline="bf16"))
    assert s["bf16"].ratio == 1.0 and s["fp32"].ratio == 450 / 250 and s["fp8"].ratio == 650 / 250
    assert report.summarize(report.load_sweep(sweep), baseline="bf16").summaries[0].format == "bf16"


def test_job_without_results_json_is_a_failed_run_with_its_config_format(sweep):
    make_run(sweep, "6", "fp8", "", seed=2, results=False)
    runs = report.load_sweep(sweep)
    failed = [r for r in runs if r.status == Status.FAILED]
    assert [(r.format, r.seed, r.path.name) for r in failed] == [("fp8", 2, "6")]
    rep = report.summarize(runs)
    assert _by(rep)["fp8"].failed == 1 and _by(rep)["fp8"].runs == 3
    assert _by(rep)["fp8"].iters_mean == 650  # the failed run changes no statistic
    assert any("failed run" in n and "6" in n and "no results.json" in n for n in rep.notes)


def test_recorded_failure_shows_its_reason(tmp_path):
    make_run(tmp_path, "0", "fp32", "failed", None, 0, None, extra={"reason": "ValueError: batch_size=0"})
    rep = report.summarize(report.load_sweep(tmp_path))
    assert _by(rep)["fp32"].failed == 1
    assert any("ValueError: batch_size=0" in n for n in rep.notes)


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"format": "fp8", "status": "done"}), "status='done' is not a status"),
    (json.dumps({"format": "", "status": "reached"}), "format='' must be a non-empty string"),
    (json.dumps({"format": "fp8", "status": "reached", "iterations_to_accuracy": None}), "needs an integer"),
    (json.dumps({"format": "fp8", "status": "reached", "iterations_to_accuracy": 1.5}),
     "iterations_to_accuracy=1.5 is not an integer"),
    (json.dumps({"format": "fp8", "status": "not_reached", "best_accuracy": "high"}),
     "best_accuracy='high' is not a number"),
])
def test_malformed_results_json_raises_naming_file_and_field(tmp_path, content, message):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "results.json").write_text(content)
    with pytest.raises(ValueError, match="results.json") as e:
        report.load_sweep(tmp_path)
    assert message in str(e.value)


def test_missing_or_empty_sweep_directory_raises(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        report.load_sweep(tmp_path / "nope")
    with pytest.raises(ValueError, match="holds no runs"):
        report.load_sweep(tmp_path)


def test_runs_are_ordered_by_numeric_job_number(tmp_path):
    for job in ("10", "2", "1"):
        make_run(tmp_path, job, "fp32", "reached", int(job) * 100, int(job), [0.95])
    assert [r.path.name for r in report.load_sweep(tmp_path)] == ["1", "2", "10"]


def test_seed_falls_back_to_the_hydra_config(tmp_path):
    d = make_run(tmp_path, "0", "fp32", "reached", 100, 7, [0.95])
    res = json.loads((d / "results.json").read_text())
    del res["seed"]
    (d / "results.json").write_text(json.dumps(res))
    assert report.load_sweep(tmp_path)[0].seed == 7


def test_csv_holds_every_statistic_at_full_precision(sweep):
    rep = report.summarize(report.load_sweep(sweep))
    rows = list(csv.DictReader(io.StringIO(report.render(rep, "csv"))))
    assert [r["format"] for r in rows] == ["fp32", "fp8", "bf16"]
    for row, s in zip(rows, rep.summaries):
        assert float(row["iters_mean"]) == s.iters_mean
        assert (float(row["iters_std"]) if row["iters_std"] else None) == s.iters_std
        assert float(row["ratio"]) == s.ratio
        assert float(row["best_acc_mean"]) == s.best_acc_mean
        for col in ("iters_ci_low", "iters_ci_high", "ratio_ci_low", "ratio_ci_high"):
            assert float(row[col]) == getattr(s, col)
        assert row["verdict"] == s.verdict
        assert (int(row["runs"]), int(row["reached"]), int(row["diverged"])) == (s.runs, s.reached, s.diverged)


def test_markdown_table_has_one_row_per_format_and_equal_column_counts(sweep):
    rep = report.summarize(report.load_sweep(sweep), baseline="fp16")
    md = report.render(rep, "md")
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(lines) == 2 + 3
    assert len({ln.count("|") for ln in lines}) == 1
    assert lines[2].startswith("| fp32 | 2 | 2/2 | 0 | 0 | 450.0 [400, 500] | 450.0 | n/a |")
    assert "- baseline 'fp16' is not in the sweep" in md


def test_text_table_columns_line_up(sweep):
    text = report.render(report.summarize(report.load_sweep(sweep)), "text")
    lines = text.splitlines()[:5]
    # the right edge of every right-aligned numeric column is at the same offset on every line
    dashes = lines[1]
    edges = [i for i in range(len(dashes)) if dashes[i] == "-" and (i + 1 == len(dashes) or dashes[i + 1] == " ")]
    for ln in lines[2:]:
        for e in edges[1:]:
            assert ln[e] != " ", (ln, e)
    assert "450.0 [400, 500]" in text and ">= 650.0 [600, inf]" in text and ">= 1.444 [1.400, inf]" in text


def test_output_format_parse_names_the_bad_value():
    assert OutputFormat.parse("MD") == OutputFormat.MD
    with pytest.raises(ValueError, match=r"--format='html' is not an output format; allowed: text, md, csv"):
        OutputFormat.parse("html", "--format")


def test_tensorboard_curves_are_read_back_exactly(sweep):
    for job, (_, _, _, _, curve) in CURVES.items():
        got = curves.load_curve(sweep / job)
        assert [s for s, _ in got] == [100 * (k + 1) for k in range(len(curve))]
        assert [v for _, v in got] == [float(np.float32(v)) for v in curve]  # TensorBoard stores float32
    assert curves.load_curve(sweep / "nope") == []


def test_curve_bands_carry_stopped_runs_forward_with_a_t_interval():
    """No survivor bias: run 0 stopped at step 20 keeps 0.6 at step 30, so the mean there is (0.6+0.9)/2,
    not 0.9 from the slow run alone; the band is the Student-t 95% interval of the mean."""
    scipy_stats = pytest.importorskip("scipy.stats")
    runs = [report.Run(Path(str(i)), f, Status.REACHED) for i, f in enumerate(["a", "a", "b"])]
    per_run = {Path("0"): [(10, 0.2), (20, 0.6)], Path("1"): [(10, 0.4), (20, 0.8), (30, 0.9)],
               Path("2"): [(10, 0.1), (20, float("nan"))]}
    a, b = curves.curve_bands(runs, per_run)
    assert a.format == "a" and a.runs == 2 and a.steps == (10, 20, 30)
    pairs = ([0.2, 0.4], [0.6, 0.8], [0.6, 0.9])
    assert a.mean == tuple(math.fsum(p) / 2 for p in pairs)
    for lo, hi, p in zip(a.low, a.high, pairs):
        half = scipy_stats.t.ppf(0.975, 1) * statistics.stdev(p) / math.sqrt(2)
        assert (lo, hi) == pytest.approx((statistics.fmean(p) - half, statistics.fmean(p) + half), rel=1e-9)
    assert b.steps == (10,) and b.mean == (0.1,) and b.low == b.high == (0.1,)  # NaN skipped; one run: no width


def test_loss_plot_has_training_and_validation_panels(tmp_path):
    import matplotlib.image
    from torch.utils.tensorboard import SummaryWriter

    for k in range(2):
        d = make_run(tmp_path, str(k), "fp32", "reached", 100, k, [0.9])
        w = SummaryWriter(str(d / "tensorboard"))
        for it in range(1, 101):
            w.add_scalar("train/loss", 2.0 / it, it)
        w.add_scalar("val/loss", 0.3 + k / 10, 100)
        w.close()
    path = curves.loss_plot(report.load_sweep(tmp_path), tmp_path / "loss.png")
    h, w_ = matplotlib.image.imread(path).shape[:2]
    assert (w_, h) == (2 * 7 * 120, int(4.5 * 120))
    with pytest.raises(ValueError, match="no loss curves"):
        empty = tmp_path / "empty"
        make_run(empty, "0", "fp32", "reached", 100, 0, None)
        curves.loss_plot(report.load_sweep(empty), tmp_path / "x.png")


def test_convergence_plot_writes_a_png(sweep, tmp_path):
    import matplotlib.image

    path = curves.convergence_plot(report.load_sweep(sweep), tmp_path / "out" / "convergence.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h, w = matplotlib.image.imread(path).shape[:2]
    assert (w, h) == (7 * 120, int(4.5 * 120))


def test_plot_without_curves_raises_a_clear_error(tmp_path):
    make_run(tmp_path, "0", "fp32", "reached", 100, 0, None)
    with pytest.raises(ValueError, match="no validation-accuracy curves"):
        curves.convergence_plot(report.load_sweep(tmp_path), tmp_path / "c.png")


def test_different_targets_are_flagged(tmp_path):
    make_run(tmp_path, "0", "fp32", "reached", 100, 0, [0.95], target=0.9)
    make_run(tmp_path, "1", "fp32", "reached", 100, 1, [0.95], target=0.8)
    assert any("different target accuracies" in n for n in report.summarize(report.load_sweep(tmp_path)).notes)


def test_loading_does_not_write_into_the_sweep(sweep):
    before = sorted((p, p.stat().st_mtime_ns) for p in sweep.rglob("*"))
    report.summarize(report.load_sweep(sweep))
    assert sorted((p, p.stat().st_mtime_ns) for p in sweep.rglob("*")) == before
    assert math.isfinite(_by(report.summarize(report.load_sweep(sweep)))["fp8"].ratio)

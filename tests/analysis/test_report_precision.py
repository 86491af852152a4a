"""emunum report averages results.json's iterations_estimate where runs have one, and --until-ci says whether
each ratio is within ±REL, how many seeds it took, and that an answer at the cap is not precise."""
from __future__ import annotations

import json

import pytest

from emunum import cli
from emunum.analysis import report, sequential, stats


def _run(root, job, fmt, seed, iters, estimate=None, estimator="interpolated", status="reached"):
    d = root / job
    d.mkdir(parents=True)
    (d / ".hydra").mkdir()
    (d / ".hydra" / "config.yaml").write_text(f"format:\n  name: {fmt}\n  fmt: null\nseed: {seed}\n")
    res = dict(format=fmt, status=status, iterations_to_accuracy=iters, target_accuracy=0.88, iterations_run=iters,
               seconds_per_iteration=0.01, seed=seed)
    if estimate is not None:
        res.update(iterations_estimate=estimate, estimator=estimator)
    (d / "results.json").write_text(json.dumps(res))


def test_the_mean_is_over_the_estimates_and_the_note_names_the_estimator(tmp_path):
    for s, (a, b) in enumerate([(420, 411.5), (500, 487.25), (460, 455.0)]):
        _run(tmp_path, f"b{s}", "fp32", s, a, b)
    rep = report.summarize(report.load_sweep(tmp_path))
    assert rep.summaries[0].iters_mean == stats.mean_interval([411.5, 487.25, 455.0]).estimate
    assert any("the interpolated crossing" in n for n in rep.notes)


def test_mixed_estimators_are_flagged(tmp_path):
    _run(tmp_path, "a", "fp32", 0, 420, 411.5)
    _run(tmp_path, "b", "fp32", 1, 500)  # an older run: first crossing only
    rep = report.summarize(report.load_sweep(tmp_path))
    assert rep.summaries[0].iters_mean == (411.5 + 500) / 2
    assert any("different estimators (first, interpolated)" in n for n in rep.notes)


@pytest.mark.parametrize("bad", [-1.0, "400", True])
def test_a_bad_estimate_names_the_field(tmp_path, bad):
    _run(tmp_path, "a", "fp32", 0, 420, 1.0)
    p = tmp_path / "a" / "results.json"
    d = json.loads(p.read_text())
    d["iterations_estimate"] = bad
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="iterations_estimate"):
        report.load_sweep(tmp_path)


def _pairs(root, n, spread):
    for s in range(n):
        x = 500 + spread * ((s % 3) - 1)
        _run(root, f"b{s}", "fp32", s, x, float(x))
        _run(root, f"f{s}", "fp8", s, 800, 800.0 + 3 * spread * ((s % 2) - 0.5))


def test_until_ci_says_precise_and_how_many_seeds(tmp_path, capsys):
    _pairs(tmp_path, 6, 10)
    assert cli.main(["report", str(tmp_path), "--no-plot", "--until-ci", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 6 per format (fp8); precise: fp8/fp32 " in out and "<= ±10% after 6 seeds per format" in out


def test_until_ci_at_the_cap_says_not_yet_precise(tmp_path, capsys):
    _pairs(tmp_path, 6, 200)
    assert cli.main(["report", str(tmp_path), "--no-plot", "--until-ci", "0.01", "--seed-cap", "6"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 6 per format (fp8); NOT YET PRECISE" in out and "the cap (6)" in out
    d = sequential.check_sweep(report.load_sweep(tmp_path), "fp32", sequential.Rule(rel=0.01, cap=6))[0][1]
    assert not d.precise and d.stop


def test_until_ci_below_the_cap_names_the_next_seed_count(tmp_path, capsys):
    _pairs(tmp_path, 6, 200)
    assert cli.main(["report", str(tmp_path), "--no-plot", "--until-ci", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 6 per format (fp8); not yet precise" in out and "next: 8 seeds" in out


@pytest.mark.parametrize("args,msg", [(["--until-ci", "0"], "rel=0.0"), (["--until-ci", "0.1", "--seed-cap", "1"],
                                                                          "cap=1")])
def test_bad_until_ci_arguments_fail_with_the_field(tmp_path, capsys, args, msg):
    _pairs(tmp_path, 2, 10)
    assert cli.main(["report", str(tmp_path), "--no-plot", *args]) == 2
    assert msg in capsys.readouterr().err

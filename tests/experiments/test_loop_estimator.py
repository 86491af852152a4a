"""results.json carries the chosen iterations-to-accuracy estimator beside the first-crossing keys: its name
and its figure, read from the same evaluations TensorBoard holds; a smoothed estimator keeps a run that stops
at the target evaluating until its estimate is settled."""
from __future__ import annotations

import json

import pytest

from emunum.analysis import crossing
from experiments import loop, results
from experiments.loop import RESULT_KEYS, train


def _curve(run_dir):
    from emunum.analysis.curves import load_curve

    return load_curve(run_dir)


def test_results_name_the_estimator_and_hold_its_figure(compose, tmp_path):
    res = train(compose("max_iters=200", "eval_every=5", "target_accuracy=0.3", "batch_size=100"), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data)[: len(RESULT_KEYS)] == list(RESULT_KEYS)  # the contract keys stay, first
    assert "nan_origin" in data and data["estimator"] == loop.TTA_ESTIMATOR.value == "first"
    assert data["iterations_estimate"] == data["iterations_to_accuracy"] == res.iterations_estimate
    assert data["iterations_estimate"] == crossing.first_crossing(_curve(tmp_path), 0.3)


@pytest.mark.parametrize("estimator", [crossing.Estimator.INTERPOLATED, crossing.Estimator.SMOOTHED])
def test_other_estimators_read_the_same_evaluations(compose, tmp_path, monkeypatch, estimator):
    monkeypatch.setattr(results, "TTA_ESTIMATOR", estimator)  # where the loop reads it
    res = train(compose("max_iters=400", "eval_every=5", "target_accuracy=0.3", "batch_size=100"), tmp_path)
    # TensorBoard stores float32 accuracies; the loop's are the exact fractions, equal after rounding
    expected = crossing.estimate(estimator, _curve(tmp_path), 0.3)
    assert res.estimator == estimator.value
    assert res.iterations_estimate == pytest.approx(expected, rel=1e-5)
    if estimator is crossing.Estimator.INTERPOLATED:
        assert res.iterations_to_accuracy - 5 < res.iterations_estimate <= res.iterations_to_accuracy


def test_a_run_that_never_reaches_has_no_estimate(compose, tmp_path):
    train(compose("max_iters=6", "eval_every=3"), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["status"] == "not_reached" and data["iterations_estimate"] is None
    assert data["estimator"] == loop.TTA_ESTIMATOR.value


def test_smoothed_estimator_keeps_evaluating_until_settled(compose, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "TTA_ESTIMATOR", crossing.Estimator.SMOOTHED)
    res = train(compose("max_iters=400", "eval_every=5", "target_accuracy=0.3", "batch_size=100"), tmp_path)
    pts = _curve(tmp_path)
    assert res.status == "reached" and res.estimator == "smoothed"
    assert res.iterations_run > res.iterations_to_accuracy  # it went on past the first crossing
    # ...exactly until the smoothed estimate was settled, and not one evaluation longer
    assert crossing.settled(crossing.Estimator.SMOOTHED, pts, 0.3)
    assert not crossing.settled(crossing.Estimator.SMOOTHED, pts[:-1], 0.3)
    assert res.iterations_estimate == pytest.approx(crossing.smoothed_crossing(pts, 0.3), rel=1e-5)

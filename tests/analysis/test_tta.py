"""emunum.tta (TTA combination, per-iteration time inputs) and emunum.flops (FLOP/element counts, hardware
descriptions, roofline), against hand-computed values."""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from emunum.analysis import tta
from emunum.analysis.flops import Hardware, IterationCost, count_iteration, hardware_dirs
from emunum.analysis.report import FormatSummary

ROOT = Path(__file__).resolve().parents[2]


def summary(fmt, iters, runs=2, reached=None):
    reached = (runs if iters is not None else 0) if reached is None else reached
    return FormatSummary(fmt, runs, reached, 0, 0, iters, None, None, None, None, None, None, None)


# dyadic times and integer iterations: every product and quotient below is exact or a single rounding
SUMS = [summary("fp32", 400.0), summary("bf16", 440.0), summary("fp8", 600.0)]
TIMES = {"fp32": 0.03125, "bf16": 0.015625, "fp8": 0.0078125}


# ---------------------------------------------------------------------------------------------------------
# combination
# ---------------------------------------------------------------------------------------------------------
def test_tta_factors_match_exact_rational_arithmetic():
    rep = tta.combine(SUMS, TIMES)
    assert [r.format for r in rep.rows] == ["fp32", "bf16", "fp8"]
    for r in rep.rows:
        it, t = Fraction(r.iterations), Fraction(TIMES[r.format])
        bit, bt = Fraction(400), Fraction(TIMES["fp32"])
        assert r.tta_seconds == float(it * t)
        assert r.throughput_gain == float(bt / t)
        assert r.stat_efficiency_loss == float(it / bit)
        assert r.speedup == float((bit * bt) / (it * t))
    fp8 = rep.rows[2]
    assert (fp8.throughput_gain, fp8.stat_efficiency_loss) == (4.0, 1.5)
    assert fp8.speedup == fp8.throughput_gain / fp8.stat_efficiency_loss  # the methodology's identity
    assert rep.rows[0].speedup == 1.0 and rep.notes == ()


def test_format_that_never_reached_or_has_no_time_gets_na_and_a_note():
    sums = SUMS + [summary("fp4", None, runs=3), summary("e4m3", 500.0)]
    rep = tta.combine(sums, {**TIMES, "fp4": 0.001})
    fp4, e4m3 = rep.rows[3], rep.rows[4]
    assert fp4.tta_seconds is None and fp4.speedup is None and fp4.stat_efficiency_loss is None
    assert fp4.throughput_gain == 31.25  # the time is known, the iterations are not
    assert e4m3.seconds_per_iteration is None and e4m3.tta_seconds is None and e4m3.throughput_gain is None
    assert e4m3.stat_efficiency_loss == 1.25
    assert "'fp4' never reached the target in 3 run(s): its TTA is n/a" in rep.notes
    assert "no seconds per iteration for 'e4m3': its TTA is n/a" in rep.notes


def test_missing_baseline_leaves_tta_and_names_the_baseline():
    rep = tta.combine(SUMS[1:], TIMES, baseline="fp32")
    assert [r.tta_seconds for r in rep.rows] == [440 * 0.015625, 600 * 0.0078125]
    assert all(r.speedup is None and r.stat_efficiency_loss is None for r in rep.rows)
    assert [r.throughput_gain for r in rep.rows] == [2.0, 4.0]  # the baseline's time alone gives the gain
    assert "baseline 'fp32' is not in the sweep (formats: bf16, fp8)" in rep.notes[0]


def test_baseline_without_time_or_reach_gives_notes():
    rep = tta.combine(SUMS, {"bf16": 0.1, "fp8": 0.1})
    assert all(r.speedup is None and r.throughput_gain is None for r in rep.rows)
    assert rep.rows[1].stat_efficiency_loss == 1.1
    assert any("no seconds per iteration for the baseline 'fp32'" in n for n in rep.notes)
    rep = tta.combine([summary("fp32", None)] + SUMS[1:], TIMES)
    assert all(r.speedup is None and r.stat_efficiency_loss is None for r in rep.rows)
    assert rep.rows[1].throughput_gain == 2.0
    assert any("baseline 'fp32' never reached the target" in n for n in rep.notes)


def test_render_text_md_csv():
    import csv
    import io

    rep = tta.combine(SUMS, TIMES)
    text = tta.render(rep, "text")
    assert "fp8" in text and "4.000x" in text and "1.500x" in text and "2.667x" in text
    assert "speed-up = TTA(fp32) / TTA = throughput gain / stat. eff. loss" in text
    md = tta.render(rep, "md").splitlines()
    assert md[0].startswith("| format | reached | iters (mean) | s/iter | TTA (s) | throughput gain |")
    assert md[4] == "| fp8 | 2/2 | 600.0 | 0.007812 | 4.688 | 4.000x | 1.500x | 2.667x |"
    rows = list(csv.DictReader(io.StringIO(tta.render(rep, "csv"))))
    assert float(rows[2]["speedup"]) == rep.rows[2].speedup and float(rows[1]["tta_seconds"]) == 6.875


# ---------------------------------------------------------------------------------------------------------
# per-iteration time inputs
# ---------------------------------------------------------------------------------------------------------
def test_parse_pairs():
    assert tta.parse_pairs(["fp32=0.031", "fp8=1.2e-2", " bf16 = 2 "]) == {"fp32": 0.031, "fp8": 0.012, "bf16": 2.0}


@pytest.mark.parametrize("pair, message", [
    ("fp8", "'fp8' is not NAME=SECONDS"),
    ("fp8:0.1", "'fp8:0.1' is not NAME=SECONDS"),
    ("a=b=c", "'a=b=c' is not NAME=SECONDS"),
    ("=0.1", "'=0.1' has no format name"),
    ("fp8=", "'' is not a number of seconds"),
    ("fp8=fast", "'fast' is not a number of seconds"),
    ("fp8=0", "'0' must be a positive finite number"),
    ("fp8=-1", "'-1' must be a positive finite number"),
    ("fp8=nan", "'nan' must be a positive finite number"),
    ("fp8=inf", "'inf' must be a positive finite number"),
])
def test_malformed_pair_raises_naming_it(pair, message):
    with pytest.raises(ValueError) as e:
        tta.parse_pairs(["fp32=0.1", pair])
    assert message in str(e.value) and "--seconds-per-iteration" in str(e.value)


def test_duplicate_format_raises():
    with pytest.raises(ValueError, match="format 'fp8' is given twice"):
        tta.parse_pairs(["fp8=0.1", "fp8=0.2"])


@pytest.mark.parametrize("name, text", [
    ("sim.yaml", "fp32: 0.031\nfp8: 1.2e-2\n"),
    ("sim.yml", "seconds_per_iteration:\n  fp32: 0.031\n  fp8: 0.012\n"),
    ("sim.yaml", "- {format: fp32, seconds_per_iteration: 0.031}\n- {format: fp8, seconds_per_iteration: 0.012}\n"),
    ("sim.csv", "format,seconds_per_iteration,cycles\nfp32,0.031,100\nfp8,0.012,40\n"),
])
def test_sim_files_in_every_layout_give_the_same_times(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert tta.load_sim(tmp_path / name) == {"fp32": 0.031, "fp8": 0.012}


@pytest.mark.parametrize("name, text, message", [
    ("sim.json", "{}", "unknown file type '.json'; allowed: .yaml, .yml, .csv"),
    ("sim.yaml", "fp8: fast\n", "seconds per iteration of 'fp8': 'fast' is not a number"),
    ("sim.yaml", "fp8: -0.5\n", "'fp8': -0.5 must be a positive finite number"),
    ("sim.yaml", "- {format: fp8}\n", "record 0 ({'format': 'fp8'}) needs keys format and seconds_per_iteration"),
    ("sim.yaml", "0.5\n", "expected a mapping format -> seconds or a list of records, got 0.5"),
    ("sim.yaml", "{}\n", "no formats in the file"),
    ("sim.yaml", "fp8: [1\n", "is not valid YAML"),
    ("sim.csv", "name,seconds\nfp8,0.1\n", "no 'format' column"),
    ("sim.csv", "format,seconds_per_iteration\nfp32,0.1\nfp8,x\n", "line 3: seconds per iteration of 'fp8': 'x'"),
])
def test_bad_sim_file_raises_naming_the_value(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as e:
        tta.load_sim(tmp_path / name)
    assert message in str(e.value)


def test_sim_file_missing_raises(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        tta.load_sim(tmp_path / "missing.yaml")


def test_unknown_format_in_times_raises_naming_it_and_the_sweep_formats():
    with pytest.raises(ValueError, match=r"--sim s.yaml: format 'fp4' is not in the sweep; the sweep's formats: "
                                         r"fp32, fp8"):
        tta.check_known({"fp32": 1.0, "fp4": 1.0}, ["fp32", "fp8"], "--sim s.yaml")


# ---------------------------------------------------------------------------------------------------------
# FLOP and element counts
# ---------------------------------------------------------------------------------------------------------
B, IN, H, OUT = 8, 12, 16, 5


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, H), torch.nn.ReLU(), torch.nn.Linear(H, OUT))


def test_mlp_flops_and_elements_match_the_formula():
    x = torch.randn(B, IN)
    c = count_iteration(_mlp(), x, None, lambda out, _t: out.sum())
    # forward: 2 MACs-worth per product; backward: weight grads of both layers, input grad of layer 2 only
    fwd = 2 * B * (IN * H + H * OUT)
    bwd = 2 * B * (IN * H + H * OUT) + 2 * B * H * OUT
    assert c.flops == fwd + bwd
    assert c.param_elements == IN * H + H + H * OUT + OUT
    assert c.activation_elements == B * H + B * H + B * OUT + 1  # addmm, relu, addmm, sum
    assert c.input_elements == B * IN
    assert c.traffic_elements == 5 * c.param_elements + 5 * c.activation_elements + B * IN
    assert c.bytes(8) == c.traffic_elements and c.bytes(4) == c.traffic_elements / 2


def test_conv_flops_match_the_formula():
    conv = torch.nn.Conv1d(3, 4, 5, stride=1, bias=False)
    x = torch.randn(2, 3, 20)
    c = count_iteration(conv, x, None, lambda out, _t: out.sum())
    macs = 2 * 4 * 16 * 3 * 5  # batch, out channels, out length, in channels, kernel
    assert c.flops == 2 * macs + 2 * macs  # forward + weight gradient (the input needs no gradient)


def test_count_iteration_leaves_the_callers_model_untouched():
    m = torch.nn.Sequential(torch.nn.Linear(IN, H), torch.nn.BatchNorm1d(H), torch.nn.Linear(H, OUT)).eval()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    count_iteration(m, torch.randn(B, IN), torch.randint(0, OUT, (B,)))
    assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())
    assert all(p.grad is None for p in m.parameters()) and not m.training


def test_count_iteration_rejects_non_modules():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        count_iteration(lambda x: x, torch.randn(2))
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor, got list"):
        count_iteration(_mlp(), [1.0])


# ---------------------------------------------------------------------------------------------------------
# hardware and roofline
# ---------------------------------------------------------------------------------------------------------
HW = Hardware.from_dict({"name": "toy", "peak_flops": {32: 1e12, 16: 4e12, 8: 8e12}, "memory_bandwidth": 1e11})


@pytest.mark.parametrize("bits, width", [(32, 32), (19, 32), (17, 32), (16, 16), (9, 16), (8, 8), (6, 8), (4, 8)])
def test_width_class_is_the_smallest_listed_width_that_holds_the_format(bits, width):
    assert HW.width_class(bits) == width


def test_wider_than_every_width_raises():
    with pytest.raises(ValueError, match="a 64-bit format is wider than every width of hardware 'toy' "
                                         r"\(8, 16, 32 bits\)"):
        HW.width_class(64)


def test_roofline_is_the_max_of_compute_and_memory_time():
    compute_heavy = IterationCost(flops=8 * 10**12, param_elements=1000, activation_elements=0, input_elements=0)
    r = HW.roofline(compute_heavy, 8)
    assert (r.width, r.compute_seconds, r.memory_seconds) == (8, 1.0, 5000 / 1e11)
    assert r.seconds == 1.0 and r.bound == "compute"
    memory_heavy = IterationCost(flops=10**6, param_elements=10**9, activation_elements=10**9, input_elements=0)
    r = HW.roofline(memory_heavy, 16)
    assert r.memory_seconds == 10 * 10**9 * 2 / 1e11 and r.seconds == r.memory_seconds and r.bound == "memory"
    assert HW.roofline(memory_heavy, 32).seconds == 2 * r.seconds  # twice the bytes at 32 bits


@pytest.mark.parametrize("d, message", [
    ({"peak_flops": {32: 1e12}}, "missing key 'memory_bandwidth'"),
    ({"peak_flops": {32: "67e12"}, "memory_bandwidth": 1e11}, "peak_flops[32]='67e12' must be a positive"),
    ({"peak_flops": {"fp8": 1e12}, "memory_bandwidth": 1e11}, "peak_flops width 'fp8' must be an int"),
    ({"peak_flops": {}, "memory_bandwidth": 1e11}, "must be a non-empty mapping"),
    ({"peak_flops": {32: 1e12}, "memory_bandwidth": 0}, "memory_bandwidth=0 must be a positive"),
    ({"peak_flops": {32: 1e12}, "memory_bandwidth": 1e11, "bandwidth": 1}, "unknown key(s) ['bandwidth']"),
])
def test_bad_hardware_description_raises_naming_the_field(d, message):
    with pytest.raises(ValueError) as e:
        Hardware.from_dict(d, where="hw.yaml")
    assert message in str(e.value) and "hw.yaml" in str(e.value)


@pytest.mark.parametrize("name", ["h100_like", "a100_like"])
def test_shipped_hardware_descriptions_load_with_float_rates(name):
    hw = Hardware.load(name)
    assert hw.name == name and hw.source
    assert [w for w, _ in hw.peak_flops][-3:] == [8, 16, 32]
    rates = [p for _, p in hw.peak_flops]
    assert rates == sorted(rates, reverse=True)  # narrower operands are never slower
    assert all(isinstance(p, float) and p > 1e12 for p in rates) and hw.memory_bandwidth > 1e12


def test_h100_like_holds_the_dense_datasheet_figures_its_comment_cites():
    hw = Hardware.load(str(ROOT / "experiments" / "conf" / "hardware" / "h100_like.yaml"))
    assert dict(hw.peak_flops) == {32: 67.0e12, 16: 1979e12 / 2, 8: 3958e12 / 2}
    assert hw.memory_bandwidth == 3.35e12


def test_unknown_hardware_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"hardware='tpu' is not a file nor a known description; known: "
                                         r"a100_like, h100_like"):
        Hardware.load("tpu")
    with pytest.raises(ValueError, match="no such file"):
        Hardware.load(str(tmp_path / "x.yaml"))
    assert any(d == ROOT / "experiments" / "conf" / "hardware" for d in hardware_dirs())


def test_format_bits_of_a_run_config():
    assert tta.format_bits({"format": {"name": "fp32", "fmt": None}}) == 32
    assert tta.format_bits({"format": {"name": "fp8", "fmt": "fp8_152"}}) == 8
    assert tta.format_bits({"format": {"name": "x", "fmt": "fixed16_12"}}) == 16
    assert tta.format_bits({"format": {"name": "x", "fmt": "fp4_e2m1"}}) == 4
    assert math.isfinite(HW.roofline(IterationCost(1, 1, 1, 1), tta.format_bits({"format": {"fmt": "bf16"}})).seconds)


def test_confidence_intervals_carry_through_tta_loss_and_speedup():
    """t_iter is exact: TTA's interval is the iterations' times t, the loss's is the ratio's, and the speed-up's
    is throughput gain over the loss interval's ends (swapped)."""
    import dataclasses

    base = dataclasses.replace(summary("fp32", 400.0, runs=5), iters_ci_low=350.0, iters_ci_high=450.0)
    fp8 = dataclasses.replace(summary("fp8", 600.0, runs=5), ratio=1.5, ratio_ci_low=1.25, ratio_ci_high=2.0,
                              iters_ci_low=500.0, iters_ci_high=720.0, verdict="slower")
    row = tta.combine([base, fp8], TIMES).rows[1]
    assert (row.tta_ci_low, row.tta_ci_high) == (500.0 * 0.0078125, 720.0 * 0.0078125)
    assert (row.loss_ci_low, row.loss_ci_high, row.stat_efficiency_loss) == (1.25, 2.0, 1.5)
    assert (row.speedup_ci_low, row.speedup_ci_high) == (4.0 / 2.0, 4.0 / 1.25)
    assert row.speedup == 4.0 / 1.5 and row.verdict == "slower"
    censored = dataclasses.replace(fp8, ratio_ci_high=math.inf, iters_ci_high=math.inf, iters_censored=1)
    row = tta.combine([base, censored], TIMES).rows[1]
    assert row.tta_ci_high == math.inf and row.speedup_ci_low == 0.0 and row.censored == 1
    assert "<= 2.667x [0, 3.2]" in tta.render(tta.combine([base, censored], TIMES))

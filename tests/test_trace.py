"""emunum.trace: exact counters against a numpy oracle, per-role counts on patched layers, exports.

All comparisons have zero tolerance. Signal and noise sums are compared on dyadic values (k/64, |k| <= 64)
whose squares, differences and sums are exact in any summation order in float64 and in float32 (the CPU
counters' lane sums: every partial sum of a chunk lies below 2**12 on the grid of 2**-12); the special
values (inf, NaN, overflow, flushed tiny values) are compared in counts, and their exclusion from the sums on a hand-made case.
"""
import copy
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import emunum
from emunum import trace
from emunum.policy import Role
from emunum.trace import accumulate, stats_torch

E5M2 = emunum.get_format("e5m2")


def oracle(x, q, lo, hi):
    x, q = np.asarray(x, np.float64).ravel(), np.asarray(q, np.float64).ravel()
    fin = np.isfinite(x) & np.isfinite(q)
    return [x.size, int(np.sum(np.isfinite(x) & ((x > hi) | (x < lo)))), int(np.sum((q == 0) & (x != 0))),
            int(np.sum(np.isnan(q))), float(np.sum(x[fin] ** 2)), float(np.sum((q[fin] - x[fin]) ** 2))]


def dyadic(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-64, 65, (n,), generator=g).float() / 64


def crafted(fmt, n, seed):
    """Dyadic values, some beyond the range, some that flush to zero, +-inf, NaN, and exact zeros."""
    x = dyadic(n, seed)
    x[:7] = torch.tensor([fmt.max * 2, -fmt.max * 4, float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    x[7:10] = fmt.min_subnormal / 4
    return x


FORMATS = {"e5m2": E5M2, "e4m3fn": emunum.get_format("e4m3fn"), "e5m2_sat": emunum.FloatFormat(5, 2, saturate=True),
           "fixed8_3": emunum.FixedFormat(8, 3), "fixed8_3_wrap": emunum.FixedFormat(8, 3, saturate=False)}


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("n", [50, 1 << 16], ids=["serial", "parallel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_counters_match_the_oracle_exactly(fmt, n, dtype):
    lo, hi = (fmt.min, fmt.max) if isinstance(fmt, emunum.FixedFormat) else (-fmt.max, fmt.max)
    x = crafted(fmt, n, seed=n).to(dtype)
    q = emunum.quantize(x, fmt)
    want = oracle(x, q, lo, hi)
    for got in (torch.zeros(6, dtype=torch.float64), stats_torch(x, q, lo, hi)):
        if got.abs().sum() == 0:
            accumulate(got, x, q, lo, hi)
        assert got[:4].tolist() == want[:4]
    assert want[1] >= 2 and want[2] >= 3 and want[3] >= 1  # the crafted cases are there
    x = dyadic(n, seed=n + 1).to(dtype)  # sums: exact in any order
    q = emunum.quantize(x, fmt)
    want = oracle(x, q, lo, hi)
    acc = torch.zeros(6, dtype=torch.float64)
    accumulate(acc, x, q, lo, hi)
    assert acc.tolist() == want and stats_torch(x, q, lo, hi).tolist() == want
    assert want[5] > 0


def test_sums_leave_out_non_finite_values():
    x = torch.tensor([float("inf"), float("nan"), 2.0, 1e6, -1.25])
    q = emunum.quantize(x, E5M2)  # inf, nan, 2, inf, -1.25
    acc = torch.zeros(6, dtype=torch.float64)
    accumulate(acc, x, q, -E5M2.max, E5M2.max)
    assert acc.tolist() == [5, 1, 0, 1, 4 + 1.5625, 0.0]
    assert stats_torch(x, q, -E5M2.max, E5M2.max).tolist() == acc.tolist()


def test_counters_accumulate_and_skip_sqnr_when_asked():
    x = dyadic(300, 1)
    q = emunum.quantize(x, E5M2)
    acc = torch.zeros(6, dtype=torch.float64)
    accumulate(acc, x, q, -E5M2.max, E5M2.max)
    accumulate(acc, x[:100], q[:100], -E5M2.max, E5M2.max, sqnr=False)
    a, b = oracle(x, q, -E5M2.max, E5M2.max), oracle(x[:100], q[:100], -E5M2.max, E5M2.max)
    assert acc.tolist() == [a[i] + b[i] for i in range(4)] + a[4:]
    assert stats_torch(x, q, -1.0, 1.0, sqnr=False)[4:].tolist() == [0.0, 0.0]


def test_non_contiguous_and_bfloat16_tensors_are_counted():
    x = dyadic(200, 2).view(20, 10).t()
    q = emunum.quantize(x, E5M2)
    acc = torch.zeros(6, dtype=torch.float64)
    accumulate(acc, x, q, -E5M2.max, E5M2.max)
    assert acc.tolist() == oracle(x.contiguous(), q.contiguous(), -E5M2.max, E5M2.max)
    xb = x.bfloat16()
    qb = emunum.quantize(xb, E5M2)
    acc.zero_()
    accumulate(acc, xb, qb, -E5M2.max, E5M2.max)  # torch path
    assert acc.tolist() == oracle(xb.float(), qb.float(), -E5M2.max, E5M2.max)


# ---- on patched layers -----------------------------------------------------------------------------------
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def test_each_role_counts_the_values_it_rounds():
    model = emunum.patch(mlp(), fmt="e5m2")
    x = torch.randn(4, 6)
    with trace.collect(model, every=1) as t:
        model(x).sum().backward()
        model(x).sum().backward()
    s = t.summary()
    assert list(s) == ["0", "1", "2"]
    # x needs no gradient, so the first layer's input gradient is never computed (nor counted)
    per_call = {"0": {"weight": 6 * 5 + 5, "input": 4 * 6, "output": 4 * 5, "grad_weight": 6 * 5 + 5,
                      "grad_input": 0, "grad_output": 4 * 5},
                "1": {"output": 4 * 5, "grad_output": 4 * 5},
                "2": {"weight": 5 * 3 + 3, "input": 4 * 5, "output": 4 * 3, "grad_weight": 5 * 3 + 3,
                      "grad_input": 4 * 5, "grad_output": 4 * 3}}
    for layer, roles in per_call.items():
        assert {r: d["values"] for r, d in s[layer].items()} == {r: 2 * n for r, n in roles.items()}
        assert all((d["calls"], d["sampled"]) == (2, 2) for d in s[layer].values())  # forward calls
    assert 10 < s["0"]["input"]["sqnr_db"] < 30  # 2 stored mantissa bits: about 6 dB per bit plus ~11
    assert s["2"]["input"]["sqnr_db"] == math.inf  # the tanh output was already rounded to e5m2


def test_overflow_underflow_and_nan_are_counted_where_they_happen():
    model = emunum.patch(nn.Sequential(nn.Linear(3, 2, bias=False), nn.ReLU()), fmt="e5m2", grad=None)
    x = torch.tensor([[1e6, 1e-9, float("nan")], [-7e4, 2.0, 3.0]])
    with trace.collect(model) as t:
        with torch.no_grad():
            model[0](x)
            model[1](x)
    inp = t.summary()["0"]["input"]
    assert (inp["values"], inp["overflow"], inp["underflow"], inp["nan"]) == (6, 2, 1, 1)
    out = t.summary()["1"]["output"]  # relu: 1e6 -> inf, 1e-9 -> 0, nan, 0 (exact zero: no underflow), 2, 3
    assert (out["values"], out["overflow"], out["underflow"], out["nan"]) == (6, 1, 1, 1)


def test_gradient_counters_see_the_gradient_before_and_after_rounding():
    model = emunum.patch(nn.Sequential(nn.Linear(2, 2, bias=False)), fmt="fp32", grad="e5m2",
                         grad_rounding="nearest")
    x = torch.ones(1, 2, requires_grad=True)
    with trace.collect(model) as t:
        model(x).backward(torch.tensor([[1e9, 2.0**-20]]))
    g = t.summary()["0"]["grad_output"]
    assert (g["values"], g["overflow"], g["underflow"], g["nan"]) == (2, 1, 1, 0)
    # 1e9 became inf (left out of the sums); 2**-20 became 0: signal = noise = 2**-40
    assert (g["signal"], g["noise"], g["sqnr_db"]) == (2.0**-40, 2.0**-40, 0.0)


def test_tracing_does_not_change_results():
    def run(traced):
        model = emunum.patch(mlp(), fmt="e4m3fn", grad="e5m2")  # stochastic gradients
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
        torch.manual_seed(11)
        t = trace.enable(model, every=1) if traced else None
        for _ in range(2):
            model(x).square().sum().backward()
        if t is not None:
            t.close()
        return [p.grad for p in model.parameters()] + [x.grad]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


def test_every_k_observes_one_call_in_k():
    model = emunum.patch(mlp(), fmt="e5m2")
    x = torch.randn(4, 6)
    with trace.collect(model, every=3) as t:
        for _ in range(7):
            model(x).sum().backward()
    d = t.summary()["0"]
    assert (d["input"]["calls"], d["input"]["sampled"], d["input"]["values"]) == (7, 3, 3 * 4 * 6)  # 0, 3, 6
    assert d["weight"]["values"] == d["grad_weight"]["values"] == 3 * (6 * 5 + 5)  # weight and bias
    assert t.summary()["2"]["grad_input"]["values"] == 3 * 4 * 5


def test_default_samples_one_forward_call_in_ten_and_names_a_bare_layer_model():
    model = emunum.patch(nn.Linear(6, 2), fmt="e5m2")
    with trace.collect(model) as t:
        for _ in range(11):
            model(torch.randn(3, 6))
    d = t.summary()["model"]["input"]
    assert (d["calls"], d["sampled"], d["values"]) == (11, 2, 2 * 18)


def test_close_stops_counting_and_reset_zeroes():
    model = emunum.patch(mlp(), fmt="e5m2")
    x = torch.randn(4, 6)
    t = trace.enable(model)
    model(x)
    t.close()
    model(x)
    assert t.summary()["0"]["input"]["values"] == 24
    assert all(m._emunum_trace is None for m in model.modules() if hasattr(m, "emunum_policy"))
    t.reset()
    assert t.summary()["0"]["input"]["values"] == 0 and t.summary()["0"]["input"]["calls"] == 0
    model(x)
    assert t.summary()["0"]["input"]["values"] == 0  # closed: the layers no longer report to it
    trace.enable(model).close()  # a new tracer may attach after close


def test_exports_json_and_tensorboard(tmp_path):
    model = emunum.patch(mlp(), fmt="e5m2")
    with trace.collect(model, sqnr=True) as t:
        model(torch.randn(4, 6) * 1e5).sum().backward()
    path = tmp_path / "trace.json"
    text = t.to_json(path)
    assert json.loads(path.read_text()) == json.loads(text)
    assert json.loads(text)["0"]["input"]["overflow"] == t.summary()["0"]["input"]["overflow"] > 0

    class Writer:
        def __init__(self):
            self.scalars = {}

        def add_scalar(self, tag, value, step):
            self.scalars[tag] = (value, step)

    w = Writer()
    t.to_tensorboard(w, 7)
    d = json.loads(text)["0"]["input"]
    assert w.scalars["emunum/0/input/overflow"] == (d["overflow"] / d["values"], 7)
    assert w.scalars["emunum/0/input/sqnr_db"][0] == pytest.approx(d["sqnr_db"])
    assert {tag.split("/")[1] for tag in w.scalars} == {"0", "1", "2"}
    assert t.summary()["0"]["input"]["values"] == 0  # reset after the export


def test_tensorboard_writer_receives_scalars(tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = emunum.patch(mlp(), fmt="e5m2")
    with trace.collect(model) as t:
        model(torch.randn(4, 6)).sum().backward()
    with SummaryWriter(tmp_path) as w:
        t.to_tensorboard(w, 3)
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert "emunum/2/grad_weight/sqnr_db" in ea.Tags()["scalars"]
    assert ea.Scalars("emunum/0/output/nan")[0].step == 3


def test_trace_errors():
    with pytest.raises(ValueError, match="no emulated layer"):
        trace.enable(mlp())
    model = emunum.patch(mlp(), fmt="e5m2")
    with pytest.raises(ValueError, match="every=0"):
        trace.enable(model, every=0)
    t = trace.enable(model)
    with pytest.raises(ValueError, match="already traced"):
        trace.enable(model)
    trace.disable(model)
    trace.enable(model).close()
    assert t.layers["0"].name == "0"


def test_roles_without_format_are_not_reported():
    model = emunum.patch(mlp(), fmt="e5m2", grad=None)
    with trace.collect(model) as t:
        model(torch.randn(2, 6))
    assert set(t.summary()["0"]) == {Role.WEIGHT.value, Role.INPUT.value, Role.OUTPUT.value}


@pytest.mark.parametrize("opts", [dict(fmt="e4m3fn", grad="e5m2", ste="clipped"),
                                  dict(fmt="e5m2", rounding="stochastic", grad="e5m2", grad_rounding="nearest"),
                                  dict(fmt="e5m2", grad=None, ste="clipped"),
                                  dict(fmt=None, grad="e4m3fn"),
                                  dict(fmt="e4m3fn", scaling="per_tensor", grad="e5m2"),
                                  dict(fmt=emunum.FixedFormat(8, 3), grad=emunum.FixedFormat(8, 6))],
                         ids=["clipped", "stochastic_forward", "forward_only", "gradient_only", "per_tensor",
                              "fixed"])
def test_fused_traced_rounding_changes_no_value_gradient_or_count(opts, monkeypatch):
    """The traced path (one node, counted in the rounding pass) against the untraced one, and its counters
    against those of the former path (round, then ``accumulate``; ``_TracedGradRound`` for gradients)."""
    def run(traced):
        torch.manual_seed(0)
        model = emunum.patch(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), **opts)
        x = (torch.randn(8, 6, generator=torch.Generator().manual_seed(3)) * 40).requires_grad_()
        torch.manual_seed(11)
        t = trace.enable(model, every=1) if traced else None
        for _ in range(2):
            model(x).square().sum().backward()
        if t is not None:
            t.close()
        return [p.grad for p in model.parameters()] + [x.grad], t

    want, _ = run(False)
    got, t = run(True)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert sum(d["values"] for roles in t.summary().values() for d in roles.values()) > 0
    monkeypatch.setattr(trace, "eager_ok", lambda x: False)  # the former, unfused path
    former, t0 = run(True)
    assert all(torch.equal(a, b) for a, b in zip(want, former))
    assert json.dumps(t0.summary()) == json.dumps(t.summary())


# ---- block-format GEMM operands --------------------------------------------------------------------------
def block_oracle(x, fmt, axis):
    """Counters of rounding x to the BlockFormat ``fmt`` along ``axis``, from the format's numpy encode/decode
    (the spec, not the kernels): overflow where |x| / (S*T) lay beyond the element range."""
    v = x.detach().double().numpy()
    codes, scodes, t = fmt.encode(v, axis=axis)
    q = fmt.decode(codes, scodes, axis=axis, tensor_scale=t).astype(np.float32)  # the result has x's dtype
    ones = np.ones_like(codes)
    full = fmt.decode(ones, scodes, axis=axis, tensor_scale=t) / fmt.element.decode(ones)  # S*T per element
    el = fmt.element
    lo = el.min if isinstance(el, emunum.FixedFormat) else -el.max
    counts = oracle(v, q, -np.inf, np.inf)
    counts[1] = int(np.sum(np.isfinite(v) & ((v > el.max * full) | (v < lo * full))))
    return np.array(counts)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxint8"])
def test_block_operand_roles_count_each_gemm_rounding_exactly(fmt):
    """input, weight and grad_output count the rounding of their operand in every GEMM that quantises it
    (forward and backward, each along that GEMM's K), against the format's numpy encoder; output and the
    element-format gradient roles count as before."""
    f = emunum.get_format(fmt)

    def data(n, seed):
        v = dyadic(n, seed)
        if f.tensor_scale:  # amax 42/64 = 6 * 448 * 2**-12 makes NVFP4's T a power of two: exact sums
            v = v.clamp(-42 / 64, 42 / 64)
            v[:16] = 40 / 64  # S = 40/64 / 6 / T = 426.7 rounds down to 416 in e4m3: x / (S*T) = 6.15 overflows
        return v

    lin = nn.Linear(64, 48, bias=False)
    with torch.no_grad():
        lin.weight.copy_(data(48 * 64, 1).reshape(48, 64))
    m = emunum.patch(nn.Sequential(lin), fmt, grad_rounding="nearest", grad_input="e5m2")
    x = data(32 * 64, 2).reshape(32, 64).requires_grad_()
    g = data(32 * 48, 3).reshape(32, 48) * 4
    with trace.collect(m, every=1) as t:
        m(x).backward(g)
    d = t.to_dict()["0"]
    w = lin.weight
    for role, cases in (("input", [(x, -1), (x, 0)]), ("weight", [(w, 1), (w, 0)]),
                        ("grad_output", [(g, -1), (g, 0)])):
        want = sum(block_oracle(v, f, ax) for v, ax in cases)
        got = [d[role][k] for k in trace.STATS]
        assert got == want.tolist(), role
    if fmt != "mxint8":  # (6-bit dyadic values never exceed MXINT8's 127/64 after scaling)
        assert sum(d[r]["overflow"] for r in ("input", "weight", "grad_output")) > 0  # the case is there
    gx = x.grad  # grad_input: e5m2 of the block GEMM's grad-input
    assert d["grad_input"]["values"] == gx.numel()


@pytest.mark.parametrize("policy", [
    {"fmt": "mxfp8_e4m3"},
    {"fmt": "nvfp4", "weight": "nvfp4_2d", "hadamard": 16},
    {"fmt": "mxfp8_e4m3", "weight": "e4m3fn"},  # an element-format operand in the block GEMMs
    {"fmt": "nvfp4", "mad": "bf16"},
    {"fmt": "mxfp8_e4m3", "mad": emunum.MADUnit("fp32", "fp32", acc_rounding="stochastic")},
], ids=["mxfp8", "nvfp4_2d_rht", "element_weight", "mad", "mad_stochastic_acc"])
def test_tracing_block_layers_changes_no_value_or_gradient(policy):
    """Tracing a block-GEMM model draws no extra random numbers and rounds the same bits (stochastic gradients
    included), on torch's GEMMs and on MAD units; every operand role is counted, on MAD units as off them."""
    policy = dict(policy)
    if policy.get("mad") == "bf16":
        policy["mad"] = emunum.MADUnit("bf16", "bf16")

    def run(traced):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
        mha = nn.MultiheadAttention(16, 2, batch_first=True)
        emunum.patch(m, **policy)
        mha = emunum.patch(mha, **policy)
        x = torch.randn(2, 16, 32, requires_grad=True)
        with (trace.collect(m, every=1) if traced else contextlib_null()) as t1, \
                (trace.collect(mha, every=1) if traced else contextlib_null()) as t2:
            for _ in range(2):
                h = m(x)
                y, _ = mha(h, h, h)
                y.square().sum().backward()
        out = [y.detach(), x.grad] + [p.grad for p in (*m.parameters(), *mha.parameters())]
        return out, (t1.to_dict(), t2.to_dict()) if traced else None

    plain, _ = run(False)
    traced, dicts = run(True)
    for a, b in zip(plain, traced, strict=True):
        assert torch.equal(a, b)
    for d in dicts:
        for layer in d.values():
            for role in ("input", "weight", "grad_output"):
                assert layer[role]["values"] > 0, (layer, role)


def contextlib_null():
    import contextlib

    return contextlib.nullcontext()


def test_block_counts_on_mad_units_equal_those_on_torch_gemms():
    """block_matmul rounds the same operands along the same K: with nearest rounding the counters agree
    (dyadic data: the sums are exact in any order, and the two paths lay the operands out differently)."""
    def counts(mad):
        lin = nn.Linear(64, 32, bias=False)
        with torch.no_grad():
            lin.weight.copy_(dyadic(32 * 64, 1).reshape(32, 64))
        m = emunum.patch(nn.Sequential(lin), "mxfp8_e4m3", grad_rounding="nearest",
                         **({"mad": emunum.MADUnit("fp32", "fp32")} if mad else {}))
        x = dyadic(16 * 64, 2).reshape(16, 64).requires_grad_()
        with trace.collect(m, every=1) as t:
            m(x).backward(dyadic(16 * 32, 3).reshape(16, 32))
        return t.to_dict()

    assert counts(True) == counts(False)


class _Functional(torch.nn.Module):
    """x @ W with W a Parameter: one functional GEMM, no layer to swap."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 5))

    def forward(self, x):
        return x @ self.w


@pytest.mark.parametrize("fmt", ["e4m3fn", "mxfp8_e4m3"])
def test_functional_gemms_are_traced_per_role_without_changing_bits(fmt):
    torch.manual_seed(0)
    x = torch.randn(4, 32, requires_grad=True)
    plain = emunum.patch(_Functional(), fmt, grad_rounding="nearest")
    traced = copy.deepcopy(plain)
    y = plain(x)
    y.backward(torch.ones_like(y))
    with emunum.trace.collect(traced, every=1) as t:
        yt = traced(x)
        yt.backward(torch.ones_like(yt))
    assert torch.equal(y, yt) and torch.equal(plain.w.grad, traced.w.grad)
    got = {r: v["values"] for r, v in json.loads(t.to_json())["functional GEMMs"].items()}
    expect = {"input": 4 * 32, "weight": 32 * 5, "grad_output": 4 * 5}  # the operands of all three GEMMs...
    if fmt == "e4m3fn":  # ...rounded once each, element-wise; and the element roles around them
        expect.update({"output": 4 * 5, "grad_input": 4 * 32, "grad_weight": 32 * 5})
    else:  # block operands are quantised per GEMM: x and W in two GEMMs each, gy in both backward GEMMs
        expect = {"input": 2 * 4 * 32, "weight": 2 * 32 * 5, "grad_output": 2 * 4 * 5}
    assert got == expect

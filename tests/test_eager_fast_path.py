"""The eager fast paths give the dispatched paths' bits, gradients and seed draws, and step aside where they
would not.

- ``Quantizer`` / ``quantize_ste`` in eager mode run ``autograd._EagerSTE`` instead of dispatching the custom
  op ``emunum::quantize_ste``: compared with the op path (forced by patching ``eager_ok`` to False) for
  forward values, gradients, clipped masks, fixed seeds and ``seed=None`` under ``torch.manual_seed``.
- ``ops.eager_ok`` is False under every tracer or mode the op must see (FakeTensorMode, a torch-function
  mode, vmap, autocast, forward-mode AD, dynamo tracing) and for tensor subclasses.
- ``emunum.quantize`` hands the CPU kernels raw addresses: checked against the numpy entry points of
  ``kernels.cpu`` on contiguous, strided, offset and in-place tensors (serial and parallel loops).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.overrides import TorchFunctionMode

import emunum
import emunum.autograd as ag
import emunum.ops as ops
from emunum import FixedFormat, FloatFormat, Quantizer, RoundMode
from emunum.kernels import cpu
from emunum.rng import seed_key

# (forward, backward, forward rounding, backward rounding, ste)
PLANS = {
    "e5m2 nearest / e5m2 stochastic": ("e5m2", "e5m2", "nearest", "stochastic", "identity"),
    "e4m3fn up / bf16 nearest, clipped": ("e4m3fn", "bf16", "up", "nearest", "clipped"),
    "fixed8_3 wrap / e5m2 odd": (FixedFormat(8, 3, saturate=False), "e5m2", "stochastic", "odd", "clipped"),
    "forward only (fp4)": ("fp4_e2m1", None, "nearest", "stochastic", "identity"),
    "gradient only (e5m2fnuz)": (None, "e5m2fnuz", "nearest", "stochastic", "identity"),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _input(dtype, seed=0, n=2000):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-20, 12, (n,), generator=g))
    x[:5] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")])
    return x.to(dtype).reshape(40, -1)


def _run(plan, seed, dtype, force_op: bool, monkeypatch):
    """Forward value, x.grad and the generator's next draw after forward+backward of x -> Q -> *w -> sum."""
    if force_op:
        monkeypatch.setattr(ag, "eager_ok", lambda x: False)
        monkeypatch.setattr(ops, "eager_ok", lambda x: False)
    fwd, bwd, fr, br, ste = PLANS[plan]
    q = Quantizer(forward=fwd, backward=bwd, forward_rounding=fr, backward_rounding=br, ste=ste, seed=seed)
    x = _input(dtype).requires_grad_(True)
    w = _input(dtype, seed=1).nan_to_num(0.0, 1e3, -1e3)
    torch.manual_seed(7)
    y = q(x)
    (y.nan_to_num(0.0, 0.0, 0.0) * w).sum().backward()
    after = torch.randint(0, 2**62, (1,)).item()
    monkeypatch.undo()
    return y, x.grad, after


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("seed", [None, 99], ids=["seed_none", "seed_99"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_eager_quantizer_equals_dispatched_op_bits_gradients_and_draws(plan, seed, dtype, monkeypatch):
    y_op, g_op, next_op = _run(plan, seed, dtype, True, monkeypatch)
    y_fast, g_fast, next_fast = _run(plan, seed, dtype, False, monkeypatch)
    assert torch.equal(_bits(y_fast), _bits(y_op))
    assert torch.equal(_bits(g_fast), _bits(g_op))
    assert next_fast == next_op  # the same number of draws from torch's generator


def test_eager_quantizer_takes_the_fast_path_and_records_its_own_node():
    x = torch.randn(10, requires_grad=True)
    y = Quantizer(forward="e5m2")(x)
    assert type(y.grad_fn).__name__ == "_EagerSTEBackward"
    with torch.no_grad():
        assert Quantizer(forward="e5m2")(x).grad_fn is None


def test_eager_output_is_fresh_and_contiguous_and_input_untouched():
    x = torch.randn(8, 6).t()
    keep = x.clone()
    for q in (Quantizer(forward="e5m2"), Quantizer(backward="e5m2")):
        y = q(x)
        assert y.is_contiguous() and y.data_ptr() != x.data_ptr() and torch.equal(x, keep)
        assert torch.equal(y, emunum.quantize(x, "e5m2")) if q.forward_format else torch.equal(y, x)


def test_double_backward_keeps_the_op_path_and_its_identity_formula():
    """With create_graph the gradient rounding must stay differentiable (the op's identity formula)."""
    x = torch.randn(50, dtype=torch.float64, requires_grad=True)
    y = Quantizer(forward=None, backward="bf16")(x)
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert torch.equal(gg, torch.full_like(x, 2.0))


class _NoOpMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_eager_ok_is_false_under_modes_tracers_and_subclasses():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4)
    assert ops.eager_ok(x) and ops.eager_ok(torch.nn.Parameter(x))
    with _NoOpMode():
        assert not ops.eager_ok(x)
    with FakeTensorMode() as mode:
        assert not ops.eager_ok(mode.from_tensor(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ops.eager_ok(x)
    with fwAD.dual_level():
        assert not ops.eager_ok(x)
    seen = []
    torch.vmap(lambda t: seen.append(ops.eager_ok(t)) or t)(torch.randn(3, 4))
    assert seen == [False]
    assert not ops.eager_ok(torch.randn(2).as_subclass(_Sub))

    def probe(t):
        return t + float(ops.eager_ok(t))
    assert torch.equal(torch.compile(probe, backend="eager", fullgraph=True)(x), x)  # folded to False


class _Sub(torch.Tensor):
    pass


def test_quantizer_under_a_torch_function_mode_dispatches_the_op_with_the_same_bits():
    x = torch.randn(300) * 100
    q = Quantizer(forward="e4m3fn", forward_rounding="stochastic", seed=5)
    with _NoOpMode():
        y_mode = q(x)
    assert torch.equal(y_mode, q(x))


# ---- raw-address CPU entry points -----------------------------------------------------------------------
FORMATS = {"e5m2": FloatFormat(5, 2), "e4m3fnuz": FloatFormat(4, 3, special="fnuz"),
           "e8m0 (f64 loop on f32)": FloatFormat(8, 0), "fixed8_3 wrap": FixedFormat(8, 3, saturate=False)}


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.DOWN, RoundMode.STOCHASTIC], ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_address_entry_points_equal_array_entry_points(name, dtype, mode, parallel):
    fmt = FORMATS[name]
    src = _input(torch.float64, seed=3).numpy().ravel().astype(dtype)
    via_array, via_addr = np.empty_like(src), np.empty_like(src)
    key, n = seed_key(123), src.size
    args = fmt.to_kernel_args()
    if isinstance(fmt, FloatFormat):
        cpu.quantize_float(src, via_array, *args, int(mode), key, 32, parallel=parallel)
        cpu.quantize_float_at(src.ctypes.data, via_addr.ctypes.data, n, src.dtype, *args, int(mode), key, 32,
                              parallel=parallel)
    else:
        cpu.quantize_fixed(src, via_array, *args, int(mode), key, 32, parallel=parallel)
        cpu.quantize_fixed_at(src.ctypes.data, via_addr.ctypes.data, n, src.dtype, *args, int(mode), key, 32,
                              parallel=parallel)
    assert np.array_equal(via_addr.view(np.uint8), via_array.view(np.uint8))


def test_address_entry_points_reject_other_dtypes():
    a = np.zeros(4, np.float16)
    with pytest.raises(TypeError, match="dtype=float16 .* allowed: float32, float64"):
        cpu.quantize_float_at(a.ctypes.data, a.ctypes.data, 4, a.dtype, 2, -14, 1, 57344.0, 0, 1, 0, 0, 32)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset_view", "expanded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_quantize_on_any_layout_equals_the_array_kernel_on_a_contiguous_copy(layout, dtype):
    base = _input(dtype, seed=4)
    x = {"contiguous": base, "transposed": base.t(), "offset_view": base[3:, 5:],
         "expanded": base[:1].expand(7, -1)}[layout]
    fmt = emunum.get_format("e5m2")
    want = np.empty(x.numel(), dtype=x.numpy().dtype)
    cpu.quantize_float(x.contiguous().numpy().ravel(), want, *fmt.to_kernel_args(), int(RoundMode.STOCHASTIC),
                       seed_key(11), 32)
    got = emunum.quantize(x, fmt, "stochastic", seed=11)
    assert got.is_contiguous() and got.shape == x.shape
    assert np.array_equal(got.numpy().ravel().view(np.uint8), want.view(np.uint8))
    out = torch.empty(x.shape[::-1], dtype=dtype).t()  # a non-contiguous out
    assert emunum.quantize(x, fmt, "stochastic", seed=11, out=out) is out
    assert torch.equal(_bits(out), _bits(got))


def test_quantize_in_place_bumps_the_version_counter_so_autograd_sees_it():
    w = torch.randn(20, requires_grad=True)
    x = w * 3  # saved by nothing; y = x * x saves x
    y = x * x
    before = x._version
    with torch.no_grad():
        emunum.quantize(x, "e5m2", out=x)
    assert x._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()

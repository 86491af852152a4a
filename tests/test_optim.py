"""OptimLP and LossScaler: exact expectations against emunum.reference (numpy float64 rounding)."""
import pytest
import torch
from torch import nn

from emunum import LossScaler, OptimLP, get_format
from emunum.optim import derive_seed
from emunum.reference import quantize_reference
from emunum.formats import RoundMode

FP8 = get_format("fp8_152")
FP16_169 = get_format("fp16_169")


def ref(x, fmt, mode="nearest", seed=0):
    return quantize_reference(x, get_format(fmt), RoundMode.parse(mode), seed=seed)


def make_param(shape=(5, 7), seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(shape, generator=g) * scale)


def set_grad(p, seed, scale=1.0):
    g = torch.Generator().manual_seed(1000 + seed)
    p.grad = (torch.randn(p.shape, generator=g) * scale).to(p.dtype)


# ---- derive_seed --------------------------------------------------------------------------------------
def test_derive_seed_is_a_pure_function_of_its_arguments():
    assert derive_seed(3, 1, 2) == derive_seed(3, 1, 2)
    seeds = {derive_seed(s, i, j) for s in range(3) for i in range(4) for j in range(4)}
    assert len(seeds) == 48
    assert all(0 <= s < 2**62 for s in seeds)
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)


@pytest.mark.parametrize("bad", [1.5, "3", True, None])
def test_derive_seed_rejects_non_int(bad):
    with pytest.raises(TypeError, match="derive_seed"):
        derive_seed(0, bad)


# ---- OptimLP --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fp8_152", "e4m3fn", "fp16_169", "bf16", "fixed16_12"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero"])
def test_sgd_step_rounds_grad_then_weight(fmt, rounding):
    p = make_param()
    p0 = p.detach().clone()
    set_grad(p, 0)
    g0 = p.grad.clone()
    opt = OptimLP(torch.optim.SGD([p], lr=0.1), weight=fmt, weight_rounding=rounding,
                  grad="fp8_152", grad_rounding=rounding, seed=7)
    opt.step()
    gq = ref(g0, "fp8_152", rounding, seed=derive_seed(7, 0, 1, 0))
    assert torch.equal(p.grad, gq)
    expected = ref(p0.add(gq, alpha=-0.1), fmt, rounding, seed=derive_seed(7, 0, 2, 0))
    assert torch.equal(p.detach(), expected)


def test_stochastic_counters_run_over_the_concatenation_of_parameters_per_dtype():
    a, b = make_param((3, 4), seed=1), make_param((7,), seed=2)
    c = torch.nn.Parameter(make_param((5,), seed=3).detach().double())
    for i, p in enumerate((a, b, c)):
        set_grad(p, i)
    before = [p.detach().clone() for p in (a, b, c)]
    exact = [w.add(p.grad, alpha=-0.01) for w, p in zip(before, (a, b, c))]
    opt = OptimLP(torch.optim.SGD([a, b, c], lr=0.01), weight=FP8, weight_rounding="stochastic", seed=11)
    opt.step()
    f32 = ref(torch.cat([exact[0].reshape(-1), exact[1]]), FP8, "stochastic", seed=derive_seed(11, 0, 2, 0))
    assert torch.equal(a.detach().reshape(-1), f32[:12]) and torch.equal(b.detach(), f32[12:])
    assert torch.equal(c.detach(), ref(exact[2], FP8, "stochastic", seed=derive_seed(11, 0, 2, 1)))
    assert c.dtype == torch.float64


def test_stochastic_weight_update_lands_on_a_neighbour_and_differs_by_step():
    p = make_param((4000,), scale=0.5)
    opt = OptimLP(torch.optim.SGD([p], lr=1e-3), weight=FP8, weight_rounding="stochastic", seed=1)
    opt.quantize_parameters_()
    values = torch.from_numpy(FP8.values()).float()
    p1 = p.detach().clone()
    set_grad(p, 0)
    exact = p1.add(p.grad, alpha=-1e-3)
    opt.step()
    got = p.detach()
    assert torch.isin(got, values).all()
    lo = ref(exact, FP8, "down")
    hi = ref(exact, FP8, "up")
    assert ((got == lo) | (got == hi)).all()
    assert (got != p1).any(), "a 1e-3 update must move some fp8 weights under stochastic rounding"
    assert (got == p1).any(), "and leave others where they were"


def test_sgd_momentum_buffer_is_rounded_each_step():
    p = make_param()
    opt = OptimLP(torch.optim.SGD([p], lr=0.05, momentum=0.9), momentum=FP16_169, weight=FP16_169)
    opt.quantize_parameters_()
    w = p.detach().clone()
    buf = None
    for step in range(3):
        set_grad(p, step)
        g = p.grad.clone()
        opt.step()
        fresh = g.clone() if buf is None else buf.mul(0.9).add_(g)
        w = ref(w.add(fresh, alpha=-0.05), FP16_169)  # the step uses the fresh buffer ...
        buf = ref(fresh, FP16_169)  # ... and stores it rounded for the next step
        assert torch.equal(opt.state[p]["momentum_buffer"], buf)
        assert torch.equal(p.detach(), w)


def test_adam_state_roles_are_rounded_and_step_counter_untouched():
    p = make_param()
    opt = OptimLP(torch.optim.Adam([p], lr=1e-2), momentum="bf16", second_moment="fp16_169")
    set_grad(p, 0)
    opt.step()
    st = opt.state[p]
    assert torch.equal(st["exp_avg"], ref(st["exp_avg"], "bf16"))
    assert torch.equal(st["exp_avg_sq"], ref(st["exp_avg_sq"], "fp16_169"))
    assert float(st["step"]) == 1.0
    # the first Adam moments are (1-b1) g and (1-b2) g^2, rounded
    g = p.grad
    assert torch.equal(st["exp_avg"], ref(g * (1 - 0.9), "bf16"))


def test_params_without_grad_are_left_alone_by_the_grad_role():
    a, b = make_param(seed=1), make_param(seed=2)
    b0 = b.detach().clone()
    set_grad(a, 0)
    opt = OptimLP(torch.optim.SGD([a, b], lr=0.1), grad=FP8)
    opt.step()
    assert b.grad is None and torch.equal(b.detach(), b0)


def test_param_groups_are_shared_with_the_wrapped_optimizer():
    p = make_param()
    inner = torch.optim.SGD([p], lr=0.1)
    opt = OptimLP(inner, weight=FP8)
    opt.param_groups[0]["lr"] = 0.25
    assert inner.param_groups[0]["lr"] == 0.25
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    assert inner.param_groups[0]["lr"] == 0.125


def _run(opt_factory, steps, state=None):
    torch.manual_seed(0)
    p = make_param((64,))
    opt = opt_factory([p])
    if state is not None:
        p.data.copy_(state["p"])
        opt.load_state_dict(state["opt"])
    first = opt.steps
    for s in range(first, first + steps):
        set_grad(p, s)
        opt.step()
    return p, opt


@pytest.mark.parametrize("inner", ["sgd", "adam"])
def test_state_dict_resume_reproduces_stochastic_rounding_bits(inner):
    def factory(params):
        base = (torch.optim.SGD(params, lr=0.05, momentum=0.9) if inner == "sgd"
                else torch.optim.Adam(params, lr=1e-2))
        return OptimLP(base, weight=FP16_169, weight_rounding="stochastic", grad=FP8, grad_rounding="stochastic",
                       momentum=FP16_169, momentum_rounding="stochastic", seed=3)

    full, _ = _run(factory, 5)
    part, opt = _run(factory, 2)
    saved = {"p": part.detach().clone(), "opt": opt.state_dict()}
    resumed, opt2 = _run(factory, 3, state=saved)
    assert opt2.steps == 5
    assert torch.equal(resumed.detach(), full.detach())


def test_bad_arguments_name_the_field():
    p = make_param()
    with pytest.raises(TypeError, match="optimizer"):
        OptimLP([p], weight=FP8)
    with pytest.raises(ValueError, match="weight"):
        OptimLP(torch.optim.SGD([p], lr=0.1), weight="fp7_nonsense")
    with pytest.raises(ValueError, match="grad_rounding"):
        OptimLP(torch.optim.SGD([p], lr=0.1), grad=FP8, grad_rounding="sideways")
    with pytest.raises(TypeError, match="seed"):
        OptimLP(torch.optim.SGD([p], lr=0.1), seed=1.5)
    with pytest.raises(ValueError, match="steps"):
        OptimLP(torch.optim.SGD([p], lr=0.1)).load_state_dict({"optimizer": {}, "seed": 0})


# ---- LossScaler -----------------------------------------------------------------------------------------
def _scaled_backward(p, scaler, grad_scale=1.0, poison=False):
    p.grad = None
    loss = (p * torch.linspace(-1, 1, p.numel()).reshape(p.shape) * grad_scale).sum()
    if poison:
        loss = loss * float("inf")
    scaler.scale_loss(loss).backward()


def test_scaling_and_unscaling_are_exact_for_power_of_two_scales():
    p = make_param()
    scaler = LossScaler(2.0**12)
    loss = (p**2).sum()
    assert torch.equal(scaler.scale_loss(loss), loss * 4096.0)
    scaler.scale_loss(loss).backward()
    assert not scaler.unscale_(torch.optim.SGD([p], lr=0.1))
    assert torch.equal(p.grad, 2 * p.detach())


def test_dynamic_skips_nonfinite_step_and_halves_scale():
    p = make_param()
    p0 = p.detach().clone()
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    scaler = LossScaler(1024.0, growth_interval=3)
    _scaled_backward(p, scaler, poison=True)
    assert scaler.step(opt) is False
    scaler.update()
    assert torch.equal(p.detach(), p0)
    assert opt.state[p] == {}  # the wrapped optimizer never ran
    assert scaler.scale == 512.0 and scaler.skipped_steps == 1 and scaler.good_steps == 0


def test_dynamic_grows_after_exactly_growth_interval_good_steps():
    p = make_param()
    opt = torch.optim.SGD([p], lr=1e-3)
    scaler = LossScaler(8.0, growth_interval=3)
    scales = []
    for _ in range(7):
        _scaled_backward(p, scaler)
        assert scaler.step(opt) is True
        scaler.update()
        scales.append(scaler.scale)
    assert scales == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]
    _scaled_backward(p, scaler, poison=True)
    scaler.step(opt)
    scaler.update()
    assert scaler.scale == 16.0 and scaler.good_steps == 0


def test_dynamic_scale_never_falls_below_min_scale():
    p = make_param()
    scaler = LossScaler(4.0, min_scale=1.0)
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(4):
        _scaled_backward(p, scaler, poison=True)
        scaler.step(opt)
        scaler.update()
    assert scaler.scale == 1.0 and scaler.skipped_steps == 4


def test_static_scale_is_fixed_and_always_steps():
    p = make_param()
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = LossScaler(256.0, dynamic=False)
    _scaled_backward(p, scaler, poison=True)
    assert scaler.step(opt) is True
    scaler.update()
    assert scaler.scale == 256.0 and scaler.skipped_steps == 0
    assert not torch.isfinite(p.detach()).all()


def test_scaler_with_optimlp_steps_on_unscaled_grads():
    p = make_param()
    p0 = p.detach().clone()
    opt = OptimLP(torch.optim.SGD([p], lr=0.1), weight=FP16_169, grad=FP8)
    scaler = LossScaler(2.0**10)
    w = torch.linspace(-1, 1, p.numel()).reshape(p.shape)
    scaler.scale_loss((p * w).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach(), ref(p0.add(ref(w, FP8), alpha=-0.1), FP16_169))


def test_scaler_state_dict_round_trip():
    s = LossScaler(64.0, growth_interval=5)
    s.good_steps, s.skipped_steps, s.scale_value = 3, 2, 32.0
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.good_steps, t.skipped_steps, t.growth_interval) == (32.0, 3, 2, 5)


def test_scaler_misuse_and_bad_arguments():
    p = make_param()
    opt = torch.optim.SGD([p], lr=0.1)
    s = LossScaler()
    with pytest.raises(RuntimeError, match="update"):
        s.update()
    _scaled_backward(p, s)
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_"):
        s.unscale_(opt)
    with pytest.raises(ValueError, match="init_scale"):
        LossScaler(0.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        LossScaler(growth_interval=0)
    with pytest.raises(TypeError, match="init_scale"):
        LossScaler("big")


@pytest.mark.parametrize("width", [7, 600])  # 600: more elements than the parallel threshold, on one thread
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_rounding_draws_the_bits_of_the_concatenation(dtype, width, monkeypatch):
    """``_round_in_place`` (each tensor rounded where it lies, at its offset in the concatenation) against the
    concatenate-round-split path, bit for bit, over steps of SR weights/gradients/momentum."""
    import numba

    from emunum import optim as optim_mod
    from emunum.kernels import cpu

    ran = []
    fast_path = optim_mod._round_in_place
    threads = numba.get_num_threads()
    numba.set_num_threads(1)

    def run(fast):
        monkeypatch.setattr(optim_mod, "_round_in_place",
                            (lambda *a: ran.append(fast_path(*a)) or ran[-1]) if fast else (lambda *a: False))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, 500), nn.ReLU(), nn.Linear(500, 3)).to(dtype)
        opt = OptimLP(torch.optim.Adam(model.parameters(), lr=0.01), weight="fp16_169", weight_rounding="stochastic",
                      grad="e5m2", grad_rounding="stochastic", momentum="fp16_169", second_moment="bf16", seed=5)
        x = torch.randn(9, width, dtype=dtype)
        for _ in range(3):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
        monkeypatch.undo()
        return [p.detach().clone() for p in model.parameters()] + \
            [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]

    try:
        assert all(torch.equal(a, b) for a, b in zip(run(True), run(False)))
    finally:
        numba.set_num_threads(threads)
    assert ran and all(ran)
    assert (sum(p.numel() for p in nn.Linear(width, 500).parameters()) >= cpu.PARALLEL_MIN) == (width == 600)

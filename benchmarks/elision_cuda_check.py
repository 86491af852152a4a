"""Elision on CUDA: a patched 2-D CNN gives the same bits with elision on and off (losses, gradients, weights
after three SGD steps, the next draw of the generators), and every value the CUDA rounding returns is returned
unchanged by every mode. Needs a GPU and numba-cuda.

    PYTHONPATH=. python benchmarks/elision_cuda_check.py
"""
from __future__ import annotations

import sys

import torch
from torch import nn

import emunum
from emunum import grid

MODES = ("nearest", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic")


def bits(t):
    return t.detach().contiguous().view(torch.int32)


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 16 * 16, 32), nn.ReLU(),
                         nn.Linear(32, 10)).cuda()


def train(on: bool, policy: dict):
    model = emunum.patch(cnn(), **policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 3, 32, 32, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda()
    torch.manual_seed(123)
    grid.elided.clear()
    out = []
    with grid.elision(on):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
            opt.step()
    out += [p.detach().clone() for p in model.parameters()] + [torch.rand(4), torch.rand(4, device="cuda")]
    return out, dict(grid.elided)


def main() -> int:
    ok = True
    for name, policy in {"e5m2": dict(fmt="e5m2"), "e4m3fn/e5m2": dict(fmt="e4m3fn", grad="e5m2")}.items():
        (a, ea), (b, eb) = train(True, policy), train(False, policy)
        same = len(a) == len(b) and all(torch.equal(bits(u.float()), bits(v.float())) for u, v in zip(a, b))
        print(f"cnn {name}: same bits on/off: {same}; elided on: {ea}; off: {eb}")
        ok &= same and bool(ea) and not eb
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e38, 1e-45]),
                   torch.randn(100000, generator=g) * torch.exp2(torch.randint(-30, 30, (100000,), generator=g))])
    for fmt in ("e5m2", "e4m3fn", "e4m3fnuz", "bf16", "fp16"):
        bad = []
        for m in MODES:
            q = emunum.quantize(x.cuda(), fmt, m, seed=1)
            bad += [(m, m2) for m2 in MODES if not torch.equal(bits(emunum.quantize(q, fmt, m2, seed=2)), bits(q))]
        print(f"grid claim on CUDA, {fmt}: {'holds' if not bad else f'FAILS for {bad[:5]}'}")
        ok &= not bad
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

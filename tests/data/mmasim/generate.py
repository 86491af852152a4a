"""Generate the MMA-Sim reference vectors in this folder (run outside the project; MMA-Sim is not a dependency).

    git clone https://github.com/microsoft/MMA-Sim /tmp/mmasim   # commit in PROVENANCE.md
    PYTHONPATH=/tmp/mmasim python tests/data/mmasim/generate.py tests/data/mmasim

For every preset: single instructions (steps=1) and chains of 2 and 3 instructions (each D the next C), one
output element each (MMA-Sim's instruction object with m = n = 1, called as the instruction is called).
Operands: codes drawn uniformly over the element format's finite codes (zeros, subnormals, the largest values),
mixed with narrow-range draws; scales over their whole range and a moderate range; c: zero, subnormal,
typical, large, -fp32(the exact dot product) (20%: cancellation exposes the truncated bits) and (where MMA-Sim
accepts it) infinite. Written per preset: <preset>.npz with, for each
steps s in 1..3, arrays a{s} (V, K*s), b{s} (V, K*s), sa{s}/sb{s} (V, K*s/block) (block-scaled kinds),
c{s} (V,) and d{s} (V,), all float32 (values; NaN/inf kept bit for bit).
"""
import sys

import ml_dtypes
import numpy as np
import torch
from mmasim.isa.common import encode_fp4
from mmasim.simulator.amd import mfma
from mmasim.simulator.nv_ptx import mma, tcgen05mma, tcgen05mma_block_scale, wgmma

# preset -> (constructor, arch, qualifier, element dtype (ml_dtypes), scale kind or None, K, block)
PRESETS = {
    "b200_f8f6f4_e4m3": (tcgen05mma, "Blackwell", "m128n8k32.f32.e4m3.e4m3", "e4m3fn", None, 32, 0),
    "b200_f8f6f4_e5m2": (tcgen05mma, "Blackwell", "m128n8k32.f32.e5m2.e5m2", "e5m2", None, 32, 0),
    "b200_mxf8f6f4_e4m3": (tcgen05mma_block_scale, "Blackwell", "m128n8k32.block32.f32.e4m3.e4m3.ue8m0",
                           "e4m3fn", "ue8m0", 32, 32),
    "b200_mxf4nvf4_ue4m3": (tcgen05mma_block_scale, "Blackwell", "m128n8k64.block16.f32.e2m1.e2m1.ue4m3",
                            "e2m1", "ue4m3", 64, 16),
    "b200_mxf4nvf4_ue8m0": (tcgen05mma_block_scale, "Blackwell", "m128n8k64.block32.f32.e2m1.e2m1.ue8m0",
                            "e2m1", "ue8m0", 64, 32),
    "h100_wgmma_e4m3": (wgmma, "Hopper", "m64n8k32.f32.e4m3.e4m3", "e4m3fn", None, 32, 0),
    "a100_mma_bf16": (mma, "Ampere", "m16n8k16.f32.bf16.bf16.f32", "bf16", None, 16, 0),
    "mi300_mfma_fp8": (mfma, "CDNA3", "f32_16x16x32_fp8_fp8", "e4m3fnuz", None, 32, 0),
    "mi300_mfma_bf16": (mfma, "CDNA3", "f32_16x16x16_bf16", "bf16", None, 16, 0),
    "h100_wgmma_e5m2": (wgmma, "Hopper", "m64n8k32.f32.e5m2.e5m2", "e5m2", None, 32, 0),
    "mi300_mfma_bf8": (mfma, "CDNA3", "f32_16x16x32_bf8_bf8", "e5m2fnuz", None, 32, 0),
}
ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
      "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
      "e2m1": ml_dtypes.float4_e2m1fn, "bf16": ml_dtypes.bfloat16}
TORCH = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e4m3fnuz": torch.float8_e4m3fnuz,
         "e5m2fnuz": torch.float8_e5m2fnuz,
         "bf16": torch.bfloat16, "ue8m0": torch.float8_e8m0fnu, "ue4m3": torch.float8_e4m3fn}


def finite_values(name):
    """Every finite value of an element format (both zeros kept where the format has them)."""
    dt = ML[name]
    nbits = 4 if name == "e2m1" else (16 if name == "bf16" else 8)
    codes = np.arange(2**nbits, dtype=np.uint16 if nbits == 16 else np.uint8)
    v = codes.view(dt).astype(np.float32) if nbits != 4 else codes.astype(np.uint8).view(dt).astype(np.float32)
    return v[np.isfinite(v)]


def draw_elements(rng, name, n):
    vals = finite_values(name)
    wide = 0.1 if name == "bf16" else 0.3  # bf16 products of the whole range overflow fp32 too often
    if rng.random() < wide:  # anywhere in the range
        return rng.choice(vals, n)
    # a narrow band of exponents (as block-scaled or well-scaled data), some zeros
    mag = np.abs(vals[vals != 0])
    centre = rng.choice(np.log2(mag))
    if name == "bf16":
        centre = np.clip(centre, -70, 60)
    with np.errstate(divide="ignore"):
        dist = np.abs(np.log2(np.abs(vals)) - centre)
    band = vals[(dist <= rng.integers(1, 6)) | (vals == 0)]
    out = rng.choice(band, n)
    out[rng.random(n) < 0.1] = 0.0
    return out


def draw_scales(rng, kind, n):
    if kind == "ue8m0":
        lo, hi = (-127, 127) if rng.random() < 0.25 else (-20, 20)
        e = rng.integers(lo, hi + 1, n)
        if rng.random() < 0.3:  # the extremes of the moderate range only
            e = rng.choice([-20, -19, 18, 19, 20], n)
        return np.ldexp(1.0, e).astype(np.float32)
    vals = finite_values("e4m3fn")
    vals = vals[vals >= 0]
    if rng.random() < 0.3:  # the extremes only: groups far apart in exponent expose the 35-bit alignment
        vals = np.concatenate([vals[(vals > 0) & (vals < 2**-7)], vals[vals >= 128]])
    vals = vals[np.signbit(vals) == 0]
    return rng.choice(vals, n).astype(np.float32)


def draw_c(rng, allow_inf):
    r = rng.random()
    if r < 0.15:
        return np.float32(0.0)
    if r < 0.25:
        return np.float32(rng.choice([-1, 1]) * np.ldexp(rng.integers(1, 2**23), -149))  # subnormal
    if r < 0.45:
        return np.float32(rng.standard_normal() * 2.0 ** rng.integers(10, 40))  # large
    if r < 0.5:
        return np.uint32(rng.integers(0, 0x7F800000)).view(np.float32) * np.float32(rng.choice([-1, 1]))
    if r < 0.52 and allow_inf:
        return np.float32(rng.choice([-np.inf, np.inf]))
    return np.float32(rng.standard_normal() * 2.0 ** rng.integers(-10, 10))


def run_one(inst, name, el, scale, K, block, a, b, sa, sb, c):
    dt = TORCH.get(el)
    if el == "e2m1":
        pa = torch.zeros((1, K // 2), dtype=torch.uint8)
        pb = torch.zeros((1, K // 2), dtype=torch.uint8)
        for i in range(K):
            pa[0, i // 2] |= encode_fp4(float(a[i])) << (i % 2 * 4)
            pb[0, i // 2] |= encode_fp4(float(b[i])) << (i % 2 * 4)
        A, B = pa, pb.T.contiguous()
    else:
        A = torch.tensor(a[None, :], dtype=torch.float32).to(dt)
        B = torch.tensor(b[:, None], dtype=torch.float32).to(dt)
    C = torch.tensor([[float(c)]], dtype=torch.float32)
    if scale is None:
        D = inst(A, B, C)
    else:
        SA = torch.tensor(sa[None, :], dtype=torch.float32).to(TORCH[scale])
        SB = torch.tensor(sb[:, None], dtype=torch.float32).to(TORCH[scale])
        D = inst(A, B, C, SA, SB)
    return np.float32(D[0, 0].item())


def generate(name, rng, counts=(300, 120, 120)):
    ctor, arch, qual, el, scale, K, block = PRESETS[name]
    inst = ctor(arch, qual)
    inst.m = inst.n = 1  # one output element per call: the same code path, 1 x 1 instead of m x n
    out = {}
    for steps, count in zip((1, 2, 3), counts):
        Ks = K * steps
        nb = Ks // block if block else 0
        A = np.zeros((count, Ks), np.float32)
        B = np.zeros((count, Ks), np.float32)
        SA = np.ones((count, nb), np.float32)
        SB = np.ones((count, nb), np.float32)
        C = np.zeros(count, np.float32)
        D = np.zeros(count, np.float32)
        v = 0
        while v < count:
            A[v], B[v] = draw_elements(rng, el, Ks), draw_elements(rng, el, Ks)
            if scale:
                SA[v], SB[v] = draw_scales(rng, scale, nb), draw_scales(rng, scale, nb)
            C[v] = draw_c(rng, allow_inf=(el != "e2m1"))
            if rng.random() < 0.2:  # cancellation: c = -fp32(exact dot), so the truncated low bits decide D
                p = A[v].astype(np.float64) * B[v]
                if scale:
                    p *= np.repeat(SA[v].astype(np.float64) * SB[v], block)
                with np.errstate(all="ignore"):
                    t = np.float32(-p.sum())
                if np.isfinite(t):
                    C[v] = t
            acc = C[v]
            try:
                for s in range(steps):
                    ks = slice(s * K, (s + 1) * K)
                    bs = slice(s * K // block, (s + 1) * K // block) if block else slice(0, 0)
                    acc = run_one(inst, name, el, scale, K, block, A[v, ks], B[v, ks], SA[v, bs], SB[v, bs], acc)
            except OverflowError:  # MMA-Sim's mxf4nvf4 cannot take an infinite c (a chain that overflowed): redraw
                continue
            D[v] = acc
            v += 1
        out.update({f"a{steps}": A, f"b{steps}": B, f"c{steps}": C, f"d{steps}": D})
        if scale:
            out.update({f"sa{steps}": SA, f"sb{steps}": SB})
    return out


if __name__ == "__main__":
    folder = sys.argv[1]
    names = sys.argv[2:] or list(PRESETS)
    for i, name in enumerate(PRESETS):
        if name in names:
            data = generate(name, np.random.default_rng(20261126 + i))
            np.savez_compressed(f"{folder}/{name}.npz", **data)
            print(name, {k: v.shape for k, v in data.items() if k.startswith("d")})

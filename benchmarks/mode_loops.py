"""Per-mode CPU rounding loops: ms per call of quantize(x, fmt, mode, out=out) on 2**20 float32 values, one
numba thread, best of 15 (each the mean of 3 calls). Run it from two checkouts, alternately, to compare:

    for i in 1 2 3; do for d in /tmp/before /work/main; do NUMBA_NUM_THREADS=1 $d/.venv/bin/python \
        $d/benchmarks/mode_loops.py; done; done
"""
import sys, time, torch, numpy as np, emunum
n = 1 << 20
x = torch.randn(n) * 10; out = torch.empty_like(x)
res = {}
for fmt in ("fp8_152", "e4m3", "fixed16" if False else "int8"):
    for mode in ("nearest", "toward_zero", "up", "stochastic"):
        f = lambda: emunum.quantize(x, fmt, mode, out=out)
        f()
        ts = []
        for _ in range(15):
            t = time.perf_counter(); f(); f(); f(); ts.append((time.perf_counter() - t) / 3)
        res[f"{fmt}/{mode}"] = min(ts) * 1e3
print(" ".join(f"{k}={v:.3f}" for k, v in res.items()))

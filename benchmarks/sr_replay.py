"""Stochastic rounding in a real training step: the float32 SR loop beside its previous form, in one process.

    python benchmarks/sr_replay.py                       # resnet18,bert,cnn2d
    python benchmarks/sr_replay.py --models llama --rounds 9

Records every float32 stochastic rounding that one step of a patched model (``real_models.py``'s models and its
elementwise policy) makes, then replays those tensors through ``kernels/elementwise_f32.sr_serial`` (the serial
loop, whose generator counter advances by one add per element) and through the previous loop (``_sr``, the
counter recomputed as ``key + (base + i + 1) * golden`` per element), interleaved, best of ``--rounds`` CPU times
(``time.process_time``: other processes on a shared machine count less). Both loops give the same bits
(checked here on every replayed tensor; tests/kernels/test_elementwise_f32.py checks them against the core).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,bert,cnn2d")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds={a.rounds} must be >= 1")
    import numba
    from numba import njit

    import emunum
    import real_models as rm
    from emunum import autograd, elide
    from emunum.kernels import elementwise_f32 as ew

    torch.set_num_threads(1)
    numba.set_num_threads(1)

    @njit(nogil=True)
    def previous(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base):
        ew._sr(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base)

    print("# load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    for name in a.models.split(","):
        if name not in rm.MODELS:
            p.error(f"--models: {name!r}; allowed: {', '.join(rm.MODELS)}")
        model, loss, _ = rm.build(name, 2, 64, 32, 64)
        emunum.patch(model, **rm.POLICIES["elementwise"])
        step = rm.make_step(model, loss)
        step()
        seen = []
        real = autograd._round_cpu

        def record(x, fmt, mode, seed, nbits):
            if mode.name == "STOCHASTIC" and x.dtype == torch.float32:
                seen.append((x.detach().clone(), fmt, nbits))
            return real(x, fmt, mode, seed, nbits)

        autograd._round_cpu = elide._round_cpu = record
        try:
            step()
        finally:
            autograd._round_cpu = elide._round_cpu = real
        work = []
        for x, fmt, nbits in seen:
            _, man, emin, sub, mx, ovf = fmt.to_kernel_args()[:6]
            u = x.numpy().view(np.uint32).ravel()
            args = (man, emin, sub, int(np.float32(mx).view(np.uint32)), ovf, 1, np.uint64(0x9E3779B97F4A7C15),
                    nbits, np.int64(0))
            work.append((u, np.empty_like(u), np.empty_like(u), args))
        best = {"previous": float("inf"), "sr_serial": float("inf")}
        for _ in range(a.rounds):
            for k, fn, slot in (("previous", previous, 1), ("sr_serial", ew.sr_serial, 2)):
                t = time.process_time()
                for w in work:
                    fn(w[0], w[slot], *w[3])
                best[k] = min(best[k], time.process_time() - t)
        if not all(np.array_equal(w[1], w[2]) for w in work):
            raise SystemExit(f"{name}: the two loops gave different bits")
        n = sum(w[0].size for w in work)
        print(f"{name:<9} {len(work):3d} SR roundings/step, {n:9d} elements: previous {1e3 * best['previous']:7.2f} ms "
              f"sr_serial {1e3 * best['sr_serial']:7.2f} ms CPU ({best['sr_serial'] / best['previous']:.2f}x), "
              "same bits")
    print("# load average at the end " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()

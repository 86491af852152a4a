"""Compile time of emunum's kernels with and without ``kernels/_inline_copy.py`` (numba's inliner copying a
callee's IR with one memo), in the same run, each compile in a fresh process with an empty cache.

Prints, per round and mode, the CPU seconds (user + sys of that process, ``time.process_time``) to compile one
``gemm_vec`` variant (round-to-odd products and accumulator, checks on) and the element-wise kernels of one
``quantize(e5m2, stochastic)`` call, and a digest of the assembly of that ``gemm_vec`` variant and of the
results, which must be the same in both modes.

    python benchmarks/compile_time.py [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import hashlib, re, time
import numpy as np, torch, emunum
from emunum import MADUnit
from emunum.kernels import _inline_copy, gemm_cpu, gemm_vec
from emunum.mad.unit import stream_keys
g = torch.Generator().manual_seed(0)
A = emunum.quantize(torch.randn(2, 17, 70, generator=g) * 4, "fp8_152").double().numpy()
B = emunum.quantize(torch.randn(1, 70, 130, generator=g), "fp8_152").double().numpy()
A[0, 0, :3] = [np.inf, -np.inf, np.nan]
u = MADUnit("fp8_143", "fp16", mul_rounding="odd", acc_rounding="odd", chunk=3)
mulp, accp = u.kernel_params()
out = np.empty((2, 17, 130))
t = time.process_time()
gemm_cpu.gemm(A, B, None, out, 0, mulp, accp, u.lanes, 3, stream_keys(1), u.sr_bits, fast="vec")
t_gemm = time.process_time() - t
x = torch.randn(1 << 16, generator=g) * 100
t = time.process_time()
q = emunum.quantize(x, "e5m2", "stochastic", seed=3)
t_ew = time.process_time() - t
asm = "\n".join(gemm_vec.kernel(False, 5, 5, 0, True, True).inspect_asm().values())
asm = re.sub(r"_ZN[0-9A-Za-z_$.]+", "<symbol>", asm)  # mangled names carry per-process unique ids
digest = hashlib.sha256(asm.encode() + out.tobytes() + q.numpy().tobytes()).hexdigest()[:16]
print(f"{_inline_copy.installed} {t_gemm:.2f} {t_ew:.2f} {digest}")
"""


def _one(on: bool) -> tuple[bool, float, float, str]:
    with tempfile.TemporaryDirectory(prefix="emunum-compile-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "EMUNUM_NUMBA_INLINE_COPY": "1" if on else "0"}
        r = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True)
    installed, t_gemm, t_ew, digest = r.stdout.split()
    return installed == "True", float(t_gemm), float(t_ew), digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (CPU seconds; wall time says little on a shared machine)")
    digests = set()
    for r in range(a.rounds):
        for on in (False, True):  # numba's own copy first, then one memo, interleaved by round
            installed, t_gemm, t_ew, digest = _one(on)
            if installed != on:
                sys.exit(f"one-memo copy installed={installed}, asked {on}: another numba?")
            digests.add(digest)
            print(f"round {r}  {'one memo   ' if on else 'numba copy '}  gemm_vec variant {t_gemm:6.1f} CPU-s   "
                  f"element-wise quantize {t_ew:6.1f} CPU-s   digest {digest}")
    print("same assembly and bits in both modes" if len(digests) == 1 else f"DIFFERENT digests: {sorted(digests)}")


if __name__ == "__main__":
    main()

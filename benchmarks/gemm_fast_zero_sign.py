"""gemm_fast alone on one thread, this tree against a baseline tree, interleaved processes.

    python benchmarks/gemm_fast_zero_sign.py --base /tmp/base [--rounds 5] [--reps 30]

--base: a checkout of another commit (``git archive <commit> | tar -x -C DIR``); each child process imports
``kernels`` of one tree as a top-level package (no emunum import there), with NUMBA_NUM_THREADS=1, runs
``gemm_cpu._run_fast`` on (25x75) @ (75x2100) (a conv layer's im2col GEMM) for each unit with the plan
``fast_plan`` gives for its operands, and prints the median CPU time per call (``time.process_time``). Rounds
alternate base and this tree. Units: the fp8 recipe's e6m9 x e6m9 chunk 64 (its plan drops the accumulator's
subnormal rounding) and e5m2 x fp16 / e5m7 without subnormals (sums may flush to zero: the variants that
changed; float64 and float32 work).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _units():
    from emunum import FloatFormat, MADUnit
    return {"e6m9-e6m9_chunk64 (fp8 recipe)": MADUnit("fp16_169", "fp16_169", chunk=64),
            "e5m2-fp16_nosub": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False)),
            "e5m2-e5m7_nosub": MADUnit("fp8_152", FloatFormat(5, 7, subnormals=False))}


def _child(tree, spec, reps):
    sys.path.insert(0, tree)
    from kernels import gemm_cpu
    assert os.path.dirname(gemm_cpu.__file__) == os.path.join(tree, "kernels"), gemm_cpu.__file__
    out = {}
    for name, (mulp, accp, lanes, chunk) in spec.items():
        rng = np.random.default_rng(0)
        # e5m2 values (3 significant bits): binary32 products are exact, as the fp8 recipe's operands
        A = (rng.integers(4, 8, (1, 25, 75)) * rng.choice([-1, 1], (1, 25, 75))
             * np.exp2(rng.integers(-10, 1, (1, 25, 75)))).astype(np.float32)
        B = (rng.integers(4, 8, (1, 75, 2100)) * rng.choice([-1, 1], (1, 75, 2100))
             * np.exp2(rng.integers(-10, 1, (1, 75, 2100)))).astype(np.float32)
        mulp, accp = np.array(mulp, np.int64), np.array(accp, np.int64)
        plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
        o = np.empty((1, 25, 2100))
        bias = np.zeros((1, 1, 1))
        gemm_cpu._run_fast(A, B, bias, False, o, mulp, accp, lanes, chunk, plan)  # compile / load
        ts = []
        for _ in range(reps):
            t0 = time.process_time()
            gemm_cpu._run_fast(A, B, bias, False, o, mulp, accp, lanes, chunk, plan)
            ts.append(time.process_time() - t0)
        out[name] = (statistics.median(ts) * 1e3, str((np.dtype(plan[0]).name, *map(bool, plan[1:]))))
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child, json.loads(a.spec), a.reps)
        return
    spec = {n: ([int(v) for v in u.kernel_params()[0]], [int(v) for v in u.kernel_params()[1]], u.lanes,
                u.chunk or 0) for n, u in _units().items()}
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    res = {"base": [], "this": []}
    for r in range(a.rounds):
        for label, tree in (("base", os.path.abspath(a.base)), ("this", HERE)):
            p = subprocess.run([sys.executable, __file__, "--base", a.base, "--reps", str(a.reps), "--child", tree,
                                "--spec", json.dumps(spec)], env=env, capture_output=True, text=True, check=True)
            res[label].append(json.loads(p.stdout.strip().splitlines()[-1]))
    for name in spec:
        b = [d[name][0] for d in res["base"]]
        t = [d[name][0] for d in res["this"]]
        print(f"{name}  plan {res['this'][0][name][1]}")
        print(f"  base ms/call: {' '.join(f'{v:.3f}' for v in b)}   median {statistics.median(b):.3f}")
        print(f"  this ms/call: {' '.join(f'{v:.3f}' for v in t)}   median {statistics.median(t):.3f}"
              f"   ratio {statistics.median(t) / statistics.median(b):.3f}")


if __name__ == "__main__":
    main()

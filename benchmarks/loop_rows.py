"""The timing harness of the element-wise loop benchmarks (prefetch_loops.py, sr_words.py): rows of
``fn(src, dst)`` on uint32 views of float32 values, each timed "in cache" (one source again and again) and "not
in cache" (the sources of a 128 MiB pool in turn, as a training step meets its weights and fresh gradients);
rows interleaved per round, each figure the best over rounds of the mean ns/element (thread CPU time)."""
from __future__ import annotations

import time

import numpy as np
import torch


def time_rows(rows: dict, sizes, rounds: int, same: tuple) -> None:
    """Print one line per (size, row). ``same``: two row names whose outputs are checked to be the same bits
    (on one source) before timing."""
    print(f"{'n':>8}  {'row':30s} {'in cache':>9} {'not in cache':>13}  (ns/element)")
    for lg in sizes:
        n = 1 << lg
        pool = [(torch.randn(n) * 1e-3).numpy().view(np.uint32) for _ in range(max(2, (128 << 20) // (4 * n)))]
        out, check = np.empty(n, np.uint32), np.empty(n, np.uint32)
        for fn in rows.values():  # compile
            fn(pool[0], out)
        rows[same[0]](pool[1], check)
        rows[same[1]](pool[1], out)
        assert np.array_equal(out, check), f"{same[0]!r} and {same[1]!r} differ"
        best = {(r, c): float("inf") for r in rows for c in (0, 1)}
        reps = max(4, (64 << 20) // (4 * n) // 4)
        for _ in range(rounds):
            for name, fn in rows.items():
                for cold in (0, 1):
                    t = time.thread_time()
                    for i in range(reps):
                        fn(pool[i % len(pool)] if cold else pool[0], out)
                    best[name, cold] = min(best[name, cold], (time.thread_time() - t) / reps / n * 1e9)
        for name in rows:
            print(f"{n:>8}  {name:30s} {best[name, 0]:9.2f} {best[name, 1]:13.2f}")

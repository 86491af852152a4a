"""The MAD convolution's column pass and GEMMs (emunum/mad/conv.py), each beside the path it replaced, in one run.

    python benchmarks/conv_gemm.py [--repeat 7] [--threads 1] [--batch 64]

On the cnn2d benchmark's second convolution (benchmarks/train_step.py: 16 -> 32 channels, 3x3, padding 1, 32x32
images, batch 64) and its input gradient (32 -> 16 channels over the padded gradient), with the fp8 recipe's
unit (1-6-9 products and accumulator, chunk 64) and e5m2 operands, prints the best and median of ``--repeat``
timed calls (after a warm-up call) of:
- columns: the batch's im2col columns (N, C*9, 1024) by torch's copy of the strided view (``p.reshape``), and by
  ``kernels/im2col_cpu.im2col_cols`` (``conv._patch_cols``), fresh tensors each call as in a step;
- forward GEMM: those columns made for the whole batch, then one ``backend.gemm`` (the path before
  ``kernels/conv_fast.py``), and ``backend.conv_gemm`` (each sample's columns made right before its GEMM);
  both given the operands' scans, as the layer gives them, and checked to give the same bits;
- the weight gradient (conv2: 32 x 144 outputs, 65,536 terms): the output gradient transposed to (O, N*L) and the
  im2col rows (N*L, C*9) laid out, then one ``backend.gemm``, and ``backend.conv_wgrad`` (``wgrad_fast``: both
  operands' terms copied per span into tile panels); same bits checked.
glibc keeps freed memory for reuse (``emunum.buffers.retain_freed_memory``), as the training loop asks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(fn, repeat: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3, statistics.median(ts) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args(argv)
    import torch

    import emunum
    from emunum import buffers, torch_cpu
    from emunum.mad import MADUnit, backend
    from emunum.mad.conv import _patch_cols, _patch_rows, _patches

    torch_cpu.set_threads(a.threads)
    print(f"# malloc: {'retain_freed_memory()' if buffers.retain_freed_memory() else 'glibc default'}; "
          f"threads={a.threads}, batch {a.batch}, best/median of {a.repeat} calls (ms)")
    unit = MADUnit("fp16_169", "fp16_169", chunk=64)
    gen = torch.Generator().manual_seed(0)
    for name, C, O in (("conv2 forward (16 -> 32)", 16, 32), ("conv2 input gradient (32 -> 16)", 32, 16)):
        x = emunum.quantize(torch.randn(a.batch, C, 34, 34, generator=gen), "fp8_152")
        w = emunum.quantize(torch.randn(O, C, 3, 3, generator=gen), "fp8_152")
        A = w.reshape(1, O, C * 9)
        scans = (backend.scan(A, unit), backend.scan(x, unit))
        view = _patches(x, 3, 3, (1, 1), (1, 1))
        torch_cols = _time(lambda: view.reshape(a.batch, C * 9, 1024), a.repeat)
        kernel_cols = _time(lambda: _patch_cols(x, 3, 3, (1, 1), (1, 1), False), a.repeat)
        geometry = (3, 3, 1, 1, 1, 1, 32, 32)

        def batch_columns():
            return backend.gemm(A, _patch_cols(x, 3, 3, (1, 1), (1, 1), False), unit, 0, nb=a.batch, scans=scans)

        def per_sample():
            return backend.conv_gemm(x, A, unit, geometry, scans=scans)

        same = torch.equal(batch_columns().view(torch.int64), per_sample().view(torch.int64))
        old, new = _time(batch_columns, a.repeat), _time(per_sample, a.repeat)
        macs = a.batch * O * C * 9 * 1024
        print(f"{name}: columns  torch copy {torch_cols[0]:7.2f} / {torch_cols[1]:7.2f}   "
              f"im2col_cols {kernel_cols[0]:7.2f} / {kernel_cols[1]:7.2f}")
        print(f"{name}: GEMM     batch columns + gemm {old[0]:7.2f} / {old[1]:7.2f} "
              f"({macs / old[0] / 1e6:5.2f} GMAC/s)   conv_gemm {new[0]:7.2f} / {new[1]:7.2f} "
              f"({macs / new[0] / 1e6:5.2f} GMAC/s)   same bits: {same}")

    x = emunum.quantize(torch.randn(a.batch, 16, 34, 34, generator=gen), "fp8_152")
    grad = emunum.quantize(torch.randn(a.batch, 32, 32, 32, generator=gen) * 1e-3, "fp8_152")
    scans = (backend.scan(grad, unit), backend.scan(x, unit))

    def laid_out():
        Am = grad.reshape(a.batch, 1, 32, 1024).permute(1, 2, 0, 3).reshape(1, 32, a.batch * 1024)
        Bm = _patch_rows(x, 3, 3, (1, 1), (1, 1)).view(1, a.batch * 1024, 144)
        return backend.gemm(Am, Bm, unit, 0, scans=scans)

    def panels():
        return backend.conv_wgrad(grad, x, unit, (3, 3), (1, 1), (1, 1), scans=scans)

    same = torch.equal(laid_out().view(torch.int64), panels().view(torch.int64))
    old, new = _time(laid_out, a.repeat), _time(panels, a.repeat)
    macs = a.batch * 1024 * 32 * 144
    print(f"conv2 weight gradient: laid out + gemm {old[0]:7.2f} / {old[1]:7.2f} ({macs / old[0] / 1e6:5.2f} GMAC/s)"
          f"   conv_wgrad {new[0]:7.2f} / {new[1]:7.2f} ({macs / new[0] / 1e6:5.2f} GMAC/s)   same bits: {same}")


if __name__ == "__main__":
    main()

"""The weight-gradient operand of a 2-D block convolution under the random Hadamard transform, from the image's
distinct runs instead of the whole im2col matrix.

With ``Policy.hadamard`` = n, the grad-weight GEMM takes q(rht(cols)) along the tokens, cols the (N*Ho*Wo,
C*kh*kw) im2col matrix (``emunum.nn.block_gemm``). Where the output width Wo is a multiple of n and of the block
size, every run of n tokens (and every quantisation block) lies in one output row (n, oy), and column (c, i, j)
of that run reads row R = oy*sh + i*dh of the padded image, at x offsets ox*sw + j*dw. For a vertical stride of
1, the run of (c, i, j) at output row oy is therefore the run of (c, j) at padded row R = oy + i*dh, for every
i: the kh taps of a kernel column share their runs. This module transforms and quantises each distinct run once,
as the im2col matrix with a (1, kw) kernel over the rows R = 0 .. Ho-1 + (kh-1)*dh ("compact"), then copies the
quantised runs to their kh places.

Why the bits equal q(rht(cols)): the transform maps each run to a function of that run alone (the butterfly's
values are exact, and a run whose sums are not is summed in index order: ``kernels/hadamard_cpu.py``), the
quantiser's blocks are runs too, and the tensor's finite amax and the kernel's tests range over the set of runs,
which is the same set in both matrices when every padded row R is read by some (oy, i) (Ho >= dh, or kh = 1).
Nearest and directed rounding draw no random bits, so the element order does not matter; stochastic rounding (bits
from the element's index) and per-row outer scales (nvfp4_row, 4/6: a row's set of runs differs) are not taken
here. Where the butterfly declines (a run holding an infinity or NaN), the caller takes the full path."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ..formats import BlockFormat, RoundMode
from ..hadamard import rht_scanned


def applies(spec, x: Tensor, st, wo: int, n: int) -> bool:
    """Whether ``rht_columns`` holds for the input role's spec on image x (N, C, H, W)."""
    if spec is None or type(spec.fmt) is not BlockFormat:  # not MX+ (a subclass)
        return False
    fmt = spec.fmt
    if fmt.tile[0] != 0 or fmt.nvfp4_path or RoundMode.parse(spec.rounding) is RoundMode.STOCHASTIC:
        return False
    return (x.dtype == torch.float32 and x.is_cpu and x.dim() == 4 and x.numel() > 0 and st[0] == 1
            and wo % n == 0 and wo % fmt.tile[1] == 0)


def rht_columns(x: Tensor, k, st, p, d, ho: int, wo: int, n: int, seed: int,
                q: Callable[[Tensor, object], Tensor]) -> Optional[Tensor]:
    """q(rht(cols, n, seed, 0), scan) for cols = ``im2col_rows(x, k, st, p, d)`` (module doc), as a (N*Ho*Wo,
    C*kh*kw) view of a contiguous (C*kh*kw, N*Ho*Wo) tensor (the quantiser's layout for axis 0); None where the
    butterfly declines a run or ``q`` does not return that layout. q(t, scan): the input role's quantiser along
    axis 0 (``BlockPlan.q``)."""
    from ..kernels import im2col_cpu  # noqa: PLC0415  (compiled on first use)

    N, C = x.shape[0], x.shape[1]
    kh, kw = k
    if kh > 1 and ho < d[0]:
        return None  # padded rows no (oy, i) reads would enter the compact matrix
    rows = ho + (kh - 1) * d[0]
    src = x.detach().resolve_neg().contiguous()
    compact = torch.empty((N * rows * wo, C * kw), dtype=torch.float32)
    im2col_cpu.im2col(src.numpy(), compact.numpy(), 1, kw, 1, st[1], 1, d[1], p[0], p[1], rows, wo)
    t, scan = rht_scanned(compact, n, seed, 0, scan=True)
    if scan is None:
        return None
    qc = q(t, scan).t()  # (C*kw, N*rows*wo)
    if not qc.is_contiguous() or qc.dtype != torch.float32:
        return None
    runs = qc.view(C, kw, N, rows, wo)
    out = torch.empty((C, kh, kw, N, ho, wo), dtype=torch.float32)
    for i in range(kh):
        out[:, i].copy_(runs[:, :, :, i * d[0]:i * d[0] + ho])
    return out.view(C * kh * kw, N * ho * wo).t()

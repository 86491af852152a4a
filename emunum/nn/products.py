"""torch's other product functions, as ``GemmEmulator``'s products (their operands, outputs and gradients rounded
role by role, on the policy's GEMM):

- ``torch.dot`` / ``vdot`` (real): a (1, K) @ (K, 1) product;
- ``torch.inner`` and ``torch.tensordot``: one product over the contracted dimensions (an einsum);
- ``torch.addmv``: ``addmm`` with the vector as a column;
- ``torch.addbmm``: one ``addmm`` whose reduction runs over the batch and K together (batch-major), where torch
  adds B products;
- ``torch.linalg.multi_dot`` / ``torch.chain_matmul``: products left to right (torch picks the cheapest order);
- the in-place ``Tensor.addmm_``, ``baddbmm_``, ``addbmm_``, ``addmv_``: the out-of-place product, copied into
  ``self``.

``out=`` and a scalar operand of ``inner`` (an element-wise product) are not emulated (``Unsupported``)."""
from __future__ import annotations

from .functional import Unsupported, no_out

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def dot(emu, input, tensor, *, out=None):
    no_out(out)
    if input.dim() != 1 or tensor.dim() != 1:
        raise Unsupported("dot of other than two vectors")
    return emu.matmul(input.unsqueeze(0), tensor.unsqueeze(-1)).reshape(())


def inner(emu, input, other, *, out=None):
    no_out(out)
    if input.dim() == 0 or other.dim() == 0:
        raise Unsupported("inner with a scalar (an element-wise product, no GEMM)")
    return tensordot(emu, input, other, dims=([input.dim() - 1], [other.dim() - 1]))


def tensordot(emu, a, b, dims=2, out=None):
    no_out(out)
    try:
        da, db = _dims(dims, a.dim(), b.dim())
    except (TypeError, ValueError):  # torch's own call says what is wrong with dims
        raise Unsupported(f"tensordot with dims={dims!r}") from None
    if len(da) != len(db) or not da or a.dim() + b.dim() > len(_LETTERS):
        raise Unsupported(f"tensordot with dims={dims!r}")
    sa = _LETTERS[:a.dim()]
    sb = list(_LETTERS[a.dim():a.dim() + b.dim()])
    for i, j in zip(da, db):
        sb[j] = sa[i]
    sb = "".join(sb)
    out_idx = "".join(c for i, c in enumerate(sa) if i not in da) + "".join(c for j, c in enumerate(sb) if j not in db)
    return emu.einsum(f"{sa},{sb}->{out_idx}", a, b)


def _dims(dims, na: int, nb: int):
    """tensordot's dims (an int n: a's last n with b's first n; or two lists, ints or tensors) as two lists of
    non-negative dimensions."""
    if hasattr(dims, "tolist"):
        dims = dims.tolist()
    if isinstance(dims, int):
        return list(range(na - dims, na)), list(range(dims))
    da, db = (x.tolist() if hasattr(x, "tolist") else x for x in dims)
    da, db = ([x] if isinstance(x, int) else list(x) for x in (da, db))
    return [int(d) % na for d in da], [int(d) % nb for d in db]


def addmv(emu, input, mat, vec, *, beta=1, alpha=1, out=None):
    no_out(out)
    return emu.addmm(input.unsqueeze(-1), mat, vec.unsqueeze(-1), beta, alpha).squeeze(-1)


def addbmm(emu, input, batch1, batch2, *, beta=1, alpha=1, out=None):
    no_out(out)
    n, m, k = batch1.shape
    a = batch1.permute(1, 0, 2).reshape(m, n * k)
    return emu.addmm(input, a, batch2.reshape(n * k, batch2.shape[-1]), beta, alpha)


def multi_dot(emu, tensors, *, out=None):
    no_out(out)
    return chain(emu, *tensors)


def chain(emu, *matrices):
    if len(matrices) < 2:
        raise Unsupported("a chain of fewer than two matrices (no product)")
    y = matrices[0]
    for t in matrices[1:]:
        y = emu.matmul(y, t)
    return y


def in_place(product):
    """The handler of ``Tensor.<op>_``: ``self.copy_(<op>(self, ...))`` with the emulated out-of-place product."""

    def run(emu, self, *args, **kwargs):
        return self.copy_(product(emu, self, *args, **kwargs))

    return run

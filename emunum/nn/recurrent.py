"""The recurrent layers' fused ops (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu``, which
``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` call) as their recurrences over the patched model's emulated GEMMs.

For each layer and direction (PyTorch's equations and gate order):
  - the input projection of every time step, ``x W_ih^T + b_ih``, is one emulated GEMM (as cuDNN computes it);
  - each step's recurrent projection, ``h W_hh^T + b_hh``, is one emulated GEMM (and LSTM's ``proj_size``
    projection ``h W_hr^T`` another);
  - the gate sums, sigmoid/tanh/relu and the cell and hidden updates run in the tensors' dtype, unrounded, as the
    element-wise ops of any other module do.
"Emulated GEMM" is ``GemmEmulator.linear``: operands rounded in their roles (input, weight), the product on
the policy's GEMM (torch's, a MAD unit or block formats), the result rounded as the output role. Between
layers, dropout (``dropout > 0`` in training) draws from torch's generator with ``F.dropout``: the same
distribution as torch's fused kernel, not its draws. Packed sequences are not emulated (``Unsupported``: they
run as they are and ``emunum.coverage`` names them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import Unsupported

def recurrent_handler(kind: str):
    """The ``GemmMode`` handler of ``torch.<kind>``: ``handler(emu, *args)``."""

    def run(emu, *args, **kwargs):
        if kwargs or len(args) != 9:
            raise Unsupported(f"{kind} called with other than its nine positional arguments")
        packed = isinstance(args[1], Tensor) if kind == "lstm" else not isinstance(args[2], (list, tuple))
        if packed:
            raise Unsupported(f"{kind} on a PackedSequence")
        return _recurrence(emu, kind, *args)

    return run


def _recurrence(emu, kind, x: Tensor, hx, params, has_biases: bool, num_layers: int, dropout: float, train: bool,
                bidirectional: bool, batch_first: bool):
    lstm = kind == "lstm"
    h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
    emu._check(x, h0, c0, *params)
    if x.dim() != 3:
        raise Unsupported(f"{kind} input of {x.dim()} dimensions")
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
    projected = lstm and per == (5 if has_biases else 3)
    seq = x.transpose(0, 1) if batch_first else x  # (T, N, C)
    last_h, last_c = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            p = params[i * per:(i + 1) * per]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            ys, h, c = _direction(emu, kind, seq if d == 0 else seq.flip(0), p[0], p[1], b_ih, b_hh,
                                  p[-1] if projected else None, h0[i], c0[i] if lstm else None)
            outs.append(ys if d == 0 else ys.flip(0))
            last_h.append(h)
            last_c.append(c)
        seq = outs[0] if dirs == 1 else torch.cat(outs, -1)
        if dropout and train and layer < num_layers - 1:
            seq = F.dropout(seq, dropout, training=True)
    out = seq.transpose(0, 1) if batch_first else seq
    h_n = torch.stack(last_h)
    return (out, h_n, torch.stack(last_c)) if lstm else (out, h_n)


def _direction(emu, kind, seq: Tensor, w_ih, w_hh, b_ih, b_hh, w_hr, h: Tensor, c):
    """One layer in one direction over seq (T, N, C): (outputs (T, N, H_out), last h, last c)."""
    xw = emu.linear(seq, w_ih, b_ih)  # every step's input projection, one GEMM
    ys = []
    for t in range(seq.shape[0]):
        hw = emu.linear(h, w_hh, b_hh)
        if kind == "lstm":
            i, f, g, o = (xw[t] + hw).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            if w_hr is not None:
                h = emu.linear(h, w_hr)
        elif kind == "gru":
            xr, xz, xn = xw[t].chunk(3, -1)
            hr, hz, hn = hw.chunk(3, -1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            n = torch.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
        else:
            s = xw[t] + hw
            h = torch.tanh(s) if kind == "rnn_tanh" else torch.relu(s)
        ys.append(h)
    return torch.stack(ys), h, c


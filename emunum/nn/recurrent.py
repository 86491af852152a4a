"""The recurrent layers' fused ops (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu``, which
``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` call, and their one-step ``*_cell`` ops, which ``nn.LSTMCell``,
``nn.GRUCell`` and ``nn.RNNCell`` call) as their recurrences over the patched model's emulated GEMMs.

For each layer and direction (PyTorch's equations and gate order):
  - the input projection of every time step, ``x W_ih^T + b_ih``, is one emulated GEMM (as cuDNN computes it);
  - each step's recurrent projection, ``h W_hh^T + b_hh``, is one emulated GEMM (and LSTM's ``proj_size``
    projection ``h W_hr^T`` another);
  - the gate sums, sigmoid/tanh/relu and the cell and hidden updates run in the tensors' dtype, unrounded, as the
    element-wise ops of any other module do.
"Emulated GEMM" is ``GemmEmulator.linear``: operands rounded in their roles (input, weight), the product on
the policy's GEMM (torch's, a MAD unit or block formats), the result rounded as the output role. Between
layers, dropout (``dropout > 0`` in training) draws from torch's generator with ``F.dropout``: the same
distribution as torch's fused kernel, not its draws. A packed sequence (``PackedSequence``) runs the same way
on its packed data: at step t the first ``batch_sizes[t]`` sequences advance (their recurrent projection is the
step's GEMM), the others keep their state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import Unsupported

RECURRENT_KINDS = ("lstm", "gru", "rnn_tanh", "rnn_relu")  # torch.<kind> and torch.<kind>_cell


def recurrent_handler(kind: str):
    """The ``GemmMode`` handler of ``torch.<kind>``: ``handler(emu, *args)``, for padded and packed input."""

    def run(emu, *args, **kwargs):
        if kwargs or len(args) != 9:
            raise Unsupported(f"{kind} called with other than its nine positional arguments")
        packed = isinstance(args[1], Tensor) if kind == "lstm" else not isinstance(args[2], (list, tuple))
        if packed:  # (data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)
            return _recurrence(emu, kind, args[0], args[1], *args[2:], batch_first=False)
        return _recurrence(emu, kind, args[0], None, *args[1:])

    return run


def cell_handler(kind: str):
    """The ``GemmMode`` handler of ``torch.<kind>_cell`` (``nn.LSTMCell``, ``nn.GRUCell``, ``nn.RNNCell``): one
    step, its input projection and its recurrent projection each one emulated GEMM."""

    def run(emu, input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
        h, c = (hx[0], hx[1]) if kind == "lstm" else (hx, None)
        emu._check(input, h, c, w_ih, w_hh, b_ih, b_hh)
        h, c = _cell(emu, kind, emu.linear(input, w_ih, b_ih), h, c, w_hh, b_hh, None)
        return (h, c) if kind == "lstm" else h

    return run


def _recurrence(emu, kind, x: Tensor, batch_sizes, hx, params, has_biases: bool, num_layers: int, dropout: float,
                train: bool, bidirectional: bool, batch_first: bool):
    lstm = kind == "lstm"
    h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
    emu._check(x, h0, c0, *params)
    if batch_sizes is None:
        if x.dim() != 3:
            raise Unsupported(f"{kind} input of {x.dim()} dimensions")
        seq = x.transpose(0, 1) if batch_first else x  # (T, N, C)
        steps, n = seq.shape[0], seq.shape[1]
        data, sizes = seq.reshape(steps * n, seq.shape[2]), [n] * steps
    else:
        data, sizes = x, [int(b) for b in batch_sizes]
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
    projected = lstm and per == (5 if has_biases else 3)
    last_h, last_c = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            p = params[i * per:(i + 1) * per]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            ys, h, c = _direction(emu, kind, data, sizes, d == 1, p[0], p[1], b_ih, b_hh,
                                  p[-1] if projected else None, h0[i], c0[i] if lstm else None)
            outs.append(ys)
            last_h.append(h)
            last_c.append(c)
        data = outs[0] if dirs == 1 else torch.cat(outs, -1)
        if dropout and train and layer < num_layers - 1:
            data = F.dropout(data, dropout, training=True)
    if batch_sizes is None:
        data = data.reshape(steps, n, data.shape[-1])
        data = data.transpose(0, 1) if batch_first else data
    h_n = torch.stack(last_h)
    return (data, h_n, torch.stack(last_c)) if lstm else (data, h_n)


def _direction(emu, kind, data: Tensor, sizes: list, reverse: bool, w_ih, w_hh, b_ih, b_hh, w_hr, h: Tensor, c):
    """One layer in one direction over packed data (rows of step t: sizes[t] of them, from offset sum(sizes[:t])):
    (outputs in the same packed layout, last h, last c). A sequence that has not started (reverse) or has ended
    (forward) keeps its state."""
    xw = emu.linear(data, w_ih, b_ih)  # every step's input projection, one GEMM
    starts = [0]
    for b in sizes[:-1]:
        starts.append(starts[-1] + b)
    ys = [None] * len(sizes)
    for t in (reversed(range(len(sizes))) if reverse else range(len(sizes))):
        b = sizes[t]
        h_now, c_now = _cell(emu, kind, xw[starts[t]:starts[t] + b], h[:b], None if c is None else c[:b], w_hh,
                             b_hh, w_hr)
        ys[t] = h_now
        h = h_now if b == h.shape[0] else torch.cat([h_now, h[b:]])
        if c is not None:
            c = c_now if b == c.shape[0] else torch.cat([c_now, c[b:]])
    return torch.cat(ys), h, c


def _cell(emu, kind, xw: Tensor, h: Tensor, c, w_hh, b_hh, w_hr):
    """One step of ``kind`` for rows whose input projection is xw: (new h, new c)."""
    hw = emu.linear(h, w_hh, b_hh)
    if kind == "lstm":
        i, f, g, o = (xw + hw).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h if w_hr is None else emu.linear(h, w_hr)), c
    if kind == "gru":
        xr, xz, xn = xw.chunk(3, -1)
        hr, hz, hn = hw.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * h, None
    s = xw + hw
    return (torch.tanh(s) if kind == "rnn_tanh" else torch.relu(s)), None

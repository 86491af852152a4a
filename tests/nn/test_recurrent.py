"""nn.LSTM / nn.GRU / nn.RNN: their fused ops run as recurrences over emulated GEMMs (emunum/nn/recurrent.py)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from test_gemm_coverage import GridCounter

CASES = {
    "lstm": (lambda: nn.LSTM(8, 16, batch_first=True), (2, 5, 8)),
    "lstm_2layer_bidir_proj": (lambda: nn.LSTM(8, 16, num_layers=2, bidirectional=True, proj_size=6), (5, 2, 8)),
    "gru_2layer_bidir": (lambda: nn.GRU(8, 16, num_layers=2, batch_first=True, bidirectional=True), (2, 5, 8)),
    "gru_no_bias": (lambda: nn.GRU(8, 16, bias=False), (5, 2, 8)),
    "rnn_tanh": (lambda: nn.RNN(8, 16), (5, 2, 8)),
    "rnn_relu_2layer": (lambda: nn.RNN(8, 16, nonlinearity="relu", num_layers=2), (5, 2, 8)),
}


class Head(nn.Module):
    """A recurrent layer, then a Linear on its output sequence and on its last hidden state."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn
        width = getattr(rnn, "proj_size", 0) or rnn.hidden_size
        self.h = nn.Linear(width * (2 if rnn.bidirectional else 1), 3)
        self.s = nn.Linear(width, 3)

    def forward(self, x):
        out, state = self.rnn(x)
        h_n = state[0] if isinstance(state, tuple) else state
        return self.h(out).sum() + self.s(h_n).sum()


def _case(name):
    make, shape = CASES[name]
    torch.manual_seed(0)
    return Head(make()), torch.randn(shape)


def _matches_torch_on_the_exact_format(model, x, layer):
    """'fp32' rounds nothing in float32, so the emulated recurrence must give torch's own outputs and gradients
    (of the input and of ``layer(model)``'s parameters), up to summation order."""
    results = []
    for m in (model, emunum.patch(copy.deepcopy(model), "fp32")):
        xg = x.clone().requires_grad_(True)
        y = m(xg)
        y.backward()
        results.append([y.detach(), xg.grad, *[p.grad for p in layer(m).parameters()]])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_on_an_exact_format_the_recurrence_gives_torchs_outputs_and_gradients(name):
    _matches_torch_on_the_exact_format(*_case(name), lambda m: m.rnn)


@pytest.mark.parametrize("policy", [dict(fmt="e4m3fn", grad="e5m2"), dict(fmt="nvfp4"),
                                    dict(fmt="e4m3fn", mad="h100_fp8_e4m3")], ids=["e4m3fn", "nvfp4", "mad"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gemm_of_a_recurrent_layer_is_emulated(name, policy):
    model, x = _case(name)
    plain = emunum.coverage(copy.deepcopy(model), x.clone().requires_grad_(True))
    emunum.patch(model, **policy)
    cov = emunum.coverage(model, x.clone().requires_grad_(True))
    assert cov.fraction == 1.0, str(cov)
    forward = lambda c: sum(r.flops for r in c.records if r.phase == "forward")  # noqa: E731
    assert forward(cov) == forward(plain) > 0  # the same GEMMs forward; backward, torch's fused kernels may
    # compute gradients autograd does not need (h0's), so only the forward totals are compared


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gemm_operand_of_a_recurrent_layer_lies_on_the_grid(name):
    model, x = _case(name)
    emunum.patch(model, "e4m3fn")
    counter = GridCounter("e4m3fn")
    with counter:
        model(x.clone().requires_grad_(True)).backward()
    assert counter.off == 0
    # the first input projection's outputs alone outnumber every GEMM output of the two heads: so the recurrence's
    # GEMMs are among those counted (a fused recurrent kernel is not a GEMM this counter sees)
    assert counter.on >= x.shape[0] * x.shape[1] * model.rnn.weight_ih_l0.shape[0]


def test_each_gemm_rounds_operands_and_output_as_a_linear_layer_does():
    """A one-layer GRU, forward, against its equations written with ``emunum.quantize`` around each GEMM."""
    torch.manual_seed(0)
    gru, x = nn.GRU(8, 16), torch.randn(5, 2, 8) * 2
    w_ih, w_hh, b_ih, b_hh = (p.detach().clone() for p in gru.parameters())
    model = emunum.patch(Head(gru), "e5m2")
    model.forward = lambda x: model.rnn(x)  # the patched root's forward runs the GRU alone
    out, h_n = model(x)
    Q = lambda t: emunum.quantize(t, "e5m2")  # noqa: E731
    gemm = lambda a, w, b: Q(F.linear(Q(a), Q(w), Q(b)))  # noqa: E731
    xw, h, ys = gemm(x, w_ih, b_ih), torch.zeros(2, 16), []
    for t in range(5):
        xr, xz, xn = xw[t].chunk(3, -1)
        hr, hz, hn = gemm(h, w_hh, b_hh).chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        h = (1 - z) * torch.tanh(xn + r * hn) + z * h
        ys.append(h)
    assert torch.equal(out, torch.stack(ys)) and torch.equal(h_n, h[None])


PACKED = {
    "lstm_2layer_bidir": lambda: nn.LSTM(8, 16, num_layers=2, bidirectional=True),
    "lstm_proj": lambda: nn.LSTM(8, 16, proj_size=5),
    "gru_bidir": lambda: nn.GRU(8, 16, bidirectional=True),
    "rnn": lambda: nn.RNN(8, 16),
}


class PackedHead(Head):
    """The recurrent layer on a PackedSequence of lengths 5, 2 and 4 (unsorted), padded back for the head."""

    def forward(self, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 2, 4]), enforce_sorted=False)
        out, state = self.rnn(packed)
        h_n = state[0] if isinstance(state, tuple) else state
        padded, _ = nn.utils.rnn.pad_packed_sequence(out)
        return self.h(padded).square().sum() + self.s(h_n).sum()


def _packed(name):
    torch.manual_seed(0)
    return PackedHead(PACKED[name]()), torch.randn(5, 3, 8)


@pytest.mark.parametrize("name", sorted(PACKED))
def test_on_a_packed_sequence_the_exact_format_gives_torchs_outputs_and_gradients(name):
    _matches_torch_on_the_exact_format(*_packed(name), lambda m: m.rnn)


@pytest.mark.parametrize("fmt", ["e4m3fn", "nvfp4"])
@pytest.mark.parametrize("name", sorted(PACKED))
def test_every_gemm_of_a_recurrent_layer_on_a_packed_sequence_is_emulated(name, fmt):
    model, x = _packed(name)
    emunum.patch(model, fmt)
    cov = emunum.coverage(model, x.clone().requires_grad_(True))
    assert cov.fraction == 1.0 and cov.total_flops > 0, str(cov)


CELLS = {"lstm": lambda: nn.LSTMCell(8, 16), "gru": lambda: nn.GRUCell(8, 16), "rnn_tanh": lambda: nn.RNNCell(8, 16),
         "rnn_relu": lambda: nn.RNNCell(8, 16, nonlinearity="relu"),
         "gru_no_bias": lambda: nn.GRUCell(8, 16, bias=False)}


class CellSteps(nn.Module):
    """Three steps of a cell, then a Linear on the last hidden state."""

    def __init__(self, cell):
        super().__init__()
        self.cell, self.h = cell, nn.Linear(16, 3)

    def forward(self, xs):
        state = None
        for x in xs:
            state = self.cell(x, state)
        return self.h(state[0] if isinstance(state, tuple) else state).sum()


@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_cell_on_an_exact_format_gives_torchs_outputs_and_gradients(name):
    torch.manual_seed(0)
    _matches_torch_on_the_exact_format(CellSteps(CELLS[name]()), torch.randn(3, 2, 8), lambda m: m.cell)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_every_gemm_of_a_cell_is_emulated_with_torchs_flops(name):
    torch.manual_seed(0)
    model, xs = CellSteps(CELLS[name]()), torch.randn(3, 2, 8)
    plain = emunum.coverage(copy.deepcopy(model), xs.clone().requires_grad_(True))
    emunum.patch(model, "e4m3fn")
    cov = emunum.coverage(model, xs.clone().requires_grad_(True))
    assert cov.fraction == 1.0, str(cov)
    assert cov.total_flops == plain.total_flops

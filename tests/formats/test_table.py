"""TableFormat (codebooks): every rounding mode against a brute-force neighbour search over the value set,
decided with exact rational arithmetic (``fractions``), on every value, every midpoint, +-1 ulp around both,
out of range, infinities and NaN; the nearest tie rule on exact midpoints; stochastic rounding unbiased;
QLoRA's NF4 absmax blocks (``nf4_b64``) against a numpy reference; bad input named; a patched Linear trains."""
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import TABLE_PRESETS, TableFormat
from emunum.formats.block_presets import BLOCK_PRESETS

MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"]

# NF4 as printed in the QLoRA paper's appendix / bitsandbytes get_4bit_type("nf4") (typed in, not imported)
QLORA_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]

TABLES = {
    "nf4": TABLE_PRESETS["nf4"],
    "af4": TABLE_PRESETS["af4"],
    "fp4_bnb": TABLE_PRESETS["fp4_bnb"],
    # no zero, unequal gaps, a wide dynamic range, negatives only on one side of the biggest gap
    "odd_table": TableFormat([-3.0, -0.75, 0.1, 0.2, 5.0, 1e6, 1e6 + 0.5], name="odd_table"),
    "symmetric": TableFormat([-2.0, -0.5, 0.5, 2.0]),
}


def oracle(x: float, values, mode: str) -> float:
    """The rounding of x to ``values`` as TableFormat documents it, by a brute-force neighbour search and
    exact rational distances."""
    v = np.asarray(values, dtype=np.float64)
    if np.isnan(x):
        return np.nan
    if x <= v[0]:
        return float(v[0])
    if x >= v[-1]:
        return float(v[-1])
    below = np.flatnonzero(v <= x)
    i = int(below.max())
    lo, hi = float(v[i]), float(v[i + 1])
    if x == lo:
        return lo
    d_lo, d_hi = Fraction(x) - Fraction(lo), Fraction(hi) - Fraction(x)
    if mode == "nearest":
        if d_lo != d_hi:
            return lo if d_lo < d_hi else hi
        return lo if i % 2 == 0 else hi
    if mode == "nearest_away":
        if d_lo != d_hi:
            return lo if d_lo < d_hi else hi
        if abs(lo) != abs(hi):
            return lo if abs(lo) > abs(hi) else hi
        return hi if np.copysign(1.0, x) > 0 else lo
    if mode == "up":
        return hi
    if mode == "down":
        return lo
    if mode == "toward_zero":
        return lo if x >= 0 else hi
    if mode == "odd":
        return lo if i % 2 == 1 else hi
    raise ValueError(mode)


def probe_points(values) -> np.ndarray:
    """Every value, every float64 midpoint (exact for float32 tables), +-1 ulp around both, out of range."""
    v = np.asarray(values, dtype=np.float64)
    mids = v[:-1] / 2 + v[1:] / 2
    pts = np.concatenate([v, mids])
    pts = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])
    span = v[-1] - v[0]
    extra = [v[0] - span, v[-1] + span, -np.inf, np.inf, np.nan, 0.0, -0.0, 1e-300, -1e-300]
    rng = np.random.default_rng(0)
    return np.concatenate([pts, extra, rng.uniform(v[0], v[-1], 200)])


def as_result(q: float) -> float:
    return 0.0 if q == 0 else q  # the codebook has one zero: +0.0


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    m = ~np.isnan(a)
    return np.array_equal(a[m], b[m]) and np.array_equal(np.signbit(a[m]), np.signbit(b[m]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(TABLES))
def test_float64_rounding_matches_exact_brute_force_neighbour_search(name, mode):
    fmt = TABLES[name]
    x = probe_points(fmt.values_)
    want = np.array([as_result(oracle(float(e), fmt.values_, mode)) for e in x])
    got = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    assert same_bits(got, want), (x[got != want], got[got != want], want[got != want])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["nf4", "af4", "fp4_bnb"])
def test_float32_rounding_matches_brute_force_and_presets_are_float32_exact(name, mode):
    fmt = TABLES[name]
    assert all(float(np.float32(v)) == v for v in fmt.values_)
    x = probe_points(fmt.values_).astype(np.float32)
    want = np.array([as_result(oracle(float(e), fmt.values_, mode)) for e in x]).astype(np.float32)
    got = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    assert same_bits(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_inputs_round_through_float32_then_cast_back(dtype):
    fmt = TABLES["nf4"]
    x = torch.linspace(-1.5, 1.5, 301).to(dtype)
    want = np.array([oracle(float(e), fmt.values_, "nearest") for e in x.float()])
    got = emunum.quantize(x, fmt)
    assert got.dtype == dtype
    assert torch.equal(got, torch.from_numpy(want).to(dtype))


@pytest.mark.parametrize("name", ["nf4", "odd_table"])
def test_exact_midpoints_tie_to_even_code_index_and_away_to_larger_magnitude(name):
    fmt = TABLES[name]
    v = fmt.values()
    for i in range(len(v) - 1):
        m = Fraction(v[i]) / 2 + Fraction(v[i + 1]) / 2
        if Fraction(float(m)) != m:
            continue  # not a float64: no input lies on it
        got = emunum.quantize(torch.tensor([float(m)], dtype=torch.float64), fmt).item()
        assert got == (v[i] if i % 2 == 0 else v[i + 1])
        away = emunum.quantize(torch.tensor([float(m)], dtype=torch.float64), fmt, "nearest_away").item()
        assert away == (v[i] if abs(v[i]) > abs(v[i + 1]) else v[i + 1])


@pytest.mark.parametrize("mode", MODES + ["stochastic"])
@pytest.mark.parametrize("values", [np.linspace(-1, 1, 21), TABLES["odd_table"].values_], ids=["tenths", "odd"])
def test_float32_tensors_keep_their_values_of_the_codes_in_every_mode(values, mode):
    fmt = TableFormat(values)
    v = torch.tensor(fmt.values_, dtype=torch.float32)
    assert not torch.equal(v.double(), torch.from_numpy(fmt.values()))  # some values are not float32 numbers
    assert torch.equal(emunum.quantize(v, fmt, mode, seed=1), v)


def test_zero_between_symmetric_neighbours_ties_by_its_sign():
    fmt = TABLES["symmetric"]  # 0 is the exact midpoint of -0.5 and 0.5 (codes 1 and 2)
    x = torch.tensor([0.0, -0.0], dtype=torch.float64)
    assert emunum.quantize(x, fmt).tolist() == [0.5, 0.5]  # even index 2
    assert emunum.quantize(x, fmt, "nearest_away").tolist() == [0.5, -0.5]


@pytest.mark.parametrize("name", ["nf4", "odd_table"])
def test_out_of_range_saturates_to_the_ends_in_every_mode_and_nan_stays_nan(name):
    fmt = TABLES[name]
    x = torch.tensor([-np.inf, fmt.min - 1.0, fmt.max * 2 + 1, np.inf, np.nan], dtype=torch.float64)
    for mode in MODES + ["stochastic"]:
        got = emunum.quantize(x, fmt, mode, seed=1).tolist()
        assert got[:4] == [fmt.min, fmt.min, fmt.max, fmt.max]
        assert np.isnan(got[4])


@pytest.mark.parametrize("name", ["nf4", "odd_table"])
def test_stochastic_is_unbiased_within_5_sigma_and_picks_only_the_two_neighbours(name):
    fmt = TABLES[name]
    v = fmt.values()
    n = 40000
    for i in (0, len(v) // 2, len(v) - 2):
        lo, hi = v[i], v[i + 1]
        for frac in (0.1, 0.5, 0.83):
            x = lo + frac * (hi - lo)
            q = emunum.quantize(torch.full((n,), x, dtype=torch.float64), fmt, "stochastic", seed=7 + i).numpy()
            assert set(np.unique(q)) <= {lo, hi}
            p = (x - lo) / (hi - lo)
            sigma = (hi - lo) * np.sqrt(p * (1 - p) / n)
            assert abs(q.mean() - x) <= 5 * sigma


def test_stochastic_same_seed_same_bits_and_exact_values_unchanged():
    fmt = TABLES["nf4"]
    x = torch.randn(5000, dtype=torch.float64)
    a = emunum.quantize(x, fmt, "stochastic", seed=3)
    assert torch.equal(a, emunum.quantize(x, fmt, "stochastic", seed=3))
    assert not torch.equal(a, emunum.quantize(x, fmt, "stochastic", seed=4))
    exact = torch.tensor(fmt.values_, dtype=torch.float64)
    assert torch.equal(emunum.quantize(exact, fmt, "stochastic", seed=5), exact)


def test_nf4_preset_is_qloras_published_table_and_named():
    assert emunum.get_format("nf4").values_ == tuple(QLORA_NF4)
    assert emunum.get_format("NF4") is TABLE_PRESETS["nf4"]
    assert emunum.get_format("nf4").bits == 4 and emunum.get_format("fp4_bnb").n == 15
    # bitsandbytes FP4: (0, 0.0625, 2, 3, 4, 6, 8, 12) / 12 and negatives, in float32
    want = sorted({float(np.float32(s * m) / np.float32(12)) for m in (0, 0.0625, 2, 3, 4, 6, 8, 12) for s in (1, -1)})
    assert list(TABLE_PRESETS["fp4_bnb"].values_) == want


@pytest.mark.parametrize("name", list(TABLES))
def test_encode_decode_round_trip_every_code(name):
    fmt = TABLES[name]
    codes = np.arange(fmt.n)
    assert np.array_equal(fmt.encode(fmt.decode(codes)), codes)
    x = probe_points(fmt.values_)
    x = x[~np.isnan(x)]
    assert np.array_equal(fmt.decode(fmt.encode(x, "down")),
                          emunum.quantize(torch.from_numpy(x), fmt, "down").numpy())


def qlora_reference(w: np.ndarray, block: int = 64) -> np.ndarray:
    """QLoRA's blockwise NF4 storage, round trip: per block of 64 (flattened, C order), absmax in fp32,
    x / absmax (float64 here) to the nearest NF4 value (brute force over the 16 values), times absmax."""
    flat = w.reshape(-1, block)
    absmax = np.abs(flat).max(axis=1, keepdims=True).astype(np.float32).astype(np.float64)
    absmax = np.where(absmax == 0, 2.0**-149, absmax)
    nf4 = np.array(QLORA_NF4)
    scaled = flat / absmax
    dist = np.abs(scaled[..., None] - nf4)  # exact ties never occur for these random inputs
    q = nf4[np.argmin(dist, axis=-1)]
    return (q * absmax).reshape(w.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nf4_b64_matches_qlora_absmax_blockwise_reference(dtype):
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((12, 128)) * rng.uniform(0.01, 3, (12, 1))).astype(dtype)
    w[3, :64] = 0.0  # an all-zero block
    got = emunum.quantize(torch.from_numpy(w), "nf4_b64").numpy()
    want = qlora_reference(w.astype(np.float64)).astype(dtype)
    assert same_bits(got, want)
    codes, scales, _ = BLOCK_PRESETS["nf4_b64"].encode(w)
    assert codes.max() <= 15 and scales.shape == (12, 2)


def test_nf4_b64_nan_block_is_nan_and_other_blocks_unaffected():
    w = torch.randn(2, 128)
    w[0, 5] = float("nan")
    q = emunum.quantize(w, "nf4_b64")
    assert torch.isnan(q[0, :64]).all() and not torch.isnan(q[0, 64:]).any()
    assert torch.equal(q[1], emunum.quantize(w[1:], "nf4_b64")[0])


@pytest.mark.parametrize("values, match", [
    ([0.0, 2.0, 1.0], r"values\[2\]=1.0 is smaller than values\[1\]=2.0"),
    ([0.0, 1.0, 1.0, 3.0], r"values\[2\]=1.0 is a duplicate of values\[1\]=1.0"),
    ([0.0, -0.0], r"values\[1\]=-0.0 is a duplicate of values\[0\]=0.0"),
    ([0.0, np.inf], r"values\[1\]=inf is not finite"),
    ([np.nan, 1.0], r"values\[0\]=nan is not finite"),
    ([1.0], r"has 1 values; allowed: 2..65536"),
    (np.arange(65537.0), r"has 65537 values; allowed: 2..65536"),
    ([[0.0, 1.0]], r"must be 1-D"),
])
def test_bad_values_raise_value_error_naming_field_and_index(values, match):
    with pytest.raises(ValueError, match=match):
        TableFormat(values)


def test_bad_types_raise_type_error():
    with pytest.raises(TypeError, match="TableFormat.values must be a sequence"):
        TableFormat(3.0)
    with pytest.raises(TypeError, match="TableFormat.values must be a sequence of real numbers"):
        TableFormat(["a", "b"])
    with pytest.raises(TypeError, match="TableFormat.name must be a non-empty str"):
        TableFormat([0.0, 1.0], name=5)
    with pytest.raises(TypeError, match="codes must be integers"):
        TABLES["nf4"].decode([0.5])
    with pytest.raises(ValueError, match=r"codes must be in \[0, 16\)"):
        TABLES["nf4"].decode([16])


def test_spec_is_frozen_hashable_and_equal_by_values_and_name():
    a, b = TableFormat([0.0, 0.5, 1.0]), TableFormat((0.0, 0.5, 1.0))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != TableFormat([0.0, 0.5, 1.0], name="x")
    with pytest.raises(AttributeError):
        a.values_ = (1.0, 2.0)
    big = TableFormat(np.linspace(-1, 1, 65536))
    assert big.bits == 16 and big.n == 65536


def test_large_table_matches_searchsorted_reference():
    rng = np.random.default_rng(4)
    v = np.unique(rng.standard_normal(5000))
    fmt = TableFormat(v)
    x = rng.standard_normal(20000) * 1.2
    got = emunum.quantize(torch.from_numpy(x), fmt, "down").numpy()
    idx = np.clip(np.searchsorted(v, x, side="right") - 1, 0, len(v) - 1)
    assert np.array_equal(got, v[idx])


@pytest.mark.parametrize("fmt", ["nf4", "nf4_b64", TableFormat([-1.0, -0.25, 0.0, 0.25, 1.0])], ids=str)
def test_patched_linear_trains_one_step(fmt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    params = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    emunum.patch(model, fmt=fmt)
    loss = torch.nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 4))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), params))


def test_custom_op_encoding_round_trips_through_interned_ids():
    from emunum.ops import format_from_args
    from emunum.quantize import format_to_args
    fmt = TABLES["odd_table"]
    args = format_to_args(fmt)
    assert args[0] == 3 and format_from_args(args) == fmt
    assert format_to_args(TableFormat(list(fmt.values_), name="odd_table")) == args
    x = torch.randn(50, dtype=torch.float64)
    assert torch.equal(torch.ops.emunum.quantize(x, args, 0, None, 32), emunum.quantize(x, fmt))


@pytest.mark.parametrize("mode", MODES + ["stochastic"])
@pytest.mark.parametrize("name", list(TABLES))
def test_numpy_encode_agrees_with_the_kernel_in_every_mode(name, mode):
    fmt = TABLES[name]
    x = probe_points(fmt.values_)
    x = x[~np.isnan(x)]
    got = fmt.decode(fmt.encode(x, mode))
    assert np.array_equal(got, emunum.quantize(torch.from_numpy(x), fmt, mode, seed=0).numpy())


def test_pickle_and_deepcopy_rebuild_an_equal_spec_with_the_same_hash():
    import copy
    import pickle
    fmt = TABLES["odd_table"]
    for other in (pickle.loads(pickle.dumps(fmt)), copy.deepcopy(fmt)):
        assert other == fmt and hash(other) == hash(fmt) and other.name == "odd_table"


def test_cli_lists_codebooks_and_lns_examples_and_unknown_names_mention_them():
    from emunum.cli import codebook_formats_table
    rows = {line.split()[0]: line.split() for line in codebook_formats_table().splitlines()[2:]}
    assert rows["nf4"][1:3] == ["16", "4"] and rows["fp4_bnb"][1] == "15"
    assert "lns4_3" in rows
    with pytest.raises(ValueError, match=r"codebooks: nf4, af4, fp4_bnb.*lns<int_bits>_<frac_bits>"):
        emunum.get_format("nf5")


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_b64_blocks_match_bitsandbytes_quantize_4bit_away_from_its_float32_midpoints(quant_type):
    """bitsandbytes itself (optional: skipped unless installed) as the outside oracle of the codebook values
    and QLoRA's block layout. bitsandbytes scales by the float32 reciprocal of absmax and compares with float32
    midpoints (ties to the lower code), so elements within a few float32 ulps of a midpoint may legitimately
    differ; every other element must be bit-identical."""
    bnb_f = pytest.importorskip("bitsandbytes.functional")
    torch.manual_seed(3)
    x = torch.randn(64, 256) * torch.rand(64, 1) * 3
    q, state = bnb_f.quantize_4bit(x, blocksize=64, quant_type=quant_type)
    want = bnb_f.dequantize_4bit(q, state)
    fmt = emunum.BlockFormat(TABLE_PRESETS["nf4" if quant_type == "nf4" else "fp4_bnb"], 64, "fp32",
                             scale_rule="amax")
    got = emunum.quantize(x, fmt)
    v = fmt.element.values()
    mids = (v[:-1] + v[1:]) / 2
    blocks = x.double().view(-1, 64)
    scaled = (blocks / blocks.abs().amax(1, keepdim=True)).view(-1).numpy()
    near = (np.abs(scaled[:, None] - mids[None, :]) <= 8 * 2.0**-24).any(1).reshape(x.shape)
    assert near.mean() < 0.01
    assert torch.equal(got[~torch.from_numpy(near)], want[~torch.from_numpy(near)])

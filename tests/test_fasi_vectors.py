"""Published tensor-core test vectors, run on the matching ``MADUnit.preset``, against the outputs the authors report.

Sources (input values and expected outputs typed in from them; no code copied):
- [F] M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Comput.
  Sci. 7:e330 (2021), and its test suite github.com/north-numerical-computing/tensor-cores-numerical-behavior
  (commit 9dae3fc): one file per GPU and input format, ``tc_test_numerics-V100.cu`` (V100, fp16),
  ``-T4-A100-binary16.cu`` (T4 and A100, fp16), ``-A100-bf16.cu``, ``-A100-tf32.cu``. Each experiment computes
  D = C + A.B with one ``wmma::mma_sync`` on 16x16x16 matrices (16x16x8 for tf32), the vector in row 0 of A and
  column 0 of B, the rest zero, and prints PASS when d_00 equals the value stated for that GPU; the paper
  reports the features those PASS results establish. The expected values below are those per-GPU PASS values;
  items are named by the suite's sections A-D (A subnormals, B accuracy of the dot products, C rounding modes,
  D features of the accumulator; D's items numbered 1-5 as in the suite) and the suite's item titles. (Only the
  paper's abstract and introduction were reachable from this sandbox, so no table or page number is given.) The
  introduction's operation (1), D = C + A B on 4 x 4 matrices (V100, T4), d11 = c11 + a11 b11 + a12 b21 + a13 b31
  + a14 b41, is the 4-term step that the FMA-size test finds on the V100 preset.
- [KM] F. A. Khattak and M. Mikaitis, "Generalized methodology for determining numerical features of hardware
  floating-point matrix multipliers: Part I", IEEE HPEC 2025, test vectors in
  github.com/faiziktk/IEEE_HPEC2025_block_FMA_tests (commit 46136b5) ``CUDA/nvidia-tests.cu``; the features
  measured on an NVIDIA A30 with fp16 inputs are the sample output in that repository's README (A30 is the
  ``a30`` alias of the ``a100`` presets): 1 extra alignment bit, FMA size 8, 3 carry bits, late normalisation,
  fp32 output toward zero, fp16 output to nearest even, aligned significands truncated.

Features distinguished: (a) truncation vs rounding: F C (round-down/round-up) and D.4's normalisation items, KM
features 5-9; (b) terms per step: KM feature 3 (8 on A30) and F (1) (4 on V100); (c) normalisation: F D.2-D.3,
KM feature 4; (d) monotonicity: F D.5; (e) subnormals: F A (inputs, a binary32 subnormal c, subnormal outputs);
(f) extra bits: F D.1 (alignment: none on V100, one on A100), F D.4 and KM feature 2 (carries), KM feature 1.
``test_vector_rules_out_its_rival`` and the rival lines of the KM tests show that each vector separates the
measured datapath from the alternative it was designed against (so each test can fail).

Not checked, or checked differently:
- T4 (no T4 preset); A100 binary64 (no fp64 tensor-core preset).
- The bf16/tf32 files' "sum starts from largest element" writes b[-1] at j = 0 (an indexing slip); the vector is
  read as the fp16 file's.
- The fp16 files' "subnormals in output" items accept any nonzero d; here the exact value is asked (it is
  representable, so every rounding gives it).
- The T4/A100 D.5 vector's two outputs are not stated by [F], only that raising c lowers d: only that is checked.
- Khattak and Mikaitis, arXiv:2512.07004 (ACM TACO): its distinguishing vectors are not in its repository
  (github.com/north-numerical-computing/MATLAB-tensor-core holds models and random measured vectors, checked in
  tests/test_tensor_cores.py), and the paper's text was not reachable, so none of its vectors are here.
- [KM]'s bf16 and tf32 features: its README gives the measured output for fp16 inputs only.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import emunum
from emunum import FloatFormat, MADUnit

P = 2.0  # readability: P**-24 is 2**-24


def _input(x: float, fmt: str) -> float:
    """x converted to the tensor core's input format as the suites do: __float2half / __float2bfloat16 (round to
    nearest even); tf32 operands are fp32 words of which the tensor core reads the top 19 bits (truncation)."""
    if fmt == "tf32":
        w = np.array([x], np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return float(w.view(np.float32)[0])
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[fmt]
    return float(torch.tensor([x], dtype=torch.float32).to(dtype).float())


def _unit(preset) -> MADUnit:
    return preset if isinstance(preset, MADUnit) else MADUnit.preset(preset)


def operands(unit: MADUnit, a, b, c: float, k: int = 16) -> tuple[np.ndarray, np.ndarray, float]:
    """(a row, b column, c) of length k as the suites load them: converted to the input format (``_input``),
    zero-padded; c is an fp16 value for ``*_out_fp16`` units (the binary16-mode C), else a binary32 value."""
    fmt = {FloatFormat(5, 10): "fp16", FloatFormat(8, 7): "bf16", FloatFormat(8, 10): "tf32"}[unit.in_fmt]
    ra, rb = np.zeros(k, np.float32), np.zeros(k, np.float32)
    ra[:len(a)] = [_input(x, fmt) for x in a]
    rb[:len(b)] = [_input(x, fmt) for x in b]
    return ra, rb, (_input(c, "fp16") if unit.acc_fmt == FloatFormat(5, 10) else float(np.float32(c)))


def mma(preset, a, b, c: float, k: int = 16) -> float:
    """d_00 of D = C + A.B (``emunum.addmm``) on ``preset`` with the suites' layout: a in row 0 of A (16 x k), b
    in column 0 of B, c = C_00, everything else zero."""
    unit = _unit(preset)
    ra, rb, c = operands(unit, a, b, c, k)
    A, B, C = torch.zeros(16, k), torch.zeros(k, 16), torch.zeros(16, 16)
    A[0], B[:, 0], C[0, 0] = torch.from_numpy(ra), torch.from_numpy(rb), c
    return float(emunum.addmm(C, A, B, unit)[0, 0])


@dataclass(frozen=True)
class Vector:
    """One experiment: d = c + a.b on ``preset`` must be ``expected``; ``rival`` (MADUnit fields) is the datapath
    the vector rules out (its d differs), None where no MADUnit option expresses the alternative."""

    item: str
    preset: str
    a: tuple
    b: tuple
    c: float
    expected: float
    rival: dict | None = None

    @property
    def id(self) -> str:
        return f"{self.preset}:{self.item}"


def _fasi(gpu: str) -> list[Vector]:
    """[F]'s experiments with the PASS value of ``gpu``'s file: 'v100' (fp16), 'a100' (fp16), 'a100_bf16',
    'a100_tf32'."""
    fmt = {"v100": "fp16", "a100": "fp16", "a100_bf16": "bf16", "a100_tf32": "tf32"}[gpu]
    p32 = f"{gpu.split('_')[0]}_{fmt}"
    p16 = p32 + "_out_fp16"
    v100 = gpu == "v100"
    fp16 = fmt == "fp16"
    half = 1.0 if v100 else 0.5  # B.3/B.4/D.5 use a_i = 1 on V100 and 0.5 in the T4/A100 files
    small = {"fp16": P**-24, "bf16": P**-133, "tf32": P**-136}[fmt]  # smallest subnormal input
    below1 = {"fp16": 1 - P**-11, "bf16": 1 - P**-8, "tf32": 1 - P**-24}[fmt]
    sq = {"fp16": 1 - P**-10 + P**-22, "bf16": 1 - P**-7 + P**-16, "tf32": 1 - P**-10 + P**-22}[fmt]
    no_sub = {"acc_fmt": FloatFormat(8, 23, subnormals=False)}
    v = []
    # A. subnormal numbers (file titles; bf16/tf32 files: binary32 mode only)
    scale = {"fp16": 4.0, "bf16": P**7, "tf32": P**10}[fmt]
    if fp16:
        v.append(Vector("A binary16 subnormals in input (binary16 mode)", p16, (small,), (scale,), 0.0, P**-22))
    v.append(Vector(f"A {fmt} subnormals in input (binary32 mode)", p32, (small,), (scale,), 0.0, small * scale))
    v.append(Vector("A binary32 subnormals in input (c returned)", p32, (), (), P**-149, P**-149, no_sub))
    if fp16:
        for mode, preset in (("binary16", p16), ("binary32", p32)):
            v.append(Vector(f"A binary16 subnormals in output ({mode} mode, i)", preset, (P**-14,), (0.5,), 0.0,
                            P**-15))
            v.append(Vector(f"A binary16 subnormals in output ({mode} mode, ii)", preset, (P**-14,), (1.0,),
                            -P**-15, P**-15))
    else:
        v.append(Vector(f"A {fmt}/binary32 subnormals in output (i)", p32, (P**-126,), (0.5,), 0.0, P**-127,
                        no_sub))
        v.append(Vector(f"A {fmt}/binary32 subnormals in output (ii)", p32, (P**-126,), (1.0,), -P**-127, P**-127,
                        no_sub))
    # B. accuracy of the dot products
    v.append(Vector("B products are computed exactly (one)", p32, (below1,), (below1,), 0.0, sq))
    v.append(Vector("B products are computed exactly (four)", p32, (below1,) * 4, (below1,) * 4, 0.0, 4 * sq))
    if fp16:
        v.append(Vector("B products exact (binary16 mode)", p16, (below1, below1), (below1, P**-11), 0.0,
                        1 - P**-10 + P**-11))
    lossless = {"align_bits": None}
    v.append(Vector("B products are accumulated in binary32", p32, (half,) * 4, (P**-24,) * 4, 1.0, 1.0, lossless))
    for j in range(4):
        a = tuple(1.0 if i == j else half for i in range(4))
        b = tuple(1.0 if i == j else P**-24 for i in range(4))
        v.append(Vector(f"B sum starts from largest element (j={j})", p32, a, b, P**-24, 1.0, lossless))
    # C. rounding modes
    nearest = {"acc_rounding": "nearest", "align_rounding": "nearest"}  # round instead of truncate
    v.append(Vector("C round-down for positive values", p32, (1.0,) * 4, (2.0, P**-23 + P**-24), 0.0, 2.0, nearest))
    v.append(Vector("C round-up for negative values", p32, (1.0,) * 4, (-2.0, -P**-23 - P**-24), 0.0, -2.0,
                    nearest))
    if fp16:
        v.append(Vector("C accum. is rounded to nearest (binary16 mode)", p16, (P**-24, P**-24), (0.5, 0.25), 0.0,
                        P**-24, {"acc_rounding": "toward_zero"}))
    # D. features of the accumulator
    d1 = P**-23 if v100 else P**-24
    v.append(Vector("D.1 extra alignment bits (V100 none, A100 one)", p32, (1.0,), (1.0,), -(1 - P**-24), d1,
                    {"align_bits": 24 if v100 else 23}))
    per_product = {"terms": 1, "align_bits": None}
    v.append(Vector("D.2 no normalisation within a step (addition)", p32, (1.0,) * 4, (P**-24,) * 4, 1 - P**-24,
                    1 + P**-23, per_product))
    v.append(Vector("D.3 no normalisation within a step (subtraction)", p32, (1.0, 1.0), (1.0, -P**-24),
                    -1 + P**-24, P**-23 if v100 else 0.0, {"align_bits": None} if v100 else {"align_bits": 23}))
    for i in range(4):
        b = tuple(P**-23 if q == i else 1.0 for q in range(4))
        v.append(Vector(f"D.4 carry-out bits (i={i})", p32, (1.0,) * 4, b, 1 + P**-22 + P**-23, 4 + P**-21,
                        {"carry_bits": 0}))
    v.append(Vector("D.4 carry-out bits (third bit)", p32, (1.0,) * 4, (1.0, 1.5, 1.75, 1.875), 1.875, 8.0,
                    {"carry_bits": 1}))
    v.append(Vector("D.4 toward zero in normalisation, positive", p32, (1.0,) * 4, (1.0,) * 4,
                    1 + P**-22 + P**-23, 5.0, nearest))
    v.append(Vector("D.4 toward zero in normalisation, negative", p32, (1.0,) * 4, (-1.0,) * 4,
                    -1 - P**-22 - P**-23, -5.0, nearest))
    if v100:  # D.5's outputs are D.2's and B.3's vectors: both values are stated by the V100 file
        v.append(Vector("D.5 non-monotonic: c = 1 - 2**-24", p32, (1.0,) * 4, (P**-24,) * 4, 1 - P**-24, 1 + P**-23,
                        per_product))
        v.append(Vector("D.5 non-monotonic: c = 1", p32, (1.0,) * 4, (P**-24,) * 4, 1.0, 1.0, lossless))
    return v


VECTORS = [x for g in ("v100", "a100", "a100_bf16", "a100_tf32") for x in _fasi(g)]


def _replace(preset: str, **fields) -> MADUnit:
    return dataclasses.replace(MADUnit.preset(preset), **fields)


def _k(preset: str) -> int:
    """The suites' wmma depth: 16x16x16 (fp16, bf16), 16x16x8 (tf32)."""
    return 8 if preset.endswith("tf32") else 16


@pytest.mark.parametrize("vec", VECTORS, ids=[x.id for x in VECTORS])
def test_fasi_suite_vector_gives_the_output_reported_for_the_gpu(vec):
    """[F] sections A-D: d_00 equals the PASS value of the suite file for the preset's GPU and format."""
    got = mma(vec.preset, vec.a, vec.b, vec.c, k=_k(vec.preset))
    assert got == vec.expected, (vec.item, got, vec.expected)


@pytest.mark.parametrize("vec", [x for x in VECTORS if x.rival is not None],
                         ids=[x.id for x in VECTORS if x.rival is not None])
def test_vector_rules_out_its_rival(vec):
    """Each vector separates the measured datapath from the alternative it probes (rounding to nearest instead of
    truncation, more or fewer alignment or carry bits, one product per step, no subnormals): a unit with the
    rival's fields gives a different d, so the test above could fail."""
    got = mma(_replace(vec.preset, **vec.rival), vec.a, vec.b, vec.c, k=_k(vec.preset))
    assert got != vec.expected, (vec.item, vec.rival)


HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


CUDA_OK = HAVE_NUMBA_CUDA and (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or torch.cuda.is_available())


@pytest.mark.skipif(not CUDA_OK, reason="needs numba-cuda and a GPU or NUMBA_ENABLE_CUDASIM=1")
@pytest.mark.parametrize("preset", sorted({x.preset for x in VECTORS}))
def test_fasi_suite_vectors_on_the_cuda_kernel(preset):
    """[F] sections A-D through the CUDA multi-term kernel (numba's simulator without a GPU): one launch of all
    the preset's vectors as a batch of 1 x 1 outputs; every d equals the reported value."""
    from emunum.kernels import gemm_multiterm_cuda
    from emunum.mad.unit import stream_keys

    unit, vecs = MADUnit.preset(preset), [x for x in VECTORS if x.preset == preset]
    rows = [operands(unit, x.a, x.b, x.c, _k(preset)) for x in vecs]
    A = np.stack([r[0] for r in rows])[:, None, :]
    BT = np.stack([r[1] for r in rows])[:, None, :]
    C = np.array([r[2] for r in rows], np.float64).reshape(-1, 1, 1)
    out = np.zeros_like(C)
    prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params(torch.float32))
    gemm_multiterm_cuda.gemm(A, BT, C, np.zeros((1, 1, 1)), False, out, prm, mulp, accp, outerp,
                             tuple(np.uint64(q) for q in stream_keys(5)), unit.sr_bits)
    assert [float(d) for d in out.reshape(-1)] == [x.expected for x in vecs]


@pytest.mark.parametrize("preset,k", [("a100_fp16", 16), ("a100_bf16", 16), ("a100_tf32", 8)])
def test_fasi_D5_increasing_c_decreases_d_on_a100(preset, k):
    """[F] D.5 (T4/A100 files): with a = (1/2, 1/2, 1/2, 1/2), b = (2**-24, 2**-24, 2**-24, 3 * 2**-24), raising c
    from 1 - 2**-24 to 1 lowers d (no normalisation inside the step, so the dot product is not monotonic)."""
    a, b = (0.5,) * 4, (P**-24,) * 3 + (P**-23 + P**-24,)
    assert mma(preset, a, b, 1.0, k) < mma(preset, a, b, 1 - P**-24, k)
    one_per_step = _replace(preset, terms=1, align_bits=None)  # the monotone rival: normalise after every product
    assert mma(one_per_step, a, b, 1.0, k) >= mma(one_per_step, a, b, 1 - P**-24, k)


def test_fasi_D5_increasing_c_decreases_d_on_v100():
    """[F] D.5 (V100 file): a = (1, 1, 1, 1), b = (2**-24,) * 4: d(c = 1) < d(c = 1 - 2**-24)."""
    a, b = (1.0,) * 4, (P**-24,) * 4
    assert mma("v100_fp16", a, b, 1.0) < mma("v100_fp16", a, b, 1 - P**-24)


def fma_size(preset, k_max: int = 15, pout: int = 24) -> int:
    """[KM] feature 3 (nvidia-tests.cu): c = 1 + 2**(1-pout), a_1 = b_1 = 1, a_k = 2**(1-pout), b_k = 1 for
    k = 2, 3, ...; the first k whose d (positive and negated) is not 2 + 2**(2-pout) puts a_k in the next step,
    and the FMA size is k - 1."""
    for k in range(2, k_max):
        a = [0.0] * k
        b = [0.0] * k
        a[0], b[0], a[k - 1], b[k - 1] = 1.0, 1.0, P**(1 - pout), 1.0
        d_pos = mma(preset, a, b, 1 + P**(1 - pout))
        d_neg = mma(preset, [-x for x in a], b, -1 - P**(1 - pout))
        if d_pos != 2 + P**(2 - pout) and abs(d_neg) != 2 + P**(2 - pout):
            return k - 1
    return 0


def test_khattak_mikaitis_feature3_fma_size_is_8_on_a30_fp16():
    """[KM] feature 3, A30 fp16 (README sample output): 'The FMA size is: 8'."""
    assert fma_size("a30_fp16") == 8
    assert fma_size(_replace("a30_fp16", terms=4)) == 4  # the procedure sees the unit's terms


def test_fasi_operation_1_v100_adds_four_products_per_step():
    """[F] operation (1) (Introduction): the V100 tensor core computes d11 = c11 + a11 b11 + ... + a14 b41 per
    operation (4 products), found with [KM]'s feature-3 vectors."""
    assert fma_size("v100_fp16") == 4


def test_khattak_mikaitis_feature2_three_carry_bits_on_a30_fp16():
    """[KM] feature 2, A30 fp16: 'Number of extra bits detected are: 3', which nvidia-tests.cu derives from the
    FMA size n as floor(log2(n (2 - 2**(1 - pin)))), pin = 11 (fp16); 8 of the largest fp16 products add without
    a wrap, which 2 carry bits would not allow."""
    n, pin = fma_size("a30_fp16"), 11
    assert int(np.floor(np.log2(n * (2 - P**(1 - pin))))) == 3
    # no carry is lost: 8 products of the largest fp16 significand (2 - 2**-10)**2 and c add exactly
    m, exact = 2 - P**-10, float(np.float32(8 * (2 - P**-10) ** 2))
    assert mma("a30_fp16", (m,) * 8, (m,) * 8, 0.0) == exact
    assert mma(_replace("a30_fp16", carry_bits=2), (m,) * 8, (m,) * 8, 0.0) != exact  # 2 carry bits wrap


def test_khattak_mikaitis_feature1_one_extra_alignment_bit_on_a30_fp16():
    """[KM] feature 1, A30 fp16: 'One bit existence test: Passed', 'Two bits existence test: Failed'."""
    one = ((P**-24, P**-24), (1.0, 1.0), 1.0)
    two = ((P**-24,) * 3, (1.0, 0.5, 0.5), 1.0)
    assert mma("a30_fp16", *one) == 1 + P**-23
    assert mma("a30_fp16", *two) != 1 + P**-23
    assert mma(_replace("a30_fp16", align_bits=23), *one) != 1 + P**-23  # no extra bit: fails the first
    assert mma(_replace("a30_fp16", align_bits=25), *two) == 1 + P**-23  # two extra bits: passes the second


def test_khattak_mikaitis_feature4_late_normalisation_on_a30_fp16():
    """[KM] feature 4 (t = 3), A30 fp16: '-> Delayed/Late normalisation', i.e. d = 1 + 2**-21 + 2**-23 for
    a = (2**-21 + 2**-24,) * 2, b = (1, 1), c = 1 - 2**-21."""
    a, b, c = (P**-21 + P**-24,) * 2, (1.0, 1.0), 1 - P**-21
    assert mma("a30_fp16", a, b, c) == 1 + P**-21 + P**-23
    # normalising (and truncating) after every product gives KM's 'immediate normalisation' value 1 + 2**-21
    assert mma(_replace("a30_fp16", terms=1, align_bits=None), a, b, c) == 1 + P**-21


def test_khattak_mikaitis_feature5_fp32_output_toward_zero_on_a30_fp16():
    """[KM] feature 5, A30 fp16: 'Round towards zero/truncation': c = 1 + 2**-23 + 2**-22, three products 1 -> 4
    (and -4 when negated)."""
    c = 1 + P**-23 + P**-22
    assert mma("a30_fp16", (1.0,) * 3, (1.0,) * 3, c) == 4.0
    assert mma("a30_fp16", (-1.0,) * 3, (1.0,) * 3, -c) == -4.0
    assert mma(_replace("a30_fp16", acc_rounding="nearest"), (1.0,) * 3, (1.0,) * 3, c) == 4 + P**-21  # KM's RNE


def test_khattak_mikaitis_feature6_fp16_output_to_nearest_on_a30_fp16():
    """[KM] feature 6, A30 fp16 output: 'Round to nearest (even)': c = 1 + 2**-10 + 2**-9 (fp16), three products
    1 -> 4 + 2**-8 (and its negation)."""
    c = 1 + P**-10 + P**-9
    assert mma("a30_fp16_out_fp16", (1.0,) * 3, (1.0,) * 3, c) == 4 + P**-8
    assert mma("a30_fp16_out_fp16", (-1.0,) * 3, (1.0,) * 3, -c) == -(4 + P**-8)
    assert mma(_replace("a30_fp16_out_fp16", acc_rounding="toward_zero"), (1.0,) * 3, (1.0,) * 3, c) == 4.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_khattak_mikaitis_features7_9_aligned_significands_truncated_on_a30_fp16(sign):
    """[KM] features 7 and 9 (neab = 1; printed as 'Feature 6. Rounding Mode for significand alignment' and
    'Feature 9. Rounding Mode in Significands Alignment'), A30 fp16: 'Round towards zero/truncation':
    c = 1, a = (2**-24,) * 2, b = (3/4,) * 2 -> d = 1 (rounding to nearest would give 1 + 2**-23)."""
    assert mma("a30_fp16", (sign * P**-24,) * 2, (0.75,) * 2, sign) == sign
    rne = _replace("a30_fp16", align_rounding="nearest")
    assert mma(rne, (sign * P**-24,) * 2, (0.75,) * 2, sign) == sign * (1 + P**-23)  # KM's rne_const


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_khattak_mikaitis_feature8_steps_combined_toward_zero_on_a30_fp16(sign):
    """[KM] feature 8 (printed as 'Feature 7. Rounding Mode Compilation of Multiple BFMA output'), A30 fp16:
    c = 1 + 2**-23 and one product 2**-24 * 3/2 in the second step (index 8) -> d = 1 + 2**-23 ('Round towards
    zero/truncation')."""
    a, b = [0.0] * 9, [0.0] * 9
    a[8], b[8] = sign * P**-24, 1.5
    assert mma("a30_fp16", a, b, sign * (1 + P**-23)) == sign * (1 + P**-23)
    rne = _replace("a30_fp16", acc_rounding="nearest")
    assert mma(rne, a, b, sign * (1 + P**-23)) == sign * (1 + P**-22)  # KM's rne_const

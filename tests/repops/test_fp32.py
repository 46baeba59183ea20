"""fp32.execute: exact binary32 semantics of the RepOps instructions.

Three independent references: Berkeley TestFloat vectors (every file that maps to an opcode),
Berkeley SoftFloat through ``softfloatpy`` (Hypothesis, edge-biased operands), and exact
rational arithmetic for the opcodes neither of those covers (LDEXP, GETEXP, GETMANT, MAX, MIN).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import platform
import struct
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest
import softfloatpy as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.testfloat import load_vectors, vector_dir
from verde_chain.repops import fp32
from verde_chain.repops.isa import CANONICAL_NAN, Op

VECTORS = vector_dir()
ONE = 0x3F800000
INF = 0x7F800000
NINF = 0xFF800000
MAXF = 0x7F7FFFFF

# file -> (opcode, number of operands); comparisons give 0/1 in the file, 1.0/0.0 here.
VECTOR_FILES = {
    "f32_add": (Op.ADD, 2),
    "f32_sub": (Op.SUB, 2),
    "f32_mul": (Op.MUL, 2),
    "f32_div": (Op.DIV, 2),
    "f32_sqrt": (Op.SQRT, 1),
    "f32_mulAdd": (Op.FMA, 3),
    "f32_roundToInt_rnear_even": (Op.RINT, 1),
    "f32_roundToInt_rmin": (Op.FLOOR, 1),
    "f32_eq": (Op.EQ, 2),
    "f32_lt": (Op.LT, 2),
}
NOT_OPCODES = {
    "f32_to_i32_rminMag": "float->int conversion is not a RepOps opcode (SoftFloat32.sol covers it)",
    "i32_to_f32": "int->float conversion is not a RepOps opcode (SoftFloat32.sol covers it)",
    "ui32_to_f32": "int->float conversion is not a RepOps opcode (SoftFloat32.sol covers it)",
}


def is_nan(bits: np.ndarray | int) -> np.ndarray | bool:
    return (np.asarray(bits, dtype=np.uint32) & 0x7FFFFFFF) > 0x7F800000


def load_columns(name: str, n_operands: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The operand columns and the expected-result column of a TestFloat file, as uint32."""
    rows = load_vectors(name, missing=pytest.skip)
    table = np.array([r[: n_operands + 1] for r in rows], dtype=np.uint32)
    cols = [np.ascontiguousarray(table[:, i]) for i in range(n_operands + 1)]
    return cols[:n_operands], cols[n_operands]


@pytest.mark.parametrize("name", sorted(VECTOR_FILES))
def test_testfloat_vectors(name: str) -> None:
    op, n = VECTOR_FILES[name]
    operands, expected = load_columns(name, n)
    assert len(expected) >= 500
    if op in (Op.EQ, Op.LT):
        expected = np.where(expected == 1, np.uint32(ONE), np.uint32(0)).astype(np.uint32)
    padded = operands + [np.zeros_like(expected)] * (3 - n)
    got = fp32.execute(op, *padded)
    # NaN results must be exactly the canonical NaN; TestFloat's default NaN is FFC00000.
    ok = np.where(is_nan(expected), got == CANONICAL_NAN, got == expected)
    bad = np.flatnonzero(~ok)
    detail = [
        ([hex(int(o[i])) for o in operands], hex(int(expected[i])), hex(int(got[i]))) for i in bad[:5]
    ]
    assert bad.size == 0, f"{bad.size}/{len(expected)} mismatches, first: {detail}"


@pytest.mark.parametrize("name", sorted(NOT_OPCODES))
def test_conversion_vectors_are_not_opcodes(name: str) -> None:
    path = VECTORS / f"{name}.txt"
    assert path.exists(), f"{path} is missing: the TestFloat vectors (../shared/testvectors) sit beside the checkout"
    pytest.skip(NOT_OPCODES[name])


# ---------------------------------------------------------------- edge-biased binary32 strategy

def _edges() -> list[int]:
    out = [0, 1, 2, 0x007FFFFF, 0x00800000, 0x00800001, ONE, ONE - 1, ONE + 1, MAXF, INF,
           CANONICAL_NAN, 0x7F800001, 0x7FFFFFFF, 0x4B000000, 0x4AFFFFFF, 0x3F000000, 0x3EFFFFFF,
           0x3FC00000, 0x40400000]
    for e in (1, 23, 24, 63, 100, 127, 149, 150, 200, 254):  # around powers of two
        for off in (-1, 0, 1):
            out.append((e << 23) + off if e < 255 else INF)
    return sorted({b & 0x7FFFFFFF for b in out})


EDGES = _edges()
_mag = st.one_of(
    st.sampled_from(EDGES),
    st.integers(0, 0x007FFFFF),  # subnormals
    st.integers(0, 0x7F800000),  # any finite or inf
    st.integers(0x3E800000, 0x41000000),  # [0.25, 8): where cancellations and ties happen
)
f32_bits = st.builds(lambda m, s: m | (0x80000000 if s else 0), _mag, st.booleans())


def sf32(b: int) -> sf.Float32:
    return sf.Float32.from_bytes(struct.pack(">I", b))


def sfbits(x: sf.Float32) -> int:
    return struct.unpack(">I", x.to_bytes())[0]


def same(got: int, want: int) -> bool:
    return got == CANONICAL_NAN if is_nan(want) else got == want


SOFTFLOAT_BINARY = {
    Op.ADD: sf.f32_add,
    Op.SUB: sf.f32_sub,
    Op.MUL: sf.f32_mul,
    Op.DIV: sf.f32_div,
}

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _rne() -> None:
    sf.set_rounding_mode(sf.RoundingMode.NEAR_EVEN)


@SETTINGS
@given(a=f32_bits, b=f32_bits, c=f32_bits)
def test_fma_matches_softfloat(a: int, b: int, c: int) -> None:
    want = sfbits(sf.f32_mul_add(sf32(a), sf32(b), sf32(c)))
    assert same(fp32.scalar(Op.FMA, a, b, c), want)


@SETTINGS
@given(a=f32_bits, b=f32_bits)
def test_fma_cancellation_matches_softfloat(a: int, b: int) -> None:
    # c = -round(a*b) makes the exact residual the answer: the hardest case for emulations.
    prod = sfbits(sf.f32_mul(sf32(a), sf32(b)))
    for c in (prod ^ 0x80000000, (prod ^ 0x80000000) + 1, prod):
        want = sfbits(sf.f32_mul_add(sf32(a), sf32(b), sf32(c & 0xFFFFFFFF)))
        assert same(fp32.scalar(Op.FMA, a, b, c & 0xFFFFFFFF), want)


@SETTINGS
@given(op=st.sampled_from(sorted(SOFTFLOAT_BINARY)), a=f32_bits, b=f32_bits)
def test_binary_ops_match_softfloat(op: Op, a: int, b: int) -> None:
    want = sfbits(SOFTFLOAT_BINARY[op](sf32(a), sf32(b)))
    assert same(fp32.scalar(op, a, b), want)


@SETTINGS
@given(a=f32_bits, b=f32_bits)
def test_compare_ops_match_softfloat(a: int, b: int) -> None:
    assert fp32.scalar(Op.LT, a, b) == (ONE if sf.f32_lt_quiet(sf32(a), sf32(b)) else 0)
    assert fp32.scalar(Op.EQ, a, b) == (ONE if sf.f32_eq(sf32(a), sf32(b)) else 0)


@SETTINGS
@given(a=f32_bits)
def test_unary_ops_match_softfloat(a: int) -> None:
    assert same(fp32.scalar(Op.SQRT, a), sfbits(sf.f32_sqrt(sf32(a))))
    rint = sf.f32_round_to_int(sf32(a), sf.RoundingMode.NEAR_EVEN, False)
    assert same(fp32.scalar(Op.RINT, a), sfbits(rint))
    floor = sf.f32_round_to_int(sf32(a), sf.RoundingMode.MIN, False)
    assert same(fp32.scalar(Op.FLOOR, a), sfbits(floor))
    neg, ab, mov = (fp32.scalar(o, a) for o in (Op.NEG, Op.ABS, Op.MOV))
    if is_nan(a):
        assert neg == ab == mov == CANONICAL_NAN
    else:
        assert (neg, ab, mov) == (a ^ 0x80000000, a & 0x7FFFFFFF, a)


# ---------------------------------------------------------------- exact rational references

def value(b: int) -> Fraction | float:
    """Exact value of a finite pattern as a Fraction; inf/NaN as Python floats."""
    f = struct.unpack(">f", struct.pack(">I", b))[0]
    return f if not math.isfinite(f) else Fraction(f)


def round_fraction(x: Fraction) -> int:
    """Round an exact rational to binary32 (RNE, subnormals, overflow) -> bit pattern."""
    if x == 0:
        return 0
    sign = 0x80000000 if x < 0 else 0
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1  # now 2**e <= x < 2**(e+1)
    e = max(e, -126)
    quantum = Fraction(2) ** (e - 23)
    q, r = divmod(x / quantum, 1)
    q = int(q)
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and q % 2 == 1):
        q += 1
    result = q * quantum
    if result >= Fraction(2) ** 128:
        return sign | INF
    return sign | struct.unpack(">I", struct.pack(">f", float(result)))[0]


exps = st.one_of(
    st.integers(-300, 300),
    st.sampled_from([-150, -149, -126, -125, 127, 128, 254, 277, -277]),
)


@SETTINGS
@given(a=f32_bits, e=exps)
def test_ldexp_integral_exponent(a: int, e: int) -> None:
    b = struct.unpack(">I", struct.pack(">f", float(e)))[0]
    got = fp32.scalar(Op.LDEXP, a, b)
    va = value(a)
    if isinstance(va, float):  # inf or NaN in, unchanged out (canonical NaN)
        assert got == (CANONICAL_NAN if math.isnan(va) else a)
        return
    want = round_fraction(va * Fraction(2) ** e)
    if va == 0:
        want = a  # keeps the sign of zero
    elif want & 0x7FFFFFFF == 0:
        want |= a & 0x80000000  # underflow to zero keeps the sign
    assert got == want, (hex(a), e, hex(got), hex(want))


def test_ldexp_special_exponents() -> None:
    half = 0x3F000000
    cases = [
        (ONE, INF, INF), (ONE | 0x80000000, INF, NINF), (1, INF, INF), (0, INF, CANONICAL_NAN),
        (ONE, NINF, 0), (ONE | 0x80000000, NINF, 0x80000000), (INF, NINF, CANONICAL_NAN),
        (INF, 0x4F000000, INF), (ONE, half, CANONICAL_NAN), (ONE, CANONICAL_NAN, CANONICAL_NAN),
        (ONE, 0x7F7FFFFF, INF), (ONE, 0xFF7FFFFF, 0), (MAXF, 0xBF800000, 0x7EFFFFFF),
        # rounding into subnormals happens once: 1.5 * 2**-149 -> 2**-148 (tie to even)
        (0x3FC00000, 0xC3150000, 2), (0x3FA00000, 0xC3150000, 1),
        (MAXF, 0x3F800000, INF), (0x00400000, 0x3F800000, 0x00800000),
    ]
    for a, b, want in cases:
        assert fp32.scalar(Op.LDEXP, a, b) == want, (hex(a), hex(b))


@SETTINGS
@given(a=f32_bits)
def test_getexp_getmant_reconstruct(a: int) -> None:
    ge, gm = fp32.scalar(Op.GETEXP, a), fp32.scalar(Op.GETMANT, a)
    va = value(a)
    if isinstance(va, float) and math.isnan(va):
        assert ge == gm == CANONICAL_NAN
    elif isinstance(va, float):
        assert (ge, gm) == (INF, ONE)
    elif va == 0:
        assert (ge, gm) == (NINF, ONE)
    else:
        e = value(ge)
        m = value(gm)
        assert isinstance(e, Fraction) and e.denominator == 1
        assert 1 <= m < 2
        assert m * Fraction(2) ** int(e) == abs(va)


@SETTINGS
@given(a=f32_bits, b=f32_bits)
def test_max_min_select(a: int, b: int) -> None:
    va, vb = value(a), value(b)
    mx, mn = fp32.scalar(Op.MAX, a, b), fp32.scalar(Op.MIN, a, b)
    if (isinstance(va, float) and math.isnan(va)) or (isinstance(vb, float) and math.isnan(vb)):
        assert mx == mn == CANONICAL_NAN
    else:
        key = lambda bits: (value(bits), 0 if bits & 0x80000000 else 1)  # -0 sorts below +0
        assert mx == max(a, b, key=key)
        assert mn == min(a, b, key=key)
    # SELECT on a as condition: NaN is true, +-0 false
    sel = fp32.scalar(Op.SELECT, a, b, 0x40000000)
    cond = not (isinstance(va, Fraction) and va == 0)
    want = b if cond else 0x40000000
    assert sel == (CANONICAL_NAN if is_nan(want) else want)


def test_signed_zero_rules() -> None:
    nz = 0x80000000
    assert fp32.scalar(Op.MAX, nz, 0) == 0 and fp32.scalar(Op.MAX, 0, nz) == 0
    assert fp32.scalar(Op.MIN, nz, 0) == nz and fp32.scalar(Op.MIN, 0, nz) == nz
    assert fp32.scalar(Op.EQ, nz, 0) == ONE and fp32.scalar(Op.LT, nz, 0) == 0
    assert fp32.scalar(Op.SELECT, nz, ONE, 0x40000000) == 0x40000000
    assert fp32.scalar(Op.FMA, nz, ONE, nz) == nz  # (-0*1) + -0 = -0
    assert fp32.scalar(Op.FMA, ONE, ONE, 0xBF800000) == 0  # exact cancellation gives +0
    assert fp32.scalar(Op.SQRT, nz) == nz
    assert fp32.scalar(Op.RINT, 0xBE800000) == nz  # rint(-0.25) = -0


def test_vectorised_shapes_and_broadcast() -> None:
    a = np.array([[ONE, 0x40000000], [INF, 1]], dtype=np.uint32)
    out = fp32.execute(Op.ADD, a, np.uint32(ONE), np.uint32(0))
    assert out.shape == (2, 2) and out.dtype == np.uint32
    assert out.tolist() == [[0x40000000, 0x40400000], [INF, ONE]]
    zero_d = fp32.execute(Op.MUL, np.uint32(0x40000000), np.uint32(0x40000000), np.uint32(0))
    assert zero_d.shape == () and int(zero_d) == 0x40800000


def test_non_arithmetic_ops_refused() -> None:
    for op in (Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX):
        with pytest.raises(fp32.UnsupportedInstruction):
            fp32.scalar(op, 0)


def test_nan_payloads_are_canonicalised() -> None:
    snan, neg_qnan = 0x7F800001, 0xFFC12345
    for op in (Op.ADD, Op.MUL, Op.FMA, Op.SQRT, Op.RINT, Op.FLOOR, Op.MOV, Op.NEG, Op.ABS):
        assert fp32.scalar(op, snan, ONE, ONE) == CANONICAL_NAN
        assert fp32.scalar(op, neg_qnan, ONE, ONE) == CANONICAL_NAN
    assert fp32.scalar(Op.SELECT, ONE, neg_qnan, 0) == CANONICAL_NAN
    assert fp32.scalar(Op.SQRT, 0xBF800000) == CANONICAL_NAN
    assert fp32.scalar(Op.SUB, INF, INF) == CANONICAL_NAN


def test_fma_random_bulk_against_softfloat() -> None:
    # A denser vectorised sweep than Hypothesis: exponents clustered so products and addends
    # overlap, including subnormal results.
    rng = np.random.default_rng(1234)
    n = 20000
    sign = rng.integers(0, 2, (3, n), dtype=np.uint32) << 31
    exp = rng.integers(0, 40, (3, n), dtype=np.uint32) + np.array([[90], [10], [0]], dtype=np.uint32)
    man = rng.integers(0, 1 << 23, (3, n), dtype=np.uint32)
    ops = sign | (exp << 23) | man
    got = fp32.execute(Op.FMA, ops[0], ops[1], ops[2])
    for i in range(n):
        want = sfbits(sf.f32_mul_add(sf32(int(ops[0, i])), sf32(int(ops[1, i])), sf32(int(ops[2, i]))))
        assert same(int(got[i]), want), [hex(int(x)) for x in ops[:, i]]


# ------------------------------------------------------------------ the FP environment, per call


@pytest.fixture
def flushing() -> Iterator[None]:
    """FTZ and DAZ switched on in this thread AFTER fp32 was imported (as torch does it)."""
    import torch

    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def test_flush_to_zero_after_import_is_refused_by_name_never_wrong_bits(flushing: None) -> None:
    # The environment really flushes (else this test proves nothing): numpy itself gives 0.
    tiny = np.array([1], np.uint32).view(np.float32)
    assert (tiny + tiny).view(np.uint32)[0] == 0
    with pytest.raises(fp32.FlushToZeroDetected, match="set_flush_denormal"):
        fp32.execute(Op.ADD, [0x1], [0x1])
    with pytest.raises(fp32.FlushToZeroDetected):
        fp32.scalar(Op.MUL, ONE, ONE)  # no subnormal in sight: refused all the same


def test_every_numpy_spec_entry_refuses_a_flushing_thread(flushing: None) -> None:
    from verde_chain.repops import library, program, reference, transcendental

    x = np.array([1.0, 2.0], np.float32)
    desc = library.map_unary("neg", x.shape)
    for run in (
        lambda: reference.run(desc, [x]),
        lambda: program.run_spec(desc, [x]),
        lambda: transcendental.evaluate("exp", x.view(np.uint32)),
    ):
        with pytest.raises(fp32.FlushToZeroDetected):
            run()


def test_the_same_thread_computes_again_once_flushing_is_off() -> None:
    import torch

    torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    assert fp32.execute(Op.ADD, [0x1], [0x1]).tolist() == [0x2]


@pytest.mark.parametrize("mode", ["FE_UPWARD", "FE_DOWNWARD", "FE_TOWARDZERO"])
def test_a_rounding_mode_other_than_nearest_is_refused(mode: str) -> None:
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    value = {"FE_DOWNWARD": 0x400, "FE_UPWARD": 0x800, "FE_TOWARDZERO": 0xC00}[mode]  # x86 <fenv.h>
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the fenv constants above are x86's")
    assert libm.fesetround(value) == 0
    try:
        with pytest.raises(fp32.FlushToZeroDetected):
            fp32.execute(Op.ADD, [ONE], [0x33000000])
    finally:
        libm.fesetround(0)
    assert fp32.scalar(Op.ADD, ONE, 0x33000000) == ONE

"""The Python twin of SoftFloat32 (verde_chain/vm/softfloat.py, no chain): TestFloat vectors,
softfloatpy, numpy, RepOps fp32.

Every Berkeley TestFloat vector goes through the twin and must match bit for bit, except that a
NaN result must be exactly the canonical NaN (TestFloat's default NaN is FFC00000). For
f32_to_i32_rminMag the twin returns the x86 "integer indefinite" 0x80000000 for NaN, infinities
and out-of-range inputs, which is exactly what the vector files expect (they were generated with
the 8086 specialisation), so those cases are compared exactly too.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import NoReturn

import numpy as np
import pytest
import softfloatpy as sfp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.floats import f32_st, moderate, s32
from tests.support.testfloat import TestFloatMissing, load_vectors, result_matches
from verde_chain.vm import softfloat as sf

EXAMPLES = int(os.environ.get("VERDE_SOFTFLOAT_EXAMPLES", "600"))
CANON = sf.CANONICAL_NAN


# file -> (number of operands, twin function on operand bits returning result bits)
VECTOR_OPS: dict[str, tuple[int, Callable[..., int]]] = {
    "f32_add": (2, sf.add),
    "f32_sub": (2, sf.sub),
    "f32_mul": (2, sf.mul),
    "f32_div": (2, sf.div),
    "f32_sqrt": (1, sf.sqrt),
    "f32_mulAdd": (3, sf.fma),
    "f32_eq": (2, lambda a, b: int(sf.eq(a, b))),
    "f32_lt": (2, lambda a, b: int(sf.lt(a, b))),
    "f32_roundToInt_rnear_even": (1, sf.rint),
    "f32_roundToInt_rmin": (1, sf.floor),
    "i32_to_f32": (1, lambda a: sf.from_int32(s32(a))),
    "ui32_to_f32": (1, sf.from_uint32),
    "f32_to_i32_rminMag": (1, lambda a: sf.to_int32(a) & 0xFFFFFFFF),
}

# ------------------------------------------------------------------------- TestFloat vectors


@pytest.mark.parametrize("name", sorted(VECTOR_OPS))
def test_testfloat_vectors(name: str) -> None:
    arity, fn = VECTOR_OPS[name]
    rows = load_vectors(name, missing=pytest.skip)
    assert len(rows) >= 300, f"{name}: suspiciously few vectors ({len(rows)})"
    mismatches = []
    for row in rows:
        got = fn(*row[:arity])
        if not result_matches(name, got, row[arity]):
            mismatches.append((" ".join(f"{v:08X}" for v in row), f"{got:08X}"))
    assert not mismatches, f"{name}: {len(mismatches)}/{len(rows)} differ, first: {mismatches[:5]}"


def test_to_int32_invalid_cases_are_integer_indefinite() -> None:
    rows = load_vectors("f32_to_i32_rminMag", missing=pytest.skip)
    invalid = [r for r in rows if r[2] & 0x10]
    assert len(invalid) > 50
    for a, expected, _flags in invalid:
        assert expected == 0x80000000
        assert sf.to_int32(a) == sf.INT32_INDEFINITE


def test_missing_vector_file_raises_or_hands_over_the_reason() -> None:
    with pytest.raises(TestFloatMissing) as ei:
        load_vectors("f32_no_such_op")
    assert ei.value.path.name == "f32_no_such_op.txt"
    reasons: list[str] = []

    def record(reason: str) -> NoReturn:
        reasons.append(reason)
        raise LookupError(reason)

    with pytest.raises(LookupError):
        load_vectors("f32_no_such_op", missing=record)
    assert reasons == [str(ei.value)] and "VERDE_TESTFLOAT_DIR" in reasons[0]


def test_result_matches_wants_the_canonical_nan_for_float_results() -> None:
    assert result_matches("f32_add", sf.CANONICAL_NAN, 0xFFC00000)
    assert not result_matches("f32_add", 0xFFC00000, 0xFFC00000)  # TestFloat's NaN is not ours
    assert result_matches("f32_add", 0x3F800000, 0x3F800000)
    assert not result_matches("f32_add", 0x3F800001, 0x3F800000)
    # integer results are compared as they are, even where the bits look like a NaN
    assert result_matches("f32_to_i32_rminMag", 0xFFFFFFFF, 0xFFFFFFFF)
    assert not result_matches("f32_to_i32_rminMag", sf.CANONICAL_NAN, 0xFFFFFFFF)


# ------------------------------------------------------------------------- softfloatpy

sfp.set_rounding_mode(sfp.RoundingMode.NEAR_EVEN)


def _F(bits: int) -> sfp.Float32:
    return sfp.Float32.from_bytes(bits.to_bytes(4, "big"))


def _b(f: sfp.Float32) -> int:
    return int.from_bytes(f.to_bytes(), "big")


def _canon_ref(bits: int) -> int:
    return CANON if sf.is_nan(bits) else bits


SOFTFLOAT_BINARY = {
    "add": (sf.add, sfp.f32_add),
    "sub": (sf.sub, sfp.f32_sub),
    "mul": (sf.mul, sfp.f32_mul),
    "div": (sf.div, sfp.f32_div),
}


@pytest.mark.parametrize("op", sorted(SOFTFLOAT_BINARY))
@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st, b=f32_st)
def test_binary_vs_softfloatpy(op: str, a: int, b: int) -> None:
    twin, ref = SOFTFLOAT_BINARY[op]
    assert twin(a, b) == _canon_ref(_b(ref(_F(a), _F(b))))


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st, b=f32_st, c=f32_st)
def test_fma_vs_softfloatpy(a: int, b: int, c: int) -> None:
    assert sf.fma(a, b, c) == _canon_ref(_b(sfp.f32_mul_add(_F(a), _F(b), _F(c))))


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=moderate(), b=moderate(), c=moderate())
def test_fma_cancellation_vs_softfloatpy(a: int, b: int, c: int) -> None:
    # c close to -a*b: massive cancellation, the hardest case for a single rounding
    p = sf.mul(a, b)
    for cc in (c, p ^ sf.SIGN_BIT, (p ^ sf.SIGN_BIT) + 1, (p ^ sf.SIGN_BIT) - 1):
        cc &= 0xFFFFFFFF
        assert sf.fma(a, b, cc) == _canon_ref(_b(sfp.f32_mul_add(_F(a), _F(b), _F(cc))))


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st)
def test_unary_vs_softfloatpy(a: int) -> None:
    x = _F(a)
    assert sf.sqrt(a) == _canon_ref(_b(sfp.f32_sqrt(x)))
    assert sf.rint(a) == _canon_ref(_b(sfp.f32_round_to_int(x, sfp.RoundingMode.NEAR_EVEN, False)))
    assert sf.floor(a) == _canon_ref(_b(sfp.f32_round_to_int(x, sfp.RoundingMode.MIN, False)))
    # softfloatpy (RISC-V specialisation) saturates invalid conversions differently; compare the
    # in-range cases and check ours gives the integer indefinite elsewhere.
    ref = sfp.f32_to_i32(x, sfp.RoundingMode.MIN_MAG, False).to_int()
    flags_invalid = sf.is_nan(a) or sf.is_inf(a) or not _trunc_in_range(a)
    assert sf.to_int32(a) == (sf.INT32_INDEFINITE if flags_invalid else ref)


def _trunc_in_range(a: int) -> bool:
    """Whether trunc(a) fits int32, decided with exact rationals (independent of the twin)."""
    from fractions import Fraction

    sign, exp, frac = a >> 31, (a >> 23) & 0xFF, a & 0x7FFFFF
    mag = Fraction(frac, 1 << 149) if exp == 0 else Fraction((1 << 23) | frac) * Fraction(2) ** (exp - 150)
    t = int(mag)  # truncation toward zero of the magnitude
    return t <= (2**31 if sign else 2**31 - 1)


@settings(max_examples=EXAMPLES, deadline=None)
@given(i=st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**24 + 1])))
def test_int_conversions_vs_softfloatpy(i: int) -> None:
    assert sf.from_int32(i) == _b(sfp.i32_to_f32(sfp.Int32.from_int(i)))
    u = i & 0xFFFFFFFF
    assert sf.from_uint32(u) == _b(sfp.ui32_to_f32(sfp.UInt32.from_int(u)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st, b=f32_st)
def test_compare_vs_softfloatpy(a: int, b: int) -> None:
    x, y = _F(a), _F(b)
    assert sf.eq(a, b) == sfp.f32_eq(x, y)
    assert sf.lt(a, b) == sfp.f32_lt_quiet(x, y)
    assert sf.le(a, b) == sfp.f32_le_quiet(x, y)


# ------------------------------------------------------------------------- numpy float32


def _np(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def _bits_np(x: np.floating) -> int:
    return int(np.array([x], np.float32).view(np.uint32)[0])


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st, b=f32_st)
def test_vs_numpy(a: int, b: int) -> None:
    x, y = _np(a), _np(b)
    with np.errstate(all="ignore"):
        assert sf.add(a, b) == _canon_ref(_bits_np(x + y))
        assert sf.mul(a, b) == _canon_ref(_bits_np(x * y))
        assert sf.div(a, b) == _canon_ref(_bits_np(x / y))
        assert sf.sqrt(a) == _canon_ref(_bits_np(np.sqrt(x)))
        assert sf.rint(a) == _canon_ref(_bits_np(np.rint(x)))
        assert sf.floor(a) == _canon_ref(_bits_np(np.floor(x)))
        if not (sf.is_zero(a) and sf.is_zero(b)):  # numpy leaves max(-0, +0) unspecified
            assert sf.max_(a, b) == _canon_ref(_bits_np(np.maximum(x, y)))
            assert sf.min_(a, b) == _canon_ref(_bits_np(np.minimum(x, y)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st, n=st.one_of(st.integers(-300, 300), st.integers(-(2**40), 2**40)))
def test_ldexp_vs_numpy(a: int, n: int) -> None:
    # a * 2**n is exact in binary64 for |n| <= 400, so one cast is the only rounding
    x = np.float64(_np(a))
    with np.errstate(all="ignore"):
        ref = np.float32(np.ldexp(x, max(-400, min(400, n))))
    assert sf.ldexp(a, n) == _canon_ref(_bits_np(ref))


# ------------------------------------------------------------------------- RepOps fp32


def _isa_ops() -> list[int]:
    return sorted(sf.ISA_ARITHMETIC_OPS)


@pytest.mark.parametrize("op", _isa_ops())
@settings(max_examples=max(100, EXAMPLES // 3), deadline=None)
@given(a=f32_st, b=f32_st, c=f32_st, small=st.integers(-200, 200))
def test_isa_ops_vs_repops_fp32(op: int, a: int, b: int, c: int, small: int) -> None:
    fp32 = pytest.importorskip("verde_chain.repops.fp32")
    from verde_chain.repops.isa import Op

    if Op(op) == Op.LDEXP and small % 2:
        b = sf.from_int32(small)  # mostly integral exponents, which is where the work is
    ref = fp32.scalar(Op(op), a, b, c)
    assert sf.execute(op, a, b, c) == ref, f"{Op(op).name}({a:08X}, {b:08X}, {c:08X})"


# ------------------------------------------------------------------------- defined semantics


def f(x: float) -> int:
    return struct.unpack(">I", struct.pack(">f", x))[0]


def test_signed_zero_rules() -> None:
    pz, nz = 0x00000000, 0x80000000
    assert sf.add(pz, nz) == pz and sf.add(nz, nz) == nz and sf.sub(nz, pz) == nz
    assert sf.sub(f(1.5), f(1.5)) == pz  # exact cancellation is +0
    assert sf.mul(nz, f(3.0)) == nz and sf.div(pz, f(-2.0)) == nz
    assert sf.sqrt(nz) == nz
    assert sf.fma(f(-1.0), pz, pz) == pz  # (-0) + (+0) = +0
    assert sf.fma(f(-1.0), pz, nz) == nz  # (-0) + (-0) = -0
    assert sf.fma(f(2.0), f(3.0), f(-6.0)) == pz
    assert sf.max_(nz, pz) == pz and sf.max_(pz, nz) == pz
    assert sf.min_(nz, pz) == nz and sf.min_(pz, nz) == nz
    assert sf.eq(nz, pz) and not sf.lt(nz, pz) and sf.le(pz, nz)
    assert sf.rint(f(-0.5)) == nz and sf.floor(nz) == nz and sf.floor(f(-1e-30)) == f(-1.0)


def test_every_nan_result_is_canonical() -> None:
    nans = [0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xFF812345]
    for n in nans:
        for r in (
            sf.add(n, 0),
            sf.mul(0, n),
            sf.fma(n, 0, 0),
            sf.fma(0, 0, n),
            sf.sqrt(n),
            sf.max_(n, 0),
            sf.min_(0, n),
            sf.rint(n),
            sf.floor(n),
            sf.neg(n),
            sf.abs_(n),
            sf.ldexp(n, 3),
            sf.getexp(n),
            sf.getmant(n),
            sf.mov(n),
            sf.select(0, 0, n),
        ):
            assert r == CANON
    invalid = [
        sf.sub(sf.POS_INF, sf.POS_INF),
        sf.mul(sf.POS_INF, 0),
        sf.div(0, 0),
        sf.div(sf.NEG_INF, sf.POS_INF),
        sf.sqrt(f(-1.0)),
        sf.fma(sf.POS_INF, 0, f(1.0)),
        sf.fma(sf.POS_INF, f(1.0), sf.NEG_INF),
        sf.ldexp_f(0, sf.POS_INF),
        sf.ldexp_f(sf.POS_INF, sf.NEG_INF),
        sf.ldexp_f(f(1.0), f(0.5)),
    ]
    assert invalid == [CANON] * len(invalid)


def test_getexp_getmant() -> None:
    assert sf.getexp(f(1.0)) == f(0.0) and sf.getmant(f(1.0)) == f(1.0)
    assert sf.getexp(f(-6.0)) == f(2.0) and sf.getmant(f(-6.0)) == f(1.5)
    assert sf.getexp(0x00000001) == f(-149.0) and sf.getmant(0x00000001) == f(1.0)
    assert sf.getexp(0x00600000) == f(-127.0) and sf.getmant(0x00600000) == f(1.5)
    assert sf.getexp(0x7F7FFFFF) == f(127.0) and sf.getmant(0x7F7FFFFF) == 0x3FFFFFFF
    assert sf.getexp(0x80000000) == sf.NEG_INF and sf.getmant(0x80000000) == f(1.0)
    assert sf.getexp(sf.NEG_INF) == sf.POS_INF and sf.getmant(sf.NEG_INF) == f(1.0)


@settings(max_examples=EXAMPLES, deadline=None)
@given(a=f32_st)
def test_getmant_times_two_to_getexp_is_abs(a: int) -> None:
    if sf.is_nan(a) or sf.is_inf(a) or sf.is_zero(a):
        return
    k = sf.to_int32(sf.getexp(a))
    m = sf.getmant(a)
    assert 0x3F800000 <= m < 0x40000000
    assert sf.ldexp(m, k) == a & sf.ABS_MASK


def test_ldexp_rounds_once_into_subnormals_and_saturates() -> None:
    assert sf.ldexp(f(1.0), -149) == 0x00000001
    assert sf.ldexp(f(1.0), -150) == 0x00000000  # exactly half the smallest subnormal: ties to even
    assert sf.ldexp(f(1.5), -150) == 0x00000001  # above half: rounds up
    assert sf.ldexp(f(3.0), -150) == 0x00000002  # 1.5 ulps: ties to even (2)
    assert sf.ldexp(0x00000001, 149) == f(1.0)  # subnormal back to normal, exact
    assert sf.ldexp(f(1.0), 128) == sf.POS_INF and sf.ldexp(f(-1.0), 10**9) == sf.NEG_INF
    assert sf.ldexp(f(-1.0), -(10**9)) == 0x80000000
    assert sf.ldexp_f(f(1.0), sf.POS_INF) == sf.POS_INF
    assert sf.ldexp_f(f(-3.0), sf.NEG_INF) == 0x80000000
    assert sf.ldexp_f(f(3.0), f(-2.0)) == f(0.75)
    assert sf.ldexp_f(f(3.0), f(1e30)) == sf.POS_INF


def test_to_int32_edges() -> None:
    assert sf.to_int32(f(-2147483648.0)) == -(2**31)
    assert sf.to_int32(f(2147483520.0)) == 2147483520  # largest binary32 below 2**31
    assert sf.to_int32(f(2147483648.0)) == sf.INT32_INDEFINITE
    assert sf.to_int32(f(-1.9999)) == -1 and sf.to_int32(f(0.99999)) == 0
    assert sf.to_int32(0x00000001) == 0 and sf.to_int32(0x80000001) == 0
    assert sf.to_int32(CANON) == sf.INT32_INDEFINITE and sf.to_int32(sf.NEG_INF) == sf.INT32_INDEFINITE


def test_overflow_and_underflow_boundaries() -> None:
    maxf = 0x7F7FFFFF
    assert sf.add(maxf, f(2.0**103)) == sf.POS_INF  # exactly half an ulp above max: ties away to inf
    assert sf.add(maxf, 0x72FFFFFF) == maxf  # just below half an ulp: stays
    assert sf.mul(0x00800000, f(0.5)) == 0x00400000  # into subnormals, exact
    assert sf.mul(0x00000001, f(0.5)) == 0  # half the smallest subnormal ties to +0
    assert sf.mul(0x00000003, f(0.5)) == 0x00000002  # 1.5 -> 2 (even)
    assert sf.div(f(1.0), f(3.0)) == 0x3EAAAAAB
    assert sf.sqrt(f(2.0)) == 0x3FB504F3 and sf.sqrt(0x00000002) == f(2.0**-74)


def test_invalid_operands_raise() -> None:
    with pytest.raises(sf.SoftFloatError):
        sf.add(-1, 0)
    with pytest.raises(sf.SoftFloatError):
        sf.mul(0, 1 << 32)
    with pytest.raises(sf.SoftFloatError):
        sf.from_int32(2**31)
    with pytest.raises(sf.NotArithmetic):
        sf.execute(17, 0)  # CONST reads an immediate, not registers

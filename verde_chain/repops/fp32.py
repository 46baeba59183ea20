"""Exact IEEE-754 binary32 semantics of every arithmetic RepOps instruction, vectorised.

This module is the executable definition of what one ScalarVM instruction computes. Registers
hold raw binary32 bit patterns, so every function here takes and returns ``uint32`` arrays.
The on-chain SoftFloat32 library and every kernel backend must agree with it bit for bit.

Common rules (all opcodes):

* Rounding is round-to-nearest, ties-to-even, done once per instruction.
* Subnormal inputs and results are honoured (never flushed to zero).
* Any NaN result is replaced by ``CANONICAL_NAN`` (0x7FC00000), whatever the input payloads.

Opcode details that IEEE-754 leaves open or that RepOps defines itself:

* ``MAX``/``MIN``: NaN if either operand is NaN; ``-0 < +0`` (max(-0,+0) = +0, min = -0).
* ``LT``/``EQ``: 1.0 (0x3F800000) or +0.0; false when either operand is NaN; ``-0 == +0``.
* ``SELECT``: ``b`` when ``a != 0.0`` as a float (NaN counts as true; -0 counts as zero), else ``c``.
* ``RINT``: round to an integral value, ties to even (IEEE roundToIntegralTiesToEven).
* ``FLOOR``: round to an integral value toward -inf (IEEE roundToIntegralTowardNegative).
* ``LDEXP a, b``: ``a * 2**b`` rounded once (so results can round into subnormals or
  overflow to inf). ``b`` must be an integral float; ``b = +-inf`` is the limit of huge exponents
  (``a * 2**+inf`` = +-inf for finite non-zero ``a``, ``+-0 * 2**+inf`` = NaN,
  ``+-inf * 2**-inf`` = NaN, ``a * 2**-inf`` = +-0 for finite ``a``). A NaN or non-integral
  finite ``b`` gives NaN.
* ``GETEXP a``: ``floor(log2(|a|))`` as a float, exact, also for subnormals (e.g. 2**-149 ->
  -149.0). ``GETEXP(+-0) = -inf``, ``GETEXP(+-inf) = +inf``, ``GETEXP(NaN) = NaN``.
* ``GETMANT a``: ``|a| / 2**GETEXP(a)`` in [1, 2), exact. ``GETMANT(+-0) = GETMANT(+-inf) = 1.0``
  (so ``GETMANT(a) * 2**GETEXP(a)`` reproduces ``|a|`` for zeros and infinities too),
  ``GETMANT(NaN) = NaN``. The sign of ``a`` is ignored by both.
* ``NEG``/``ABS``/``MOV``: exact sign operations / copy; a NaN operand gives the canonical NaN.
* ``FMA a, b, c``: ``a*b + c`` with one rounding. Implemented as: the product ``a*b`` is exact
  in binary64 (24x24 -> 48 significant bits, exponents well inside binary64's range); the sum
  with ``c`` is computed in binary64 with *round-to-odd* (RNE sum, exact error term by TwoSum,
  then the last bit forced odd when inexact); the binary64 round-to-odd result rounded to binary32
  equals the exactly rounded result because 53 >= 24 + 2 (Boldo & Melquiond, "Emulation of FMA
  and correctly rounded sums: proved algorithms using rounding to odd").

``CONST``, ``LOAD``, ``COORD`` and ``LOADIDX`` read immediates or memory, not registers; they are
executed by the program interpreter, and :func:`execute` refuses them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import CANONICAL_NAN, Op

U32 = npt.NDArray[np.uint32]

ONE_BITS = 0x3F800000
SIGN_BIT = np.uint32(0x80000000)
ABS_MASK = np.uint32(0x7FFFFFFF)
# |exponent| beyond which a*2**b is already +-0 or +-inf for every finite non-zero binary32 a
# (|log2 a| <= 149), clamped so that the binary64 ldexp below stays exact and in range.
_LDEXP_CLAMP = 400.0


class UnsupportedInstruction(RepOpsError):
    """``fp32.execute`` was given an opcode that is not a register-to-register arithmetic op."""

    def __init__(self, op: Op) -> None:
        self.op = op
        super().__init__(f"fp32.execute: {op.name} is not an arithmetic instruction")


class FlushToZeroDetected(RepOpsError):
    """This thread's floating-point environment is not IEEE's default (flush-to-zero or
    denormals-are-zero on, or a rounding mode other than nearest-even), so numpy would compute
    wrong bits."""


# The probe: one numpy add whose four results expose the environment. 2^-149 + 2^-149 = 2^-148
# is 0 under DAZ (the inputs read as 0) or FTZ (the subnormal result flushed); 1 + 2^-25 and
# -1 - 2^-25 (below half an ulp) move only under rounding up / down; 1 + 1.5*2^-24 (above half
# an ulp) stays at 1 toward zero or down.
_PROBE_A = np.array([0x00000001, 0x3F800000, 0xBF800000, 0x3F800000], np.uint32).view(np.float32)
_PROBE_B = np.array([0x00000001, 0x33000000, 0xB3000000, 0x33C00000], np.uint32).view(np.float32)
_PROBE_WANT = np.array([0x00000002, 0x3F800000, 0xBF800000, 0x3F800001], np.uint32).tobytes()


def require_ieee_env() -> None:
    """Raise :class:`FlushToZeroDetected` unless this thread computes IEEE binary32 as the spec
    needs (subnormals honoured, round to nearest even).

    SAFETY: everything in this module trusts numpy's arithmetic, which runs under the calling
    thread's MXCSR; any library may change it at any time (``torch.set_flush_denormal(True)``),
    so this runs on every :func:`execute` call (under a microsecond) rather than once at import.
    """
    if (_PROBE_A + _PROBE_B).tobytes() != _PROBE_WANT:
        raise FlushToZeroDetected(
            "this thread flushes subnormals (FTZ/DAZ) or does not round to nearest, so numpy would give wrong "
            "bits; turn it off first (torch.set_flush_denormal(False))"
        )


def _f(bits: U32) -> npt.NDArray[np.float32]:
    return bits.view(np.float32)


def _bits(x: npt.NDArray[np.float32]) -> U32:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _canon(bits: U32) -> U32:
    """Replace every NaN pattern by the canonical NaN."""
    nan = (bits & ABS_MASK) > np.uint32(0x7F800000)
    if nan.any():
        bits = np.where(nan, np.uint32(CANONICAL_NAN), bits).astype(np.uint32)
    return bits


def _bool_to_f32(mask: npt.NDArray[np.bool_]) -> U32:
    return np.where(mask, np.uint32(ONE_BITS), np.uint32(0)).astype(np.uint32)


def fma_bits(a: U32, b: U32, c: U32) -> U32:
    """``a*b + c`` rounded once to binary32 (see module docstring for the method)."""
    p = _f(a).astype(np.float64) * _f(b).astype(np.float64)  # exact: 48 bits, no under/overflow
    z = _f(c).astype(np.float64)
    s = p + z
    # TwoSum (Knuth): p + z == s + err exactly whenever s is finite.
    bb = s - p
    err = (p - (s - bb)) + (z - bb)
    s_bits = np.ascontiguousarray(s).view(np.uint64)
    # Round-to-odd: an inexact sum whose last bit is even moves one binary64 ulp towards the
    # exact value; the neighbour in that direction is the odd one.
    fix = np.isfinite(s) & (err != 0.0) & ((s_bits & np.uint64(1)) == 0)
    if fix.any():
        away = np.signbit(err) == np.signbit(s)  # exact value lies further from zero than s
        step = np.where(away, np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF))  # +1 or -1 (mod 2**64)
        s_bits = np.where(fix, s_bits + step, s_bits)
        s = s_bits.view(np.float64)
    return _bits(s.astype(np.float32))


def _max_min(a: U32, b: U32, is_max: bool) -> U32:
    fa, fb = _f(a), _f(b)
    take_a = fa > fb if is_max else fa < fb
    # Equal values have equal bits except +0/-0: AND of the patterns prefers +0 (for max),
    # OR prefers -0 (for min).
    tie = (a & b) if is_max else (a | b)
    out = np.where(take_a, a, np.where(fa == fb, tie, b)).astype(np.uint32)
    nan = np.isnan(fa) | np.isnan(fb)
    return np.where(nan, np.uint32(CANONICAL_NAN), out).astype(np.uint32)


def _ldexp(a: U32, b: U32) -> U32:
    fa = _f(a).astype(np.float64)
    fb = _f(b).astype(np.float64)
    finite_b = np.isfinite(fb)
    integral = finite_b & (np.floor(fb) == fb)
    # Infinite b acts as a clamped huge exponent; the products below then give the limits.
    e = np.clip(np.where(integral | ~finite_b, fb, 0.0), -_LDEXP_CLAMP, _LDEXP_CLAMP)
    e = np.nan_to_num(e, nan=0.0).astype(np.int64)
    # Exact in binary64: |a| in [2**-149, 2**128), |e| <= 400 keeps us inside [2**-549, 2**528].
    out = np.ldexp(fa, e).astype(np.float32)  # the only rounding
    bad = np.isnan(fb) | (finite_b & ~integral)
    bad |= (fb == np.inf) & (fa == 0.0)
    bad |= (fb == -np.inf) & np.isinf(fa)
    out = np.where(bad, np.float32(np.nan), out)
    return _bits(out)


def _frexp_parts(a: U32) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(exponent, mantissa in [1,2)) of |a| for finite non-zero a; binary64 makes subnormals normal."""
    mag = np.abs(_f(a).astype(np.float64))
    m, e = np.frexp(mag)  # mag = m * 2**e, m in [0.5, 1)
    return (e - 1).astype(np.float64), m * 2.0


def _getexp(a: U32) -> U32:
    e, _ = _frexp_parts(a)
    fa = _f(a)
    out = np.where(fa == 0, -np.inf, np.where(np.isinf(fa), np.inf, e))
    out = np.where(np.isnan(fa), np.nan, out)
    return _bits(out.astype(np.float32))


def _getmant(a: U32) -> U32:
    _, m = _frexp_parts(a)
    fa = _f(a)
    out = np.where((fa == 0) | np.isinf(fa), 1.0, m)
    out = np.where(np.isnan(fa), np.nan, out)
    return _bits(out.astype(np.float32))


def _arith(fn: Callable[..., npt.NDArray[np.float32]]) -> Callable[[U32, U32, U32], U32]:
    def run(a: U32, b: U32, c: U32) -> U32:
        return _bits(fn(_f(a), _f(b)))

    return run


_HANDLERS: dict[Op, Callable[[U32, U32, U32], U32]] = {
    Op.ADD: _arith(np.add),
    Op.SUB: _arith(np.subtract),
    Op.MUL: _arith(np.multiply),
    Op.DIV: _arith(np.divide),
    Op.SQRT: lambda a, b, c: _bits(np.sqrt(_f(a))),
    Op.FMA: fma_bits,
    Op.MAX: lambda a, b, c: _max_min(a, b, True),
    Op.MIN: lambda a, b, c: _max_min(a, b, False),
    Op.LT: lambda a, b, c: _bool_to_f32(_f(a) < _f(b)),
    Op.EQ: lambda a, b, c: _bool_to_f32(_f(a) == _f(b)),
    Op.SELECT: lambda a, b, c: np.where(_f(a) != 0, b, c).astype(np.uint32),
    Op.RINT: lambda a, b, c: _bits(np.rint(_f(a))),
    Op.FLOOR: lambda a, b, c: _bits(np.floor(_f(a))),
    Op.LDEXP: lambda a, b, c: _ldexp(a, b),
    Op.GETEXP: lambda a, b, c: _getexp(a),
    Op.GETMANT: lambda a, b, c: _getmant(a),
    Op.NEG: lambda a, b, c: (a ^ SIGN_BIT).astype(np.uint32),
    Op.ABS: lambda a, b, c: (a & ABS_MASK).astype(np.uint32),
    Op.MOV: lambda a, b, c: a.copy(),
}

ARITHMETIC_OPS = frozenset(_HANDLERS)


def execute(op: Op, a: npt.ArrayLike, b: npt.ArrayLike = 0, c: npt.ArrayLike = 0) -> U32:
    """Execute one arithmetic instruction elementwise on uint32 bit-pattern arrays.

    ``a``, ``b``, ``c`` broadcast together (0-d arrays allowed); operands an opcode does not use
    are ignored. Returns a uint32 array of the broadcast shape. Raises
    :class:`FlushToZeroDetected` if this thread's FP environment would give other bits.
    """
    handler = _HANDLERS.get(Op(op))
    if handler is None:
        raise UnsupportedInstruction(Op(op))
    require_ieee_env()
    aa, bb, cc = (np.asarray(x, dtype=np.uint32) for x in (a, b, c))
    aa, bb, cc = np.broadcast_arrays(aa, bb, cc)
    shape = aa.shape
    # Work on contiguous 1-d copies (views between uint32/float32 need contiguity).
    aa, bb, cc = (np.ascontiguousarray(x).reshape(-1) for x in (aa, bb, cc))
    with np.errstate(all="ignore"):
        out = handler(aa, bb, cc)
    return _canon(np.asarray(out, dtype=np.uint32)).reshape(shape)


def scalar(op: Op, a_bits: int, b_bits: int = 0, c_bits: int = 0) -> int:
    """One instruction on scalar bit patterns (convenience for tests and proof builders)."""
    return int(execute(op, np.uint32(a_bits), np.uint32(b_bits), np.uint32(c_bits)))

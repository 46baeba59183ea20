"""Python twin of ``contracts/vm/SoftFloat32.sol``: IEEE-754 binary32 in plain integers.

Every function takes and returns raw binary32 bit patterns (``int`` in ``0 .. 2**32-1``) and
mirrors the Solidity algorithm step by step, so the bots can predict, bit for bit, what the
contract computes. No Python floats, no numpy.

Why one module over ~500 lines: it follows ``SoftFloat32.sol`` function by function, in the
contract's order, so the differential test and a reviewer can read the two side by side; split,
the twin would no longer mirror its contract.

Bit layout (the same picture opens the Solidity library)::

     31 30          23 22                                0
    +--+--------------+-----------------------------------+
    |s | exponent (8) |          fraction (23)            |
    +--+--------------+-----------------------------------+
    exponent 0      : zero / subnormal, value = (-1)^s * fraction * 2**-149
    exponent 1..254 : normal,  value = (-1)^s * (2**23 + fraction) * 2**(exponent - 150)
    exponent 255    : fraction 0 = infinity, otherwise NaN

Rules: round to nearest, ties to even; subnormals honoured (never flushed); signed zeros as
IEEE-754 prescribes; every NaN *result* is the canonical quiet NaN ``0x7FC00000``.

Arithmetic ops share one shape: unpack each operand's magnitude into ``(m, e)`` with
``|x| = m * 2**e`` (:func:`_unpack`; the sign is bit 31), compute the exact result, or an
exact one with a "sticky" low bit standing for a non-zero remainder far below the rounding
position, and hand it to :func:`_round_pack`, the only place that rounds. As in Solidity, add,
sub and fma share :func:`_add_signed`, rint and floor :func:`_to_integral`, getexp and getmant
:func:`_logb`.
"""

from __future__ import annotations

from collections.abc import Callable

from verde_chain.errors import VerdeError

CANONICAL_NAN = 0x7FC00000
POS_INF = 0x7F800000
NEG_INF = 0xFF800000
SIGN_BIT = 0x80000000
ABS_MASK = 0x7FFFFFFF
FRAC_MASK = 0x007FFFFF
HIDDEN_BIT = 0x00800000
ONE = 0x3F800000
# Result of to_int32 for NaN, infinities and out-of-range values: the x86 "integer indefinite"
# (what cvttss2si and Berkeley TestFloat's 8086 specialisation produce).
INT32_INDEFINITE = -(2**31)

# Exponent of the least significant bit of subnormals (and of the smallest normal binade).
MIN_LSB_EXP = -149
# Operands whose lsb exponents differ by more than this are not aligned exactly: the smaller one
# only contributes a sticky bit (see _align). 48-bit product << 200 still fits 256 bits.
ALIGN_LIMIT = 200
# Width of the guard field the dominant operand is shifted by when the other one is jammed.
JAM_SHIFT = 32
# Extra quotient / root bits computed by div and sqrt before rounding (plus a sticky bit).
DIV_SHIFT = 60
SQRT_SHIFT = 60
# ldexp exponents beyond this saturate: any finite non-zero x * 2**400 overflows and any
# x * 2**-400 rounds to zero, so clamping does not change a result.
LDEXP_CLAMP = 400

U32 = 0xFFFFFFFF


class SoftFloatError(VerdeError):
    """An operand is not a 32-bit pattern (mirrors the Solidity harness' input checks)."""

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name}={value!r} is not a uint32 bit pattern")


# --------------------------------------------------------------------------- classification


def _check(name: str, x: int) -> None:
    if not isinstance(x, int) or not 0 <= x <= U32:
        raise SoftFloatError(name, x)


def is_nan(x: int) -> bool:
    return (x & ABS_MASK) > POS_INF


def is_inf(x: int) -> bool:
    return (x & ABS_MASK) == POS_INF


def is_zero(x: int) -> bool:
    return (x & ABS_MASK) == 0


def _exp_field(x: int) -> int:
    return (x >> 23) & 0xFF


def _unpack(x: int) -> tuple[int, int]:
    """(m, e) with |x| = m * 2**e; x must be finite (its sign is x >> 31)."""
    exp = _exp_field(x)
    frac = x & FRAC_MASK
    if exp == 0:
        return frac, MIN_LSB_EXP  # zero or subnormal: no hidden bit
    return frac | HIDDEN_BIT, exp - 150


def _msb(m: int) -> int:
    """Index of the most significant set bit of m > 0."""
    # Solidity: binary search (no CLZ opcode before Osaka).
    return m.bit_length() - 1


def _round_pack(sign: int, m: int, e: int) -> int:
    """Round (-1)^sign * m * 2**e to binary32, nearest-even. Needs 0 <= m < 2**250."""
    if m == 0:
        return sign << 31
    assert m < 1 << 250, "INVARIANT: callers keep m below 2**250 (see ALIGN_LIMIT, DIV_SHIFT)"
    top = _msb(m)
    # lsb exponent of the result: 24 significant bits, but never below the subnormal grid
    q = max(e + top - 23, MIN_LSB_EXP)
    s = q - e
    if s <= 0:
        r = m << -s  # exact, fits 24 bits
    else:
        # Beyond 255 the EVM's shifts saturate; any s >= 251 already rounds m < 2**250 to 0.
        s = min(s, 255)
        r = m >> s
        rem = m & ((1 << s) - 1)
        half = 1 << (s - 1)
        if rem > half or (rem == half and (r & 1)):
            r += 1  # a carry out of 24 bits bumps the exponent field below, as it should
    # (q + 149) is the biased exponent minus one for normals and 0 for subnormals, so the
    # hidden bit of r adds the missing one; a rounding carry lands in the exponent field.
    bits = min(((q - MIN_LSB_EXP) << 23) + r, POS_INF)  # overflow -> infinity
    return (sign << 31) | bits


def _align(m1: int, e1: int, m2: int, e2: int) -> tuple[int, int, int]:
    """Bring m1*2**e1 and m2*2**e2 (e1 >= e2) to one exponent: (M1, M2, e).

    Exact when e1 - e2 <= ALIGN_LIMIT. Otherwise operand 1 is non-zero and so dominant that
    operand 2 lies below a quarter ulp of any possible result; it is replaced by a sticky 1 under
    JAM_SHIFT guard bits, which keeps the value in the same rounding interval.
    """
    d = e1 - e2
    if d <= ALIGN_LIMIT:
        return m1 << d, m2, e2
    return m1 << JAM_SHIFT, 1 if m2 != 0 else 0, e1 - JAM_SHIFT


def _add_magnitudes(s1: int, m1: int, s2: int, m2: int, e: int) -> int:
    """Round (-1)^s1*m1*2**e + (-1)^s2*m2*2**e; an exact zero of unlike signs is +0."""
    if s1 == s2:
        return _round_pack(s1, m1 + m2, e)
    if m1 > m2:
        return _round_pack(s1, m1 - m2, e)
    m = m2 - m1
    return _round_pack(s2 if m else 0, m, e)


def _add_signed(s1: int, m1: int, x1: int, s2: int, m2: int, x2: int) -> int:
    """Round (-1)^s1*m1*2**x1 + (-1)^s2*m2*2**x2 once (add, sub and fma share it)."""
    if x1 < x2:  # larger lsb exponent first (addition commutes, and so does the +0 rule)
        s1, m1, x1, s2, m2, x2 = s2, m2, x2, s1, m1, x1
    a1, a2, e = _align(m1, x1, m2, x2)
    return _add_magnitudes(s1, a1, s2, a2, e)


# --------------------------------------------------------------------------- arithmetic


def add(a: int, b: int) -> int:
    _check("a", a)
    _check("b", b)
    abs_a, abs_b = a & ABS_MASK, b & ABS_MASK
    if abs_a >= POS_INF or abs_b >= POS_INF:
        if abs_a > POS_INF or abs_b > POS_INF:
            return CANONICAL_NAN
        if abs_a == abs_b:  # two infinities: inf - inf is invalid
            return a if a == b else CANONICAL_NAN
        return a if abs_a == POS_INF else b
    ma, xa = _unpack(a)
    mb, xb = _unpack(b)
    return _add_signed(a >> 31, ma, xa, b >> 31, mb, xb)


def sub(a: int, b: int) -> int:
    _check("b", b)
    return add(a, b ^ SIGN_BIT)


def mul(a: int, b: int) -> int:
    _check("a", a)
    _check("b", b)
    sign = (a ^ b) >> 31
    abs_a, abs_b = a & ABS_MASK, b & ABS_MASK
    if abs_a >= POS_INF or abs_b >= POS_INF:
        if abs_a > POS_INF or abs_b > POS_INF or abs_a == 0 or abs_b == 0:
            return CANONICAL_NAN  # NaN operand, or inf * 0
        return (sign << 31) | POS_INF
    ma, xa = _unpack(a)
    mb, xb = _unpack(b)
    return _round_pack(sign, ma * mb, xa + xb)  # exact product of the significands (<= 48 bits)


def div(a: int, b: int) -> int:
    _check("a", a)
    _check("b", b)
    sign = (a ^ b) >> 31
    ea, eb = _exp_field(a), _exp_field(b)
    if ea == 0xFF or eb == 0xFF:
        if is_nan(a) or is_nan(b) or ea == eb:
            return CANONICAL_NAN  # NaN operand, or inf / inf
        return (sign << 31) | (POS_INF if ea == 0xFF else 0)
    if is_zero(b):
        return CANONICAL_NAN if is_zero(a) else (sign << 31) | POS_INF
    ma, xa = _unpack(a)
    mb, xb = _unpack(b)
    # >= 37 quotient bits for any ma >= 1, mb < 2**24: the sticky bit sits >= 12 bits below the
    # rounding position, so jamming it into the lsb keeps the rounding interval.
    n = ma << DIV_SHIFT
    q = n // mb
    if q * mb != n:
        q |= 1
    return _round_pack(sign, q, xa - xb - DIV_SHIFT)


def _isqrt(n: int) -> int:
    """floor(sqrt(n)) for n >= 1 by Newton's method from an over-estimate (as in Solidity)."""
    x = 1 << ((_msb(n) + 2) >> 1)
    y = (x + n // x) >> 1
    while y < x:
        x = y
        y = (x + n // x) >> 1
    return x


def sqrt(a: int) -> int:
    _check("a", a)
    if is_nan(a):
        return CANONICAL_NAN
    if is_zero(a):
        return a  # sqrt(-0) = -0
    if a >> 31:
        return CANONICAL_NAN
    if a == POS_INF:
        return a
    m, e = _unpack(a)
    if e & 1:
        m <<= 1
        e -= 1
    n = m << SQRT_SHIFT
    r = _isqrt(n)
    if r * r != n:
        r |= 1  # >= 30 root bits: sticky far below the rounding position
    return _round_pack(0, r, (e - SQRT_SHIFT) >> 1)


def fma(a: int, b: int, c: int) -> int:
    """a * b + c with a single rounding."""
    _check("a", a)
    _check("b", b)
    _check("c", c)
    if is_nan(a) or is_nan(b) or is_nan(c):
        return CANONICAL_NAN
    sp = (a ^ b) >> 31
    ea, eb, ec = _exp_field(a), _exp_field(b), _exp_field(c)
    if ea == 0xFF or eb == 0xFF:
        if is_zero(a) or is_zero(b):
            return CANONICAL_NAN  # inf * 0
        if ec == 0xFF and (c >> 31) != sp:
            return CANONICAL_NAN  # inf - inf
        return (sp << 31) | POS_INF
    if ec == 0xFF:
        return c
    return _fma_finite(a, b, c, sp)


def _fma_finite(a: int, b: int, c: int, sp: int) -> int:
    ma, xa = _unpack(a)
    mb, xb = _unpack(b)
    mc, xc = _unpack(c)
    mp = ma * mb  # exact product, <= 48 bits
    xp = xa + xb
    if mp == 0:
        xp = xc  # INVARIANT: a zero product never dominates the alignment
    return _add_signed(sp, mp, xp, c >> 31, mc, xc)


# --------------------------------------------------------------------------- min / max / compare


def _order_key(x: int) -> int:
    """Monotone key for non-NaN x: -inf < ... < -0 < +0 < ... < +inf."""
    return (x ^ U32) if x >> 31 else (x | SIGN_BIT)


def max_(a: int, b: int) -> int:
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b):
        return CANONICAL_NAN
    return a if _order_key(a) >= _order_key(b) else b


def min_(a: int, b: int) -> int:
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b):
        return CANONICAL_NAN
    return a if _order_key(a) <= _order_key(b) else b


def eq(a: int, b: int) -> bool:
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b):
        return False
    return a == b or ((a | b) & ABS_MASK) == 0


def lt(a: int, b: int) -> bool:
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b) or ((a | b) & ABS_MASK) == 0:
        return False
    return _order_key(a) < _order_key(b)


def le(a: int, b: int) -> bool:
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b):
        return False
    if ((a | b) & ABS_MASK) == 0:
        return True
    return _order_key(a) <= _order_key(b)


def neg(a: int) -> int:
    _check("a", a)
    return CANONICAL_NAN if is_nan(a) else a ^ SIGN_BIT


def abs_(a: int) -> int:
    _check("a", a)
    return CANONICAL_NAN if is_nan(a) else a & ABS_MASK


# --------------------------------------------------------------------------- rounding to integers


def rint(a: int) -> int:
    """Round to an integral value, ties to even (roundToIntegralTiesToEven)."""
    _check("a", a)
    return _to_integral(a, nearest_even=True)


def floor(a: int) -> int:
    """Round toward -infinity to an integral value (roundToIntegralTowardNegative)."""
    _check("a", a)
    return _to_integral(a, nearest_even=False)


def _to_integral(a: int, nearest_even: bool) -> int:
    """a rounded to an integral value: to nearest, ties to even, or else toward -infinity."""
    exp = _exp_field(a)
    if exp == 0xFF:
        return CANONICAL_NAN if is_nan(a) else a
    if exp >= 150:
        return a  # |a| >= 2**23: already integral
    sign = a & SIGN_BIT
    if exp < 127:
        # |a| < 1 becomes +-0 or +-1. Nearest: only |a| > 0.5 goes to 1 (0.5 itself ties to the
        # even 0). Floor: +x -> +0, -0 -> -0, -x -> -1.
        one = (exp == 126 and (a & FRAC_MASK) != 0) if nearest_even else (sign != 0 and (a & ABS_MASK) != 0)
        return sign | ONE if one else sign
    frac_bits = 150 - exp  # 1 .. 23 fraction bits below the binary point
    mask = (1 << frac_bits) - 1
    rem = a & mask
    half = 1 << (frac_bits - 1)
    # nearest: above half, or a tie onto an odd integer; floor: grow a negative magnitude
    if nearest_even:
        up = rem > half or (rem == half and (a >> frac_bits) & 1 == 1)
    else:
        up = sign != 0 and rem != 0
    r = a & ~mask & U32
    # adding one unit carries into the exponent field correctly
    return r + (1 << frac_bits) if up else r


# --------------------------------------------------------------------------- conversions


def from_int32(i: int) -> int:
    """int32 -> binary32, nearest-even."""
    if not isinstance(i, int) or not -(2**31) <= i < 2**31:
        raise SoftFloatError("i", i)
    return _round_pack(1 if i < 0 else 0, abs(i), 0)


def from_uint32(u: int) -> int:
    """uint32 -> binary32, nearest-even."""
    _check("u", u)
    return _round_pack(0, u, 0)


def to_int32(a: int) -> int:
    """binary32 -> int32, rounding toward zero; NaN, +-inf and out-of-range give -2**31."""
    _check("a", a)
    if _exp_field(a) == 0xFF:
        return INT32_INDEFINITE
    sign = a >> 31
    m, e = _unpack(a)
    v = m << e if e >= 0 else m >> -e
    if sign:
        return INT32_INDEFINITE if v > 2**31 else -v
    return INT32_INDEFINITE if v > 2**31 - 1 else v


def ldexp(a: int, n: int) -> int:
    """a * 2**n with a single rounding (n any integer)."""
    _check("a", a)
    if _exp_field(a) == 0xFF:
        return CANONICAL_NAN if is_nan(a) else a
    sign = a >> 31
    m, e = _unpack(a)
    n = max(-LDEXP_CLAMP, min(LDEXP_CLAMP, n))
    return _round_pack(sign, m, e + n)


def ldexp_f(a: int, b: int) -> int:
    """The RepOps LDEXP instruction: a * 2**b with b a binary32 that must be integral.

    b = +-inf acts as a huge exponent (finite non-zero a -> +-inf or +-0), except that
    0 * 2**+inf and inf * 2**-inf are NaN; a NaN or non-integral b gives NaN (the semantics of
    ``verde_chain.repops.fp32``).
    """
    _check("a", a)
    _check("b", b)
    if is_nan(a) or is_nan(b):
        return CANONICAL_NAN
    if _exp_field(b) == 0xFF:
        if b >> 31 == 0:
            if is_zero(a):
                return CANONICAL_NAN
            n = LDEXP_CLAMP
        else:
            if is_inf(a):
                return CANONICAL_NAN
            n = -LDEXP_CLAMP
    else:
        mb, xb = _unpack(b)
        if xb >= 0:
            n = LDEXP_CLAMP  # |b| >= 2**23: saturated either way; the sign is applied below
        else:
            if mb & ((1 << -xb) - 1):
                return CANONICAL_NAN  # b is not integral
            n = mb >> -xb
        if b >> 31:
            n = -n
    return ldexp(a, n)


def getexp(a: int) -> int:
    """floor(log2|a|) as binary32 (exact). +-0 -> -inf, +-inf -> +inf, NaN -> NaN."""
    _check("a", a)
    special, k, _frac = _logb(a, POS_INF, NEG_INF)
    if special:
        return special
    return from_int32(k)  # -149 <= k <= 127


def getmant(a: int) -> int:
    """|a| / 2**getexp(a), in [1, 2) (exact). +-0 and +-inf -> 1.0, NaN -> NaN."""
    _check("a", a)
    special, _k, frac = _logb(a, ONE, ONE)
    if special:
        return special
    return ONE | frac  # the fraction under the exponent of 1.0


def _logb(a: int, if_inf: int, if_zero: int) -> tuple[int, int, int]:
    """(0, k, frac) with |a| = (2**23 + frac) * 2**(k - 23) for a finite non-zero a.

    Otherwise ``(special, 0, 0)``, special being the result getexp / getmant give (never +0):
    NaN for a NaN, ``if_inf`` for +-inf, ``if_zero`` for +-0.
    """
    if is_nan(a):
        return CANONICAL_NAN, 0, 0
    if _exp_field(a) == 0xFF:
        return if_inf, 0, 0
    m, e = _unpack(a)
    if m == 0:
        return if_zero, 0, 0
    top = _msb(m)
    # shift the leading one to bit 23 (a subnormal's lies lower)
    return 0, e + top, (m << (23 - top)) & FRAC_MASK


def mov(a: int) -> int:
    """Copy, with a NaN operand replaced by the canonical NaN."""
    _check("a", a)
    return CANONICAL_NAN if is_nan(a) else a


def select(a: int, b: int, c: int) -> int:
    """b if a != 0.0 as a float (NaN counts as true, -0 as zero) else c; NaN canonical."""
    _check("a", a)
    return mov(b) if (a & ABS_MASK) != 0 else mov(c)


# --------------------------------------------------------------------------- ISA dispatch


def _bool(x: bool) -> int:
    return ONE if x else 0


# RepOps opcode number (verde_chain.repops.isa.Op) -> twin function on (a, b, c) bit patterns.
_ISA: dict[int, Callable[[int, int, int], int]] = {
    0: lambda a, b, c: add(a, b),
    1: lambda a, b, c: sub(a, b),
    2: lambda a, b, c: mul(a, b),
    3: lambda a, b, c: div(a, b),
    4: fma,
    5: lambda a, b, c: sqrt(a),
    6: lambda a, b, c: max_(a, b),
    7: lambda a, b, c: min_(a, b),
    8: lambda a, b, c: _bool(lt(a, b)),
    9: lambda a, b, c: _bool(eq(a, b)),
    10: select,
    11: lambda a, b, c: rint(a),
    12: lambda a, b, c: ldexp_f(a, b),
    13: lambda a, b, c: getexp(a),
    14: lambda a, b, c: getmant(a),
    15: lambda a, b, c: neg(a),
    16: lambda a, b, c: abs_(a),
    21: lambda a, b, c: mov(a),
    22: lambda a, b, c: floor(a),
}
ISA_ARITHMETIC_OPS = frozenset(_ISA)


class NotArithmetic(VerdeError):
    """``execute`` was given an opcode that does not compute on registers (CONST, LOAD, ...)."""

    def __init__(self, op: int) -> None:
        self.op = op
        super().__init__(f"opcode {op} is not a register-to-register arithmetic instruction")


def execute(op: int, a: int, b: int = 0, c: int = 0) -> int:
    """One RepOps arithmetic instruction on bit patterns (LT/EQ give 1.0 or +0.0)."""
    fn = _ISA.get(int(op))
    if fn is None:
        raise NotArithmetic(int(op))
    return fn(a, b, c)

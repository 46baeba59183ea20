// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title SoftFloat32: IEEE-754 binary32 arithmetic for the one-step prover.
/// @notice Python twin: verde_chain/vm/softfloat.py (same algorithm, step by step).
///
///      31 30          23 22                                0
///     +--+--------------+-----------------------------------+
///     |s | exponent (8) |          fraction (23)            |
///     +--+--------------+-----------------------------------+
///     exponent 0      : zero / subnormal, value = (-1)^s * fraction * 2^-149
///     exponent 1..254 : normal,  value = (-1)^s * (2^23 + fraction) * 2^(exponent - 150)
///     exponent 255    : fraction 0 = infinity, otherwise NaN
///
/// Rules: round to nearest, ties to even; subnormals are honoured (never flushed); signed zeros
/// follow IEEE-754; every NaN RESULT is the canonical quiet NaN 0x7FC00000 (the RepOps rule), so
/// a result is a pure function of the operand bits. No exception flags are kept.
///
/// Arithmetic shares one shape: unpack each operand's magnitude into (m, e) with |x| = m * 2^e
/// (`_unpack`; the sign is bit 31), form the exact result in a uint256 (or an exact one with a
/// sticky low bit standing for a non-zero remainder far below the rounding position), and round
/// once in `_roundPack`. add, sub and fma share the alignment and signed addition (`_addSigned`),
/// rint and floor one body (`_toIntegral`), getexp and getmant one decomposition (`_logb`).
/// Conversions to int32 round toward zero; NaN, infinities and out-of-range values give
/// type(int32).min (the x86 "integer indefinite"). Every uint32 is a valid operand, so nothing
/// here reverts: every instruction the dispute game can reach has a defined result.
/// Semantics, algorithm notes and gas figures: docs/softfloat.md.
type F32 is uint32;

using SoftFloat32 for F32 global;

library SoftFloat32 {
    uint256 internal constant CANONICAL_NAN = 0x7FC00000;
    uint256 internal constant POS_INF = 0x7F800000;
    uint256 internal constant NEG_INF = 0xFF800000;
    uint256 internal constant SIGN_BIT = 0x80000000;
    uint256 internal constant ABS_MASK = 0x7FFFFFFF;
    uint256 internal constant FRAC_MASK = 0x007FFFFF;
    uint256 internal constant HIDDEN_BIT = 0x00800000;
    uint256 internal constant ONE = 0x3F800000;
    /// @dev Alignment in `_addSigned` (add, sub, fma): exact up to an lsb-exponent gap of
    ///      ALIGN_LIMIT (a 48-bit product << 200 fits 256 bits). Beyond it, the operand with the
    ///      larger exponent is non-zero and so dominant that the other lies below a quarter ulp of
    ///      any possible result: it becomes a sticky 1 under JAM_SHIFT guard bits, which keeps the
    ///      exact value in the same rounding interval.
    uint256 internal constant ALIGN_LIMIT = 200;
    uint256 internal constant JAM_SHIFT = 32;
    /// @dev Extra quotient / root bits computed by div and sqrt before rounding.
    uint256 internal constant DIV_SHIFT = 60;
    uint256 internal constant SQRT_SHIFT = 60;
    /// @dev ldexp exponents beyond +-400 saturate without changing any result.
    int256 internal constant LDEXP_CLAMP = 400;

    // ------------------------------------------------------------------ classification

    function isNaN(F32 x) internal pure returns (bool) {
        return (F32.unwrap(x) & ABS_MASK) > POS_INF;
    }

    function isInf(F32 x) internal pure returns (bool) {
        return (F32.unwrap(x) & ABS_MASK) == POS_INF;
    }

    function bits(F32 x) internal pure returns (uint32) {
        return F32.unwrap(x);
    }

    function _w(uint256 b) private pure returns (F32) {
        // SAFETY: every caller produces b < 2^32.
        return F32.wrap(uint32(b));
    }

    /// @dev (m, e) with |x| = m * 2^e; x must be finite (its sign is x >> 31).
    function _unpack(uint256 x) private pure returns (uint256 m, int256 e) {
        assembly {
            let biased := and(shr(23, x), 0xFF)
            // branch-free: a normal number gets the hidden bit and exponent biased - 150; a
            // subnormal or zero (biased 0) no hidden bit and exponent 1 - 150 = -149
            m := or(and(x, 0x7FFFFF), shl(23, gt(biased, 0)))
            e := sub(or(biased, iszero(biased)), 150)
        }
    }

    /// @dev Index of the most significant set bit of m > 0 (binary search; no CLZ before Osaka).
    function _msb(uint256 m) private pure returns (uint256 top) {
        assembly {
            top := shl(7, gt(m, 0xffffffffffffffffffffffffffffffff))
            top := or(top, shl(6, gt(shr(top, m), 0xffffffffffffffff)))
            top := or(top, shl(5, gt(shr(top, m), 0xffffffff)))
            top := or(top, shl(4, gt(shr(top, m), 0xffff)))
            top := or(top, shl(3, gt(shr(top, m), 0xff)))
            top := or(top, shl(2, gt(shr(top, m), 0xf)))
            top := or(top, shl(1, gt(shr(top, m), 0x3)))
            top := or(top, gt(shr(top, m), 0x1))
        }
    }

    /// @dev Round (-1)^sign * m * 2^e to binary32, nearest-even. INVARIANT: m < 2^250 (so a
    ///      shift clamped to 255 still rounds to zero), which every caller guarantees.
    function _roundPack(uint256 sign, uint256 m, int256 e) private pure returns (uint256 r) {
        if (m == 0) return sign << 31;
        uint256 top = _msb(m);
        assembly {
            // lsb exponent of the result: 24 significant bits, never below the subnormal grid
            let q := sub(add(e, top), 23)
            if slt(q, sub(0, 149)) { q := sub(0, 149) }
            let s := sub(q, e)
            switch sgt(s, 0)
            case 0 { r := shl(sub(0, s), m) } // exact, fits 24 bits
            default {
                if gt(s, 255) { s := 255 }
                r := shr(s, m)
                let rem := and(m, sub(shl(s, 1), 1))
                let half := shl(sub(s, 1), 1)
                // ties to even; a carry out of 24 bits bumps the exponent field, as it should
                r := add(r, or(gt(rem, half), and(eq(rem, half), and(r, 1))))
            }
            // (q + 149) is the biased exponent minus one for normals and 0 for subnormals;
            // the hidden bit of r supplies the missing one.
            r := add(shl(23, add(q, 149)), r)
            if iszero(lt(r, 0x7F800000)) { r := 0x7F800000 }
            r := or(shl(31, sign), r)
        }
    }

    // ------------------------------------------------------------------ arithmetic

    function add(F32 fa, F32 fb) internal pure returns (F32) {
        return _w(_add(F32.unwrap(fa), F32.unwrap(fb)));
    }

    function sub(F32 fa, F32 fb) internal pure returns (F32) {
        return _w(_add(F32.unwrap(fa), F32.unwrap(fb) ^ SIGN_BIT));
    }

    function _add(uint256 a, uint256 b) private pure returns (uint256) {
        uint256 absA = a & ABS_MASK;
        uint256 absB = b & ABS_MASK;
        if (absA >= POS_INF || absB >= POS_INF) {
            if (absA > POS_INF || absB > POS_INF) return CANONICAL_NAN;
            if (absA == absB) return a == b ? a : CANONICAL_NAN; // two infinities: inf - inf
            return absA == POS_INF ? a : b;
        }
        (uint256 ma, int256 xa) = _unpack(a);
        (uint256 mb, int256 xb) = _unpack(b);
        return _addSigned(a >> 31, ma, xa, b >> 31, mb, xb);
    }

    /// @dev Round (-1)^s1 * m1 * 2^x1 + (-1)^s2 * m2 * 2^x2 once; m1, m2 < 2^49 (add, sub, fma).
    ///      An exact zero of unlike signs is +0.
    function _addSigned(uint256 s1, uint256 m1, int256 x1, uint256 s2, uint256 m2, int256 x2)
        private
        pure
        returns (uint256)
    {
        uint256 sign;
        uint256 m;
        int256 e;
        assembly {
            // larger lsb exponent first (addition commutes, and so does the +0 rule below)
            if slt(x1, x2) {
                let t := s1
                s1 := s2
                s2 := t
                t := m1
                m1 := m2
                m2 := t
                t := x1
                x1 := x2
                x2 := t
            }
            // align: exact up to ALIGN_LIMIT; beyond, m2 only counts as a sticky 1 (see ALIGN_LIMIT)
            let d := sub(x1, x2)
            e := x2
            switch gt(d, ALIGN_LIMIT)
            case 0 { m1 := shl(d, m1) }
            default {
                m1 := shl(JAM_SHIFT, m1)
                m2 := iszero(iszero(m2))
                e := sub(x1, JAM_SHIFT)
            }
            // add magnitudes
            switch eq(s1, s2)
            case 1 {
                m := add(m1, m2)
                sign := s1
            }
            default {
                switch gt(m1, m2)
                case 1 {
                    m := sub(m1, m2)
                    sign := s1
                }
                default {
                    m := sub(m2, m1)
                    sign := mul(s2, iszero(iszero(m)))
                }
            }
        }
        return _roundPack(sign, m, e);
    }

    function mul(F32 fa, F32 fb) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            uint256 b = F32.unwrap(fb);
            uint256 sign = (a ^ b) >> 31;
            uint256 absA = a & ABS_MASK;
            uint256 absB = b & ABS_MASK;
            if (absA >= POS_INF || absB >= POS_INF) {
                // NaN operand, or inf * 0
                if (absA > POS_INF || absB > POS_INF || absA == 0 || absB == 0) return _w(CANONICAL_NAN);
                return _w((sign << 31) | POS_INF);
            }
            (uint256 ma, int256 xa) = _unpack(a);
            (uint256 mb, int256 xb) = _unpack(b);
            // exact product of the significands (<= 48 bits)
            return _w(_roundPack(sign, ma * mb, xa + xb));
        }
    }

    function div(F32 fa, F32 fb) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            uint256 b = F32.unwrap(fb);
            uint256 sign = (a ^ b) >> 31;
            uint256 ea = (a >> 23) & 0xFF;
            uint256 eb = (b >> 23) & 0xFF;
            if (ea == 0xFF || eb == 0xFF) {
                // NaN operand, or inf / inf
                if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF || ea == eb) return _w(CANONICAL_NAN);
                return _w((sign << 31) | (ea == 0xFF ? POS_INF : 0));
            }
            if ((b & ABS_MASK) == 0) return _w((a & ABS_MASK) == 0 ? CANONICAL_NAN : (sign << 31) | POS_INF);
            (uint256 ma, int256 xa) = _unpack(a);
            (uint256 mb, int256 xb) = _unpack(b);
            // >= 37 quotient bits for any ma >= 1, mb < 2^24: the sticky bit sits >= 12 bits below
            // the rounding position, so jamming it into the lsb keeps the rounding interval.
            uint256 n = ma << DIV_SHIFT;
            uint256 q = n / mb;
            if (q * mb != n) q |= 1;
            return _w(_roundPack(sign, q, xa - xb - int256(DIV_SHIFT)));
        }
    }

    /// @dev floor(sqrt(n)) for n >= 1: Newton's method from the over-estimate 2^ceil(bits/2).
    function _isqrt(uint256 n) private pure returns (uint256 x) {
        unchecked {
            x = 1 << ((_msb(n) + 2) >> 1);
            uint256 y = (x + n / x) >> 1;
            while (y < x) {
                x = y;
                y = (x + n / x) >> 1;
            }
        }
    }

    function sqrt(F32 fa) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            if ((a & ABS_MASK) > POS_INF) return _w(CANONICAL_NAN);
            if ((a & ABS_MASK) == 0) return fa; // sqrt(-0) = -0
            if (a >> 31 != 0) return _w(CANONICAL_NAN);
            if (a == POS_INF) return fa;
            (uint256 m, int256 e) = _unpack(a);
            if (e & 1 != 0) {
                m <<= 1;
                e -= 1;
            }
            uint256 n = m << SQRT_SHIFT;
            uint256 r = _isqrt(n);
            if (r * r != n) r |= 1; // >= 30 root bits: the sticky bit is far below rounding
            return _w(_roundPack(0, r, (e - int256(SQRT_SHIFT)) >> 1));
        }
    }

    /// @notice a * b + c with a single rounding.
    function fma(F32 fa, F32 fb, F32 fc) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            uint256 b = F32.unwrap(fb);
            uint256 c = F32.unwrap(fc);
            if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF || (c & ABS_MASK) > POS_INF) {
                return _w(CANONICAL_NAN);
            }
            uint256 sp = (a ^ b) >> 31;
            uint256 ec = (c >> 23) & 0xFF;
            if (((a >> 23) & 0xFF) == 0xFF || ((b >> 23) & 0xFF) == 0xFF) {
                if ((a & ABS_MASK) == 0 || (b & ABS_MASK) == 0) return _w(CANONICAL_NAN); // inf * 0
                if (ec == 0xFF && (c >> 31) != sp) return _w(CANONICAL_NAN); // inf - inf
                return _w((sp << 31) | POS_INF);
            }
            if (ec == 0xFF) return fc;
            return _w(_fmaFinite(a, b, c, sp));
        }
    }

    function _fmaFinite(uint256 a, uint256 b, uint256 c, uint256 sp) private pure returns (uint256) {
        unchecked {
            (uint256 ma, int256 xa) = _unpack(a);
            (uint256 mb, int256 xb) = _unpack(b);
            (uint256 mc, int256 xc) = _unpack(c);
            uint256 mp = ma * mb; // exact product, <= 48 bits
            int256 xp = xa + xb;
            if (mp == 0) xp = xc; // INVARIANT: a zero product never dominates the alignment
            return _addSigned(sp, mp, xp, c >> 31, mc, xc);
        }
    }

    // ------------------------------------------------------------------ min / max / compare

    /// @dev Monotone key for non-NaN x: -inf < ... < -0 < +0 < ... < +inf.
    function _key(uint256 x) private pure returns (uint256) {
        return x >> 31 != 0 ? x ^ 0xFFFFFFFF : x | SIGN_BIT;
    }

    /// @notice NaN if either operand is NaN; max(-0, +0) = +0.
    function max(F32 fa, F32 fb) internal pure returns (F32) {
        uint256 a = F32.unwrap(fa);
        uint256 b = F32.unwrap(fb);
        if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF) return _w(CANONICAL_NAN);
        return _key(a) >= _key(b) ? fa : fb;
    }

    /// @notice NaN if either operand is NaN; min(-0, +0) = -0.
    function min(F32 fa, F32 fb) internal pure returns (F32) {
        uint256 a = F32.unwrap(fa);
        uint256 b = F32.unwrap(fb);
        if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF) return _w(CANONICAL_NAN);
        return _key(a) <= _key(b) ? fa : fb;
    }

    /// @notice Quiet IEEE equality: false on NaN, -0 == +0.
    function eq(F32 fa, F32 fb) internal pure returns (bool) {
        uint256 a = F32.unwrap(fa);
        uint256 b = F32.unwrap(fb);
        if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF) return false;
        return a == b || ((a | b) & ABS_MASK) == 0;
    }

    /// @notice Quiet IEEE less-than: false on NaN, -0 < +0 is false.
    function lt(F32 fa, F32 fb) internal pure returns (bool) {
        uint256 a = F32.unwrap(fa);
        uint256 b = F32.unwrap(fb);
        if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF || ((a | b) & ABS_MASK) == 0) return false;
        return _key(a) < _key(b);
    }

    /// @notice Quiet IEEE less-or-equal: false on NaN, -0 <= +0 is true.
    function le(F32 fa, F32 fb) internal pure returns (bool) {
        uint256 a = F32.unwrap(fa);
        uint256 b = F32.unwrap(fb);
        if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF) return false;
        if (((a | b) & ABS_MASK) == 0) return true;
        return _key(a) <= _key(b);
    }

    function neg(F32 fa) internal pure returns (F32) {
        uint256 a = F32.unwrap(fa);
        return _w((a & ABS_MASK) > POS_INF ? CANONICAL_NAN : a ^ SIGN_BIT);
    }

    function abs(F32 fa) internal pure returns (F32) {
        uint256 a = F32.unwrap(fa);
        return _w((a & ABS_MASK) > POS_INF ? CANONICAL_NAN : a & ABS_MASK);
    }

    // ------------------------------------------------------------------ rounding to integers

    /// @notice Round to an integral value, ties to even (roundToIntegralTiesToEven).
    function rint(F32 fa) internal pure returns (F32) {
        return _w(_toIntegral(F32.unwrap(fa), true));
    }

    /// @notice Round toward -infinity to an integral value (roundToIntegralTowardNegative).
    function floor(F32 fa) internal pure returns (F32) {
        return _w(_toIntegral(F32.unwrap(fa), false));
    }

    /// @dev a rounded to an integral value: to nearest, ties to even, or else toward -infinity.
    function _toIntegral(uint256 a, bool nearestEven) private pure returns (uint256) {
        unchecked {
            uint256 exp = (a >> 23) & 0xFF;
            if (exp == 0xFF) return (a & ABS_MASK) > POS_INF ? CANONICAL_NAN : a;
            if (exp >= 150) return a; // |a| >= 2^23: already integral
            uint256 sign = a & SIGN_BIT;
            if (exp < 127) {
                // |a| < 1 becomes +-0 or +-1. Nearest: only |a| > 0.5 goes to 1 (0.5 itself ties
                // to the even 0). Floor: +x -> +0, -0 -> -0, -x -> -1.
                bool one = nearestEven ? exp == 126 && (a & FRAC_MASK) != 0 : sign != 0 && (a & ABS_MASK) != 0;
                return one ? sign | ONE : sign;
            }
            uint256 fracBits = 150 - exp; // 1 .. 23 fraction bits below the binary point
            uint256 mask = (1 << fracBits) - 1;
            uint256 rem = a & mask;
            uint256 half = 1 << (fracBits - 1);
            // nearest: above half, or a tie onto an odd integer; floor: grow a negative magnitude
            bool up = nearestEven ? rem > half || (rem == half && (a >> fracBits) & 1 != 0) : sign != 0 && rem != 0;
            // adding one unit carries into the exponent field correctly
            return up ? (a & ~mask) + (1 << fracBits) : a & ~mask;
        }
    }

    // ------------------------------------------------------------------ conversions

    function fromInt32(int32 i) internal pure returns (F32) {
        unchecked {
            if (i < 0) return _w(_roundPack(1, uint256(-int256(i)), 0));
            return _w(_roundPack(0, uint256(int256(i)), 0));
        }
    }

    function fromUint32(uint32 u) internal pure returns (F32) {
        return _w(_roundPack(0, u, 0));
    }

    /// @notice Toward zero; NaN, +-inf and out-of-range values give type(int32).min.
    function toInt32(F32 fa) internal pure returns (int32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            if ((a >> 23) & 0xFF == 0xFF) return type(int32).min;
            uint256 sign = a >> 31;
            (uint256 m, int256 e) = _unpack(a);
            uint256 v = e >= 0 ? m << uint256(e) : m >> uint256(-e);
            if (sign != 0) return v > 2 ** 31 ? type(int32).min : int32(-int256(v));
            return v > 2 ** 31 - 1 ? type(int32).min : int32(int256(v));
        }
    }

    /// @notice a * 2^n with a single rounding, for any n.
    function ldexp(F32 fa, int256 n) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            if ((a >> 23) & 0xFF == 0xFF) return (a & ABS_MASK) > POS_INF ? _w(CANONICAL_NAN) : fa;
            uint256 sign = a >> 31;
            (uint256 m, int256 e) = _unpack(a);
            if (n > LDEXP_CLAMP) n = LDEXP_CLAMP;
            if (n < -LDEXP_CLAMP) n = -LDEXP_CLAMP;
            return _w(_roundPack(sign, m, e + n));
        }
    }

    /// @notice The RepOps LDEXP instruction: a * 2^b with b a binary32 that must be integral.
    ///         b = +-inf acts as a huge exponent, except 0 * 2^+inf and inf * 2^-inf are NaN; a NaN
    ///         or non-integral b gives NaN (the semantics of verde_chain/repops/fp32.py).
    function ldexpF(F32 fa, F32 fb) internal pure returns (F32) {
        unchecked {
            uint256 a = F32.unwrap(fa);
            uint256 b = F32.unwrap(fb);
            if ((a & ABS_MASK) > POS_INF || (b & ABS_MASK) > POS_INF) return _w(CANONICAL_NAN);
            int256 n;
            if ((b >> 23) & 0xFF == 0xFF) {
                if (b >> 31 == 0) {
                    if ((a & ABS_MASK) == 0) return _w(CANONICAL_NAN); // 0 * 2^+inf
                    n = LDEXP_CLAMP;
                } else {
                    if ((a & ABS_MASK) == POS_INF) return _w(CANONICAL_NAN); // inf * 2^-inf
                    n = -LDEXP_CLAMP;
                }
            } else {
                (uint256 mb, int256 xb) = _unpack(b);
                if (xb >= 0) {
                    n = LDEXP_CLAMP; // |b| >= 2^23: saturated either way; the sign comes below
                } else {
                    if (mb & ((1 << uint256(-xb)) - 1) != 0) return _w(CANONICAL_NAN); // not integral
                    n = int256(mb >> uint256(-xb));
                }
                if (b >> 31 != 0) n = -n;
            }
            return ldexp(fa, n);
        }
    }

    /// @notice floor(log2|a|) as binary32 (exact). +-0 -> -inf, +-inf -> +inf, NaN -> NaN.
    function getexp(F32 fa) internal pure returns (F32) {
        (uint256 special, int256 k,) = _logb(F32.unwrap(fa), POS_INF, NEG_INF);
        if (special != 0) return _w(special);
        // SAFETY: -149 <= k <= 127
        return fromInt32(int32(k));
    }

    /// @notice |a| / 2^getexp(a), in [1, 2) (exact). +-0 and +-inf -> 1.0, NaN -> NaN, so
    ///         getmant(a) * 2^getexp(a) reproduces |a| for zeros and infinities too.
    function getmant(F32 fa) internal pure returns (F32) {
        (uint256 special,, uint256 frac) = _logb(F32.unwrap(fa), ONE, ONE);
        if (special != 0) return _w(special);
        return _w(ONE | frac); // the fraction under the exponent of 1.0
    }

    /// @dev |a| = (2^23 + frac) * 2^(k - 23) for a finite non-zero a, with special = 0. Otherwise
    ///      special is the result getexp / getmant give (never +0): NaN for a NaN, `ifInf` for
    ///      +-inf, `ifZero` for +-0.
    function _logb(uint256 a, uint256 ifInf, uint256 ifZero)
        private
        pure
        returns (uint256 special, int256 k, uint256 frac)
    {
        unchecked {
            if ((a & ABS_MASK) > POS_INF) return (CANONICAL_NAN, 0, 0);
            if ((a >> 23) & 0xFF == 0xFF) return (ifInf, 0, 0);
            (uint256 m, int256 e) = _unpack(a);
            if (m == 0) return (ifZero, 0, 0);
            uint256 top = _msb(m);
            // shift the leading one to bit 23 (a subnormal's lies lower)
            return (0, e + int256(top), (m << (23 - top)) & FRAC_MASK);
        }
    }

    /// @notice Copy, with a NaN operand replaced by the canonical NaN (RepOps MOV).
    function mov(F32 fa) internal pure returns (F32) {
        return (F32.unwrap(fa) & ABS_MASK) > POS_INF ? _w(CANONICAL_NAN) : fa;
    }

    /// @notice b if a != 0.0 as a float (NaN counts as true, -0 as zero) else c (RepOps SELECT).
    function select(F32 fa, F32 fb, F32 fc) internal pure returns (F32) {
        return (F32.unwrap(fa) & ABS_MASK) != 0 ? mov(fb) : mov(fc);
    }
}

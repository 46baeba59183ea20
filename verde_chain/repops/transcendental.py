"""Transcendental functions as straight-line RepOps programs.

Every function here is a fixed list of :class:`~verde_chain.repops.isa.Instr` built only from
correctly rounded binary32 instructions (FMA, ADD, MUL, DIV, RINT, LDEXP, GETEXP, GETMANT, MIN,
MAX, SELECT, ...). There is no libm anywhere: CPU kernels, GPU kernels and the on-chain ScalarVM
execute the same instructions and therefore agree bit for bit. Algorithms, coefficients and
measured accuracy are documented in ``docs/repops-transcendentals.md``.

Register conventions: the input ``x`` is in r0 (the upstream gradient in r1 for the ``*_grad``
programs), the result ends in r0, and programs use r0..r15 only. Programs never LOAD.

The programs are written with the builder of ``ssa.py`` (virtual registers, linear-scan register
allocation), so each algorithm reads like the maths it implements.

Why one module over ~500 lines: the programs are composed from the same private building blocks
(``_exp_parts``, ``_recip_1p``, ``_horner_pair``, ``_log_parts``, ``_trig_parts``) whose error
budgets the accuracy notes in ``docs/repops-transcendentals.md`` reason about together; split,
those blocks would become a public API with no other user.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from verde_chain.errors import RepOpsError
from verde_chain.repops import fp32
from verde_chain.repops.isa import NUM_REGS, Instr, Op
from verde_chain.repops.ssa import ProgramBuilder, V

U32 = npt.NDArray[np.uint32]


class UnknownFunction(RepOpsError):
    """``evaluate`` was asked for a program that does not exist (names the available ones)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no transcendental program named {name!r}; have {sorted(PROGRAMS)}")


# ----------------------------------------------------------------------------- constants
# Every constant is an exact binary32 value (checked when the program is built). Polynomial
# coefficients are near-minimax fits (Lawson iteration on a Chebyshev grid in binary64, then
# rounded to binary32 one coefficient at a time with the rest refitted); the quoted errors are
# the fits' own errors, the measured end-to-end errors are in docs/repops-transcendentals.md.

INF_BITS = 0x7F800000
NAN_BITS = 0x7FC00000

LOG2E = 1.44269502162933349609375  # binary32 nearest to 1/ln 2 (only used to pick n)
# ln 2 = LN2_HI + LN2_LO: LN2_HI has 15 significant bits so n*LN2_HI is exact for |n| < 512.
LN2_HI = 0.693145751953125
LN2_LO = 1.428606765330187045037746429443359375e-06
EXP_CLAMP = 150.0  # exp(+-150) is already inf/0 in binary32; keeps n finite and small
# exp(r) ~ 1 + r + sum c_k r^k, |r| <= 0.3472 (rel. error 2^-28.2)
EXP_POLY = [0.4999999403953552, 0.1666651964187622, 0.04166824370622635,
            0.008368836715817451, 0.0013822969049215317]  # c2..c6

SQRT2 = 1.41421353816986083984375  # binary32 nearest to sqrt(2)
# log1p(f) ~ f - f^2/2 + f^3 * sum c_k f^(k-3), f in [sqrt(1/2)-1, sqrt(2)-1] (rel. error 2^-30.3)
LOG_POLY = [0.3333331346511841, -0.25000011920928955, 0.20002073049545288, -0.1666785478591919,
            0.14220233261585236, -0.12408196926116943, 0.11886204034090042,
            -0.11660660803318024, 0.06733010709285736]  # c3..c11

# sin / cos: x = k pi/2 + r with k = rint(x 2/pi) and r kept as a pair (rh, rl):
# pi/2 = PIO2_1 + PIO2_2 + PIO2_3 (+ 1.06e-23), each the binary32 nearest to what is left.
# x - k PIO2_1 is exact in one FMA (both are multiples of 2^-23 or finer, and |x - k PIO2_1| < 2),
# k PIO2_2 is split exactly by FMA, k PIO2_3 is a correction: the pair's absolute error is about
# |k| 2^-73, so the result keeps ~1 ulp for |x| <= TRIG_DOMAIN (beyond it the programs stay
# deterministic but lose accuracy; docs/repops-transcendentals.md).
TWO_OVER_PI = 0.6366197466850281
PIO2_1 = 1.5707963705062866
PIO2_2 = -4.371138828673793e-08
PIO2_3 = -1.7151245100058819e-15
TRIG_DOMAIN = 2.0**17
# |r| <= pi/4: sin r = r + r^3 S(r^2), cos r = 1 - r^2/2 + r^4 C(r^2); Taylor coefficients
# rounded to binary32 (truncation below 2^-37 relative on |r| <= pi/4)
SIN_POLY = [-0.1666666716337204, 0.008333333767950535, -0.00019841270113829523,
            2.7557318844628753e-06, -2.5052107943679403e-08]
COS_POLY = [0.0416666679084301, -0.0013888889225199819, 2.4801587642286904e-05,
            -2.755731998149713e-07, 2.0876755879584152e-09]

# tanh(x) ~ x + x^3 * sum c_k x^(2k-2), |x| <= 0.625 (rel. error 2^-32.4)
TANH_SMALL = 0.625
TANH_POLY = [-0.3333333134651184, 0.13333222270011902, -0.053948450833559036,
             0.02170863002538681, -0.008194678463041782, 0.0021571842953562737]  # c1..c6

# erf(x) ~ x + x * Q(x^2), |x| <= 1, Q(0) = 2/sqrt(pi) - 1 (rel. error 2^-30.1)
ERF_SMALL_POLY = [0.12837916612625122, -0.37612634897232056, 0.11283744126558304,
                  -0.026863619685173035, 0.005216643214225769, -0.0008427079301327467,
                  0.00010888573888223618, -8.66678328748094e-06]
# log(erfc(a)) ~ ERFC_LOG_K + R(a - 1), 1 <= a <= 4 (error weighted by erfc(a): 2^-35 absolute
# on erfc). K is a binary32 constant so that R's constant term is tiny.
ERFC_LOG_K = -1.8496055603027344
ERFC_LOG_POLY = [5.023676763471485e-08, -2.638967514038086, -0.8431071043014526,
                 -0.04156333580613136, 0.010046095587313175, -0.002011561533436179,
                 0.00028931559063494205, -2.1645366359734908e-05]
ERF_CLAMP = 4.0  # erfc(4) < 2^-26: erf rounds to +-1 from here on

# gelu_tanh(x) = x * sigmoid(u), u = x (C1 + C2 x^2), C1 = 2 sqrt(2/pi), C2 = 0.044715 C1,
# each as a binary32 pair hi + lo (exact values to ~2^-48).
GT_C1 = (1.5957691669464111, -4.534068054340423e-08)
GT_C2 = (0.07135481387376785, 2.3988324659995897e-09)
GT_CLAMP = 20.0  # gelu_tanh(x) = x for x >= 20 and -0 for x <= -20 in binary32

# Phi(-w) = exp(-w^2/2 + M(w)), M(w) = log Phi(-w) + w^2/2 ~ GE_M_K + P(w - 2) on 0 <= w <= 4
# (abs. error 2^-29.4, i.e. relative error of Phi(-w)).
GE_SPLIT = 4.0
GE_M_K = -1.783184289932251
GE_M_POLY = [-4.356479621492326e-08, -0.37321552634239197, 0.05713954567909241,
             -0.00989267323166132, 0.0016425978392362595, -0.000242446010815911,
             2.857846448023338e-05, -1.7964387097890722e-06, -2.8635486160055734e-07,
             1.5040255618714582e-07, -3.547880567111861e-08, 3.1719382675987617e-09,
             2.117135911028356e-10]
# w Phi(-w) = exp(-w^2/2 + L(u)), u = 1/w, L ~ GE_L_K + P(u - 1/4) on 4 <= w <= 16 (2^-32.8)
GE_L_K = -0.9738070964813232
GE_L_POLY = [-2.9031555826009026e-08, -0.39028578996658325, -0.46474796533584595,
             0.8182916641235352, -0.6034778356552124, -0.8621085286140442,
             0.08037940412759781, -16.640287399291992, -25.51702308654785]
# gelu_erf(x) = x/2 + x^2 K(x^2) on |x| <= 1/2, K(s) = erf(x/sqrt2)/(2x) (error relative to
# |gelu(-|x|)|, where the two terms partly cancel: 2^-29.4)
GE_SMALL = 0.5
GE_SMALL_POLY = [0.3989422917366028, -0.06649098545312881, 0.009984263218939304,
                 -0.0012708584545180202, 0.00041326283826492727, -0.0004061131621710956]
# d/dx gelu_erf = 1/2 + x J(x^2) on |x| <= 1/2 (error relative to the derivative: 2^-28.5)
GEG_SMALL_POLY = [0.7978845834732056, -0.2659623920917511, 0.059851258993148804,
                  -0.009538015350699425, 0.0011757358442991972]
GE_CLAMP = 16.0  # w Phi(-w) < 2^-150 beyond: gelu(x) = x (x > 0) or -0 (x < 0)
LOG_INV_SQRT_2PI = (-0.9189385175704956, -1.563417661998301e-08)  # log(1/sqrt(2 pi)), pair


# ----------------------------------------------------------------------------- shared pieces

def _neg(b: ProgramBuilder, a: V) -> V:
    return b.unary(Op.NEG, a)


def _keep_zero(b: ProgramBuilder, x: V, res: V) -> V:
    """f(+-0) = +-0 for functions with f(x) ~ c x near 0 (compensated sums lose the sign of 0)."""
    return b.select(b.emit(Op.EQ, x, b.k(0.0)), x, res)


def _exp_parts(b: ProgramBuilder, y: V, y_lo: V | None = None) -> tuple[V, V, V]:
    """(h, l, n) with exp(y + y_lo) = (h + l) * 2**n to about 2^-30 relative error.

    n = rint(y/ln2); r = y - n ln2 is kept as an exact pair (rh, rl) (Cody-Waite with an exact
    first step, then TwoSum); exp(rh + rl) = (1 + rh) + (rh^2 q(rh) + rl) with h = fl(1 + rh) and
    its error kept exactly (Fast2Sum). The pair is not normalised (|l| < 0.08).
    """
    y = b.min(b.max(y, b.k(-EXP_CLAMP)), b.k(EXP_CLAMP))  # NaN propagates through MIN/MAX
    n = b.unary(Op.RINT, b.mul(y, b.k(LOG2E)))
    nn = _neg(b, n)
    r1 = b.fma(nn, b.k(LN2_HI), y)  # exact: |n| <= 217 and LN2_HI has 15 bits (Sterbenz)
    r2 = b.mul(nn, b.k(LN2_LO)) if y_lo is None else b.fma(nn, b.k(LN2_LO), y_lo)
    rh, rl = b.two_sum(r1, r2)
    q = b.horner(rh, EXP_POLY)
    lo = b.fma(b.mul(rh, rh), q, rl)  # rh^2 q(rh) + rl: small, its rounding is negligible
    one = b.k(1.0)
    h = b.add(one, rh)
    t = b.sub(rh, b.sub(h, one))  # Fast2Sum: 1 + rh = h + t exactly (h - 1 exact by Sterbenz)
    return h, b.add(t, lo), n


def _exp_norm(b: ProgramBuilder, y: V, y_lo: V | None = None) -> tuple[V, V, V]:
    """(hi, lo, n): exp(y + y_lo) = (hi + lo) 2**n with hi = fl(hi + lo) (not yet scaled, so a
    caller can multiply first and scale once, keeping full precision into the subnormal range)."""
    h, l, n = _exp_parts(b, y, y_lo)
    hi = b.add(h, l)
    lo = b.add(b.sub(h, hi), l)  # Fast2Sum (|h| >= |l|)
    return hi, lo, n


def _exp_pair(b: ProgramBuilder, y: V, y_lo: V | None = None) -> tuple[V, V]:
    """exp(y + y_lo) as an unevaluated scaled sum hi + lo."""
    hi, lo, n = _exp_norm(b, y, y_lo)
    return b.emit(Op.LDEXP, hi, n), b.emit(Op.LDEXP, lo, n)


def _exp(b: ProgramBuilder, y: V, y_lo: V | None = None) -> V:
    """exp(y + y_lo), one final rounding (LDEXP also gives overflow and gradual underflow)."""
    h, l, n = _exp_parts(b, y, y_lo)
    return b.emit(Op.LDEXP, b.add(h, l), n)


def _recip_1p(b: ProgramBuilder, e: V, e_lo: V | None = None) -> tuple[V, V]:
    """1/(1 + e + e_lo) for 0 <= e <= 1 as r (1 + rho): r = fl(1/fl(1+e)) and
    rho = 1 - r (1 + e + e_lo), computed from the exact e (1 - r is exact for r in [1/2, 1])."""
    one = b.k(1.0)
    r = b.div(one, b.add(one, e))
    nr = _neg(b, r)
    rho = b.fma(nr, e, b.sub(one, r))
    if e_lo is not None:
        rho = b.fma(nr, e_lo, rho)
    return r, rho


def _times_recip(b: ProgramBuilder, e: V, e_lo: V | None, r: V, rho: V) -> V:
    """(e + e_lo) r (1 + rho) with a single rounding at the end (e*r split exactly)."""
    er = b.mul(e, r)
    small = b.fma(er, rho, b.fma(e, r, _neg(b, er)))
    if e_lo is not None:
        small = b.fma(e_lo, r, small)
    return b.add(er, small)


def _times_pair(b: ProgramBuilder, x: V, e: V, e_lo: V | None) -> tuple[V, V]:
    """x (e + e_lo) as a pair (exact product split by FMA)."""
    p = b.mul(x, e)
    lo = b.fma(x, e, _neg(b, p))
    if e_lo is not None:
        lo = b.fma(x, e_lo, lo)
    return p, lo


def _horner_pair(b: ProgramBuilder, t: V, coeffs: list[float]) -> tuple[V, V]:
    """c0 + t (c1 + t Q(t)) as a pair: Q in plain Horner, the last two steps compensated (their
    rounding errors, of the order of the result's ulp, would otherwise dominate)."""
    acc = b.horner(t, coeffs[2:])
    p, p_lo = _times_pair(b, t, acc, None)
    s1, s1_err = b.two_sum(b.k(coeffs[1]), p)
    s1_lo = b.add(s1_err, p_lo)
    q, q_lo = _times_pair(b, t, s1, s1_lo)
    return q, b.add(q_lo, b.k(coeffs[0]))  # c0 is tiny by construction: it joins the low part


def _sigmoid_parts(b: ProgramBuilder, a_neg: V, a_neg_lo: V | None = None) -> tuple[V, V, V, V, V]:
    """For a_neg = -|u| (+ a_neg_lo): E = exp(-|u|) = (hi + lo) 2**n, and r, rho with
    1/(1+E) = r (1 + rho). Returns (hi, lo, n, r, rho)."""
    hi, lo, n = _exp_norm(b, a_neg, a_neg_lo)
    r, rho = _recip_1p(b, b.emit(Op.LDEXP, hi, n), b.emit(Op.LDEXP, lo, n))
    return hi, lo, n, r, rho


# ----------------------------------------------------------------------------- functions

def _log_parts(b: ProgramBuilder, x: V) -> tuple[V, V, V]:
    """log(x) = h + (t + s) (unevaluated): e ln2 + log1p(f), x = (1+f) 2**e with 1+f in
    [sqrt(1/2), sqrt(2)]; h + t = e LN2_HI + f exactly, s the small part."""
    e = b.unary(Op.GETEXP, x)
    m = b.unary(Op.GETMANT, x)
    big = b.lt(b.k(SQRT2), m)  # 1.0 when m > sqrt 2: use m/2 and e+1 instead
    m = b.select(big, b.mul(m, b.k(0.5)), m)
    e = b.add(e, big)
    f = b.sub(m, b.k(1.0))  # exact (Sterbenz)
    z = b.mul(f, f)
    s = b.fma(b.mul(f, z), b.horner(f, LOG_POLY), b.mul(e, b.k(LN2_LO)))
    s = b.fma(z, b.k(-0.5), s)  # small part: -f^2/2 + f^3 P(f) + e LN2_LO
    h, t = b.two_sum(b.mul(e, b.k(LN2_HI)), f)  # e LN2_HI exact (|e| <= 150, 15-bit LN2_HI)
    return h, t, s


def _log(b: ProgramBuilder, x: V) -> V:
    """log(x) from its parts, one final rounding; the edges (0, inf, x < 0) explicitly."""
    h, t, s = _log_parts(b, x)
    res = b.add(h, b.add(t, s))
    # x = 0 or inf: e = -+inf makes h = -+inf, which is the answer (TwoSum's error term is NaN)
    finite = b.lt(b.unary(Op.ABS, h), b.kbits(INF_BITS))
    res = b.select(finite, res, h)
    return b.select(b.lt(x, b.k(0.0)), b.kbits(NAN_BITS), res)  # log(x<0) = NaN, log(-0) = -inf


def _tanh(b: ProgramBuilder, x: V) -> V:
    """|x| < 0.625: odd polynomial. Else tanh|x| = 2/(1+E) - 1, E = exp(-2|x|) as a pair: with
    1/(1+E) = r (1 + rho), 2r - 1 is exact (r in [1/2, 1]) and 2 r rho joins in one FMA.
    Saturates to exactly +-1 as E underflows."""
    s = b.mul(x, x)
    small = b.fma(b.mul(x, s), b.horner(s, TANH_POLY), x)
    a = b.unary(Op.ABS, x)
    e, e_lo = _exp_pair(b, b.mul(a, b.k(-2.0)))
    r, rho = _recip_1p(b, e, e_lo)
    big = b.fma(b.add(r, r), rho, b.fma(b.k(2.0), r, b.k(-1.0)))
    big = b.select(b.lt(x, b.k(0.0)), _neg(b, big), big)
    return _keep_zero(b, x, b.select(b.lt(a, b.k(TANH_SMALL)), small, big))


def _sigmoid(b: ProgramBuilder, x: V) -> V:
    """sigma(|x|) = 1/(1+E), sigma(-|x|) = E/(1+E), E = exp(-|x|) (never overflows; the product
    for x < 0 is formed before the 2**n scaling so the subnormal tail is rounded once)."""
    hi, lo, n, r, rho = _sigmoid_parts(b, _neg(b, b.unary(Op.ABS, x)))
    pos = b.fma(r, rho, r)
    neg = b.emit(Op.LDEXP, _times_recip(b, hi, lo, r, rho), n)
    return b.select(b.lt(x, b.k(0.0)), neg, pos)


def _erf(b: ProgramBuilder, x: V) -> V:
    """|x| < 1: odd polynomial x + x Q(x^2). Else erf|x| = 1 - exp(K + R(|x| - 1)), with the
    exponent carried as an exact pair into exp; |x| is clamped to 4 (saturation, inf)."""
    small = b.fma(x, b.horner(b.mul(x, x), ERF_SMALL_POLY), x)
    a = b.unary(Op.ABS, x)
    t = b.sub(b.min(a, b.k(ERF_CLAMP)), b.k(1.0))  # exact (Sterbenz / same binade)
    rh, rl = b.two_sum(b.k(ERFC_LOG_K), b.horner(t, ERFC_LOG_POLY))
    big = b.sub(b.k(1.0), _exp(b, rh, rl))
    big = b.select(b.lt(x, b.k(0.0)), _neg(b, big), big)
    return b.select(b.lt(a, b.k(1.0)), small, big)


def _gelu_tanh_u(b: ProgramBuilder, xc: V) -> tuple[V, V, V]:
    """u = xc (C1 + C2 xc^2) as a pair (uh, ul) with ~2^-40 relative error (sigmoid(u) for u
    near -100 needs u to an absolute 2^-24, i.e. about 31 bits); also returns fl(xc^2)."""
    x2h = b.mul(xc, xc)
    x2l = b.fma(xc, xc, _neg(b, x2h))
    c2h = b.k(GT_C2[0])
    ph, pl = _times_pair(b, c2h, x2h, None)
    gh, gs = b.two_sum(b.k(GT_C1[0]), ph)
    tiny = b.fma(c2h, x2l, b.fma(b.k(GT_C2[1]), x2h, b.k(GT_C1[1])))
    uh, ul = _times_pair(b, xc, gh, b.add(gs, b.add(pl, tiny)))
    return uh, ul, x2h


def _gelu_tanh_core(b: ProgramBuilder, x: V) -> tuple[V, V, V, V, V, V, V, V]:
    """xc = clamp(x), the pair u = uh + ul, and the sigmoid pieces (hi, lo, n, r, rho) of u."""
    xc = b.min(b.max(x, b.k(-GT_CLAMP)), b.k(GT_CLAMP))
    uh, ul, _ = _gelu_tanh_u(b, xc)
    nh = _neg(b, b.unary(Op.ABS, uh))
    nl = b.select(b.lt(uh, b.k(0.0)), ul, _neg(b, ul))  # -|u| = nh + nl
    hi, lo, n, r, rho = _sigmoid_parts(b, nh, nl)
    return xc, uh, ul, hi, lo, n, r, rho


def _gelu_tanh(b: ProgramBuilder, x: V) -> V:
    """x sigmoid(u) ((1 + tanh z)/2 = sigmoid(2z)); for x < 0 it is x E/(1 + E), E = exp(u),
    formed before the 2**n scaling, so the far negative tail keeps full relative accuracy."""
    xc, _, _, hi, lo, n, r, rho = _gelu_tanh_core(b, x)
    pos = _times_recip(b, xc, None, r, rho)
    ph, pl = _times_pair(b, xc, hi, lo)
    neg = b.min(b.emit(Op.LDEXP, _times_recip(b, ph, pl, r, rho), n), b.kbits(0x80000000))
    res = b.select(b.lt(x, b.k(0.0)), neg, pos)
    res = b.select(b.lt(xc, x), x, res)  # x > 20 (and +inf): exactly x
    return _keep_zero(b, x, res)


def _gelu_tanh_grad(b: ProgramBuilder, x: V, g: V) -> V:
    """g d/dx[x s(u)] = g (s + m s (1 - s)), m = x u' = 3u - 2 C1 x (from the pair u, itself kept
    as a pair), s (1 - s) = E/(1+E)^2. For u < 0 (where the terms cancel near the root) the
    products are carried as pairs; each branch ends as a pair (h, l), so the product with g is
    the only rounding at result precision."""
    xc, uh, ul, hi, lo, n, r, rho = _gelu_tanh_core(b, x)
    # m = 3u - 2 C1 x as a pair (both products split exactly, then TwoSum)
    a_h, a_l = _times_pair(b, b.k(3.0), uh, None)
    c_h, c_l = _times_pair(b, b.k(-2.0 * GT_C1[0]), xc, None)
    m_h, m_e = b.two_sum(a_h, c_h)
    m_l = b.add(m_e, b.add(b.add(a_l, c_l), b.fma(b.k(3.0), ul, b.mul(b.k(-2.0 * GT_C1[1]), xc))))
    sp = b.fma(r, rho, r)  # 1/(1+E)
    e = b.emit(Op.LDEXP, b.add(hi, lo), n)
    # u >= 0: s = r(1+rho), s(1-s) = E sp^2 (a small term: plain products suffice)
    p, p_lo = _times_pair(b, b.mul(e, b.mul(sp, sp)), m_h, m_l)  # m_l is not small: keep it
    pos_h, pos_e = b.two_sum(r, p)
    pos_l = b.add(pos_e, b.fma(r, rho, p_lo))
    # u < 0: s = E sp (formed before the 2**n scaling, as a pair), 1 - s = sp
    er = b.mul(hi, r)
    sn_small = b.fma(lo, r, b.fma(er, rho, b.fma(hi, r, _neg(b, er))))
    sn_h = b.add(er, sn_small)
    sn_l = b.sub(sn_small, b.sub(sn_h, er))  # Fast2Sum
    k_h, k_l = _times_pair(b, sp, m_h, m_l)  # m sp (sp's own error is ~2^-45)
    q, q_lo = _times_pair(b, sn_h, k_h, None)
    q_lo = b.fma(sn_h, k_l, b.fma(sn_l, k_h, q_lo))
    neg_h, neg_e = b.two_sum(sn_h, q)
    neg_l = b.add(neg_e, b.add(q_lo, sn_l))
    is_neg = b.lt(x, b.k(0.0))
    dh = b.select(is_neg, b.emit(Op.LDEXP, neg_h, n), pos_h)
    dl = b.select(is_neg, b.emit(Op.LDEXP, neg_l, n), pos_l)
    return b.fma(g, dh, b.mul(g, dl))


def _gelu_erf_phi(b: ProgramBuilder, x: V) -> tuple[V, V, V, V, V, V, V]:
    """Phi(-w) for w = min(|x|, 16), as (hi + lo) 2**n times a factor that depends on the piece:
    w < 4: Phi(-w) = exp(-w^2/2 + M(w)); w >= 4: w Phi(-w) = exp(-w^2/2 + L(1/w)).
    Returns (w, w^2 pair hi, lo, hi, lo, n, is_first_piece)."""
    w = b.min(b.unary(Op.ABS, x), b.k(GE_CLAMP))
    w2h = b.mul(w, w)
    w2l = b.fma(w, w, _neg(b, w2h))
    nh, nl = b.mul(w2h, b.k(-0.5)), b.mul(w2l, b.k(-0.5))  # -w^2/2, exact
    first = b.lt(w, b.k(GE_SPLIT))
    p1h, p1l = _horner_pair(b, b.sub(w, b.k(2.0)), GE_M_POLY)
    u = b.div(b.k(1.0), w)
    p2 = b.horner(b.sub(u, b.k(0.25)), GE_L_POLY)
    kk = b.select(first, b.k(GE_M_K), b.k(GE_L_K))
    ph = b.select(first, p1h, p2)
    pl = b.select(first, p1l, b.k(0.0))
    s1, e1 = b.two_sum(nh, kk)
    yh, e2 = b.two_sum(s1, ph)
    yl = b.add(b.add(e1, e2), b.add(nl, pl))
    hi, lo, n = _exp_norm(b, yh, yl)
    return w, w2h, w2l, hi, lo, n, first


def _gelu_erf(b: ProgramBuilder, x: V) -> V:
    """|x| > 1/2: x Phi(x) = x - V(x) for x >= 0 and -V(|x|) for x < 0, with V(w) = w Phi(-w)
    computed to full relative accuracy (no 1 + erf cancellation in the negative tail)."""
    w, w2h, w2l, hi, lo, n, first = _gelu_erf_phi(b, x)
    f = b.select(first, w, b.k(1.0))
    v = b.emit(Op.LDEXP, b.fma(f, hi, b.mul(f, lo)), n)
    big = b.select(b.lt(x, b.k(0.0)), _neg(b, v), b.sub(x, v))
    # |x| <= 1/2: x/2 + x^2 K(x^2) with x^2 as an exact pair and one final rounding (x/2 is
    # formed inside the FMA so subnormal x is not rounded early)
    kk = b.horner(w2h, GE_SMALL_POLY)
    small = b.fma(x, b.k(0.5), b.fma(w2h, kk, b.mul(w2l, kk)))
    return _keep_zero(b, x, b.select(b.lt(w, b.k(GE_SMALL)), small, big))


def _gelu_erf_grad(b: ProgramBuilder, x: V, g: V) -> V:
    """g (Phi(x) + x phi(x)): |x| < 1/2: 1/2 + x J(x^2); else x < 0: Phi(-w) - w phi(w),
    x >= 0: 1 - Phi(-w) + w phi(w)."""
    w, w2h, w2l, hi, lo, n, first = _gelu_erf_phi(b, x)
    f = b.select(first, b.k(1.0), b.div(b.k(1.0), w))
    big_phi = b.emit(Op.LDEXP, b.fma(f, hi, b.mul(f, lo)), n)  # Phi(-w)
    zh, ze = b.two_sum(b.mul(w2h, b.k(-0.5)), b.k(LOG_INV_SQRT_2PI[0]))
    zl = b.add(ze, b.fma(w2l, b.k(-0.5), b.k(LOG_INV_SQRT_2PI[1])))
    dh, dl, dn = _exp_norm(b, zh, zl)  # phi(w) = (dh + dl) 2**dn
    wphi = b.emit(Op.LDEXP, b.fma(w, dh, b.mul(w, dl)), dn)  # scaled once, after the product
    neg_h, neg_l = b.two_sum(big_phi, _neg(b, wphi))
    t_h, t_l = b.two_sum(wphi, _neg(b, big_phi))
    pos_h, pos_e = b.two_sum(b.k(1.0), t_h)
    is_neg = b.lt(x, b.k(0.0))
    dh = b.select(is_neg, neg_h, pos_h)
    dl = b.select(is_neg, neg_l, b.add(pos_e, t_l))
    # |x| < 1/2: 1/2 + x J(x^2) as a pair (avoids Phi(-w) ~ 1/2, where the exp's relative error
    # is worth twice as many ulps just below 1/2)
    p, p_lo = _times_pair(b, x, b.horner(b.mul(x, x), GEG_SMALL_POLY), None)
    sh, se = b.two_sum(b.k(0.5), p)
    small = b.lt(w, b.k(GE_SMALL))
    dh = b.select(small, sh, dh)
    dl = b.select(small, b.add(se, p_lo), dl)
    return b.fma(g, dh, b.mul(g, dl))  # one rounding for the product with the upstream grad


def _trig_parts(b: ProgramBuilder, x: V) -> tuple[V, V, V, V]:
    """(s, c, q, x): sin and cos of the reduced argument r = x - k pi/2 and the quadrant
    q = k mod 4 (0..3, an exact binary32 integer; NaN for x = +-inf or NaN)."""
    k = b.unary(Op.RINT, b.mul(x, b.k(TWO_OVER_PI)))
    nk = _neg(b, k)
    r1 = b.fma(nk, b.k(PIO2_1), x)  # exact (see PIO2_1)
    th = b.mul(k, b.k(PIO2_2))
    tl = b.fma(k, b.k(PIO2_2), _neg(b, th))  # k PIO2_2 = th + tl exactly
    rh, re = b.two_sum(r1, _neg(b, th))
    rl = b.fma(nk, b.k(PIO2_3), b.sub(re, tl))
    z = b.mul(rh, rh)
    zl = b.fma(rh, rh, _neg(b, z))  # rh^2 = z + zl exactly
    # sin(rh + rl) = rh + rh z S(z) + rl (1 - z/2)
    small = b.fma(b.mul(rh, z), b.horner(z, SIN_POLY), rl)
    s = b.add(rh, b.fma(b.mul(rl, z), b.k(-0.5), small))
    # cos(rh + rl) = (1 - z/2) + (z^2 C(z) - zl/2 - rh rl), with 1 - z/2 = w + its exact error
    hz = b.mul(z, b.k(0.5))
    w = b.sub(b.k(1.0), hz)
    err = b.sub(b.sub(b.k(1.0), w), hz)  # exact: w >= 0.69 (Sterbenz), and the rest cancels
    tail = b.fma(b.mul(z, z), b.horner(z, COS_POLY), b.fma(_neg(b, rh), rl, b.mul(zl, b.k(-0.5))))
    c = b.add(w, b.add(err, tail))
    q = b.sub(k, b.mul(b.unary(Op.FLOOR, b.mul(k, b.k(0.25))), b.k(4.0)))
    return s, c, q, x


def _by_quadrant(b: ProgramBuilder, q: V, v0: V, v1: V, v2: V, v3: V) -> V:
    eq = [b.emit(Op.EQ, q, b.k(float(i))) for i in range(3)]
    return b.select(eq[0], v0, b.select(eq[1], v1, b.select(eq[2], v2, v3)))


def _sin(b: ProgramBuilder, x: V) -> V:
    """sin x by quadrant: s, c, -s, -c; sin(-0) = -0."""
    s, c, q, _ = _trig_parts(b, x)
    return _keep_zero(b, x, _by_quadrant(b, q, s, c, _neg(b, s), _neg(b, c)))


def _cos(b: ProgramBuilder, x: V) -> V:
    """cos x by quadrant: c, -s, -c, s."""
    s, c, q, _ = _trig_parts(b, x)
    return _by_quadrant(b, q, c, _neg(b, s), _neg(b, c), s)


def _sin_grad(b: ProgramBuilder, x: V, g: V) -> V:
    return b.mul(g, _cos(b, x))


def _cos_grad(b: ProgramBuilder, x: V, g: V) -> V:
    return _neg(b, b.mul(g, _sin(b, x)))


def _pow(b: ProgramBuilder, x: V, y: V) -> V:
    """x**y (C99 pow) = exp(y log|x|) with log|x| as a pair and y log|x| split exactly, then the
    sign and the special cases: y = +-0 -> 1 (even for NaN x); x = 1 -> 1 (even for NaN y);
    |x| = 1 and y = +-inf -> 1; finite x < 0 with non-integral y -> NaN; x < 0 (or -0, -inf) with an odd
    integral y -> the magnitude negated. Everything else (zeros, infinities, overflow, gradual
    underflow) falls out of exp and log (log|0| = -inf, exp(-inf) = 0, ...)."""
    one = b.k(1.0)
    zero = b.k(0.0)
    inf = b.kbits(INF_BITS)
    a = b.unary(Op.ABS, x)
    h, t, s = _log_parts(b, a)
    lo = b.add(t, s)
    hi = b.add(h, lo)
    lo = b.add(b.sub(h, hi), lo)  # Fast2Sum: log|x| = hi + lo
    finite = b.lt(b.unary(Op.ABS, h), inf)
    hi = b.select(finite, hi, h)  # |x| = 0 or inf: log is -+inf exactly, no low part
    lo = b.select(finite, lo, zero)
    ph = b.mul(y, hi)
    pl = b.fma(y, lo, b.fma(y, hi, _neg(b, ph)))  # y log|x| = ph + pl
    pl = b.select(b.lt(b.unary(Op.ABS, ph), inf), pl, zero)
    mag = _exp(b, ph, pl)
    unit_inf = b.min(b.emit(Op.EQ, a, one), b.emit(Op.EQ, b.unary(Op.ABS, y), inf))
    mag = b.select(unit_inf, one, mag)
    y_int = b.emit(Op.EQ, b.unary(Op.FLOOR, y), y)
    half = b.mul(y, b.k(0.5))
    y_odd = b.min(y_int, b.sub(one, b.emit(Op.EQ, b.unary(Op.FLOOR, half), half)))
    negative = b.max(b.lt(x, zero), b.lt(b.div(one, x), zero))  # x < 0, -0 or -inf
    res = b.select(b.min(negative, y_odd), _neg(b, mag), mag)
    finite_neg = b.min(b.lt(x, zero), b.lt(b.kbits(INF_BITS | 0x80000000), x))  # -inf < x < 0
    res = b.select(b.min(finite_neg, b.sub(one, y_int)), b.kbits(NAN_BITS), res)
    res = b.select(b.emit(Op.EQ, x, one), one, res)
    return b.select(b.emit(Op.EQ, y, zero), one, res)


def _rsqrt(b: ProgramBuilder, x: V) -> V:
    """1/sqrt(x) = 1 / fl(sqrt(x)): two correct roundings (< 1.5 ulp); rsqrt(+-0) = +inf (IEEE
    rSqrt; the ABS turns sqrt(-0) = -0 into +0), rsqrt(x<0) = NaN, rsqrt(inf) = 0."""
    return b.div(b.k(1.0), b.unary(Op.ABS, b.unary(Op.SQRT, x)))


def _one(fn: Callable[[ProgramBuilder, V], V]) -> Callable[[], list[Instr]]:
    def build() -> list[Instr]:
        b = ProgramBuilder(1)
        return b.finish(fn(b, b.inputs[0]))

    return build


def _two(fn: Callable[[ProgramBuilder, V, V], V]) -> Callable[[], list[Instr]]:
    def build() -> list[Instr]:
        b = ProgramBuilder(2)
        return b.finish(fn(b, b.inputs[0], b.inputs[1]))

    return build


# ----------------------------------------------------------------------------- registry

PROGRAM_BUILDERS: dict[str, Callable[[], list[Instr]]] = {
    "exp": _one(lambda b, x: _exp(b, x)),
    "log": _one(_log),
    "tanh": _one(_tanh),
    "erf": _one(_erf),
    "sigmoid": _one(_sigmoid),
    "gelu_erf": _one(_gelu_erf),
    "gelu_tanh": _one(_gelu_tanh),
    "gelu_erf_grad": _two(_gelu_erf_grad),
    "gelu_tanh_grad": _two(_gelu_tanh_grad),
    "rsqrt": _one(_rsqrt),
    "sin": _one(_sin),
    "cos": _one(_cos),
    "sin_grad": _two(_sin_grad),
    "cos_grad": _two(_cos_grad),
    "pow": _two(_pow),
}

PROGRAMS: dict[str, list[Instr]] = {name: build() for name, build in PROGRAM_BUILDERS.items()}
BINARY_PROGRAMS = ("pow",)  # two operands (x in r0, y in r1) that are not a gradient
N_INPUTS = {name: (2 if name.endswith("_grad") or name in BINARY_PROGRAMS else 1) for name in PROGRAMS}


def run_program(program: list[Instr], *inputs: npt.ArrayLike) -> U32:
    """Straight-line evaluator: inputs in r0, r1, ..., result from r0 (vectorised)."""
    arrays = np.broadcast_arrays(*(np.asarray(x, dtype=np.uint32) for x in inputs))
    zeros = np.zeros(arrays[0].shape, dtype=np.uint32)
    regs: list[U32] = [zeros] * NUM_REGS
    for i, arr in enumerate(arrays):
        regs[i] = np.array(arr, dtype=np.uint32)
    for ins in program:
        if ins.op == Op.CONST:
            regs[ins.dst] = np.full(zeros.shape, ins.imm, dtype=np.uint32)
        else:
            regs[ins.dst] = fp32.execute(ins.op, regs[ins.a], regs[ins.b], regs[ins.c])
    return regs[0]


def evaluate(name: str, *inputs_bits: npt.ArrayLike) -> U32:
    """Run the named program on uint32 bit-pattern arrays (r0 = x, r1 = upstream grad)."""
    program = PROGRAMS.get(name)
    if program is None:
        raise UnknownFunction(name)
    if len(inputs_bits) != N_INPUTS[name]:
        raise RepOpsError(f"{name} takes {N_INPUTS[name]} inputs, got {len(inputs_bits)}")
    return run_program(program, *inputs_bits)

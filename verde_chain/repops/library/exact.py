"""Exact constants: a value computed in rational arithmetic, then rounded to binary32 once.

Optimizer constants such as ``1 - b1``, ``lr / (1 - b1**t)`` or ``sqrt(1 - b2**t)`` would round
differently in float64 and float32 arithmetic (and across libms for the square root); the
library computes them exactly from the binary32 hyper-parameters and rounds the result once,
nearest-even, so every implementation gets the same CONST immediate.

Powers ``b**t`` of a binary32 ``b`` are exact rationals of about 24t bits: computed so, Adam's
two constants took 0.27 ms at step 1,000, 6.6 ms at step 10,000 and 0.2 s at step 100,000, every
step. ``rounded_at_powers`` encloses each power between two fixed-point bounds instead and
rounds at the enclosure's corners; when they all round alike, so does the exact value (each
rounding is monotonic), and only otherwise (the exact value within the enclosure's width, about
2t * 2**-256, of a rounding boundary) is the exact power computed. The constants are the same
bits either way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TypeVar

import numpy as np

from verde_chain.errors import RepOpsError


def _round_to_24_bits(q: int, s: int, sticky: bool) -> tuple[int, int]:
    """Round q * 2**-s (q of 25 bits or more; ``sticky``: something non-zero lies below q's lsb)
    to 24 significant bits, nearest-even. Returns (q', s') with the rounded value q' * 2**-s'."""
    while q.bit_length() > 25:
        sticky = sticky or bool(q & 1)
        q >>= 1
        s -= 1
    guard, q = q & 1, q >> 1
    s -= 1
    if guard and (sticky or (q & 1)):
        q += 1
    return q, s


def f32_of_fraction(x: Fraction) -> float:
    """Correctly rounded (nearest-even) binary32 value of an exact rational (normal range)."""
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    # scale so that q = floor(x * 2**s) has 25..26 bits: 24 kept + guard + more
    s = 25 - e
    num, den = (x.numerator << s, x.denominator) if s >= 0 else (x.numerator, x.denominator << -s)
    q, r = divmod(num, den)
    q, s = _round_to_24_bits(q, s, r != 0)
    val = math.ldexp(q, -s)
    if not (2.0**-126 <= val <= 3.4028234663852886e38):
        raise RepOpsError(f"constant {x} outside the binary32 normal range")
    return sign * val


def f32_of_sqrt_fraction(x: Fraction) -> float:
    """Correctly rounded binary32 value of sqrt(x) for an exact rational x > 0."""
    if x <= 0:
        raise RepOpsError(f"sqrt constant of non-positive {x}")
    e = (x.numerator.bit_length() - x.denominator.bit_length()) // 2
    s = 25 - e  # sqrt(x) * 2**s has about 25..26 bits
    n = x * Fraction(4) ** s
    floor_n = n.numerator // n.denominator
    q = math.isqrt(floor_n)
    inexact = q * q != floor_n or n.denominator != 1 and n.numerator % n.denominator != 0
    q, s = _round_to_24_bits(q, s, inexact)
    return math.ldexp(q, -s)


def f32q(x: float) -> Fraction:
    """The exact rational value of ``x`` after rounding to binary32 (hyper-parameters)."""
    return Fraction(float(np.float32(x)))


# The fixed point of power enclosures: bounds of b**t in units of 2**-POW_BITS. Each product's
# floor / ceiling adds a unit, and a product of factors <= 1 adds its factors' errors, so the
# bounds of b**t are at most about 2t units apart (under 2**-190 for any t below 2**64).
POW_BITS = 256
# Up to this t the exact power is the cheaper (sqrt(1 - b**t) at t = 128: 15 us exact, 22 us
# enclosed; t = 256: 28 and 22 us).
EXACT_POWER_MAX_T = 192
T = TypeVar("T")


def _encloses(b: Fraction) -> bool:
    """Whether power_enclosure takes base b: in [0, 1), with a power-of-two denominator of at
    most 2**POW_BITS (a binary32 value), so that b is exact at POW_BITS bits."""
    d = b.denominator
    return 0 <= b < 1 and d & (d - 1) == 0 and d.bit_length() - 1 <= POW_BITS


def power_enclosure(b: Fraction, t: int) -> tuple[Fraction, Fraction]:
    """(lo, hi) with lo <= b**t <= hi, for 0 <= b < 1 with a power-of-two denominator (a binary32
    value: then b itself is exact at POW_BITS bits) and t >= 0; by squaring, rounding the lower
    bound down and the upper bound up at every step."""
    if not _encloses(b):
        raise RepOpsError(f"power enclosure of {b}: needs a binary32 value in [0, 1)")
    one = 1 << POW_BITS
    base = b.numerator << (POW_BITS - (b.denominator.bit_length() - 1))  # exact
    lo = hi = one
    base_lo = base_hi = base
    while t:
        if t & 1:
            lo = (lo * base_lo) >> POW_BITS
            hi = -((-hi * base_hi) >> POW_BITS)
        t >>= 1
        if t:
            base_lo = (base_lo * base_lo) >> POW_BITS
            base_hi = -((-base_hi * base_hi) >> POW_BITS)
    return Fraction(lo, one), Fraction(hi, one)


def exact_powers(powers: Sequence[tuple[Fraction, int]]) -> list[Fraction]:
    """Each b**t exactly (rounded_at_powers' fallback)."""
    return [b**t for b, t in powers]


def rounded_at_powers(fn: Callable[..., T], powers: Sequence[tuple[Fraction, int]]) -> T:
    """fn(b1**t1, b2**t2, ...) for an fn that is monotonic in each argument and rounds its
    result (a binary32 constant): fn at every corner of the powers' enclosures when all corners
    agree, else fn at the exact powers. Powers of a base outside [0, 1), and powers whose
    exponents are all at most EXACT_POWER_MAX_T, are exact."""
    if any(t > EXACT_POWER_MAX_T for _, t in powers) and all(_encloses(b) for b, _ in powers):
        bounds = [power_enclosure(b, t) for b, t in powers]
        if all(hi < 1 for _, hi in bounds):
            corners = {fn(*corner) for corner in itertools.product(*bounds)}
            if len(corners) == 1:
                return corners.pop()
    return fn(*exact_powers(powers))

"""Exact constants: a value computed in rational arithmetic, then rounded to binary32 once.

Optimizer constants such as ``1 - b1``, ``lr / (1 - b1**t)`` or ``sqrt(1 - b2**t)`` would round
differently in float64 and float32 arithmetic (and across libms for the square root); the
library computes them exactly from the binary32 hyper-parameters and rounds the result once,
nearest-even, so every implementation gets the same CONST immediate.
"""

from __future__ import annotations

import math
from fractions import Fraction

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

"""Binary32 edge values: the one list that tests and device checks draw special operands from.

The list is kept as bit patterns, because signed zeros and NaN payloads only survive as bits (a
Python float loses a signalling NaN's payload); :func:`edge_floats` gives the same values as a
float32 array for code that mixes them into tensors. Every entry is a value where some rule of
RepOps / IEEE-754 changes (sign of zero, subnormal grid, overflow, NaN canonicalisation, the
ties of rounding to integers, the int32 range), or an inexact decimal that exercises rounding.
"""

from __future__ import annotations

import numpy as np

EDGE_BITS: tuple[int, ...] = (
    # signed zeros
    0x00000000,
    0x80000000,
    # subnormals: smallest (1e-45), largest, half-way, and two decimals (4e-40, 1.5e-39)
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x807FFFFF,
    0x00400000,
    0x00045B0A,
    0x00105564,
    # smallest normals (1.1754944e-38)
    0x00800000,
    0x80800000,
    0x00800001,
    # largest finite (3.4028235e38)
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F7FFFFE,
    # infinities
    0x7F800000,
    0xFF800000,
    # NaNs: canonical, negative quiet, signalling, payloads
    0x7FC00000,
    0xFFC00000,
    0x7F800001,
    0xFFBFFFFF,
    0x7FFFFFFF,
    # around one: 1, -1, 0.5, 1.5, 3, one ulp below and above 1
    0x3F800000,
    0xBF800000,
    0x3F000000,
    0x3FC00000,
    0x40400000,
    0x3F7FFFFF,
    0x3F800001,
    # just below 0.5 (rounds to 0 whatever the tie rule)
    0x3EFFFFFF,
    # the integral threshold 2^23 and 2^24 (16777217 rounds to 2^24)
    0x4B000000,
    0x4AFFFFFF,
    0x4B7FFFFF,
    0xCB000001,
    0x4B800000,
    # the int32 range limits: 2^31, -2^31 and their neighbours
    0x4F000000,
    0xCF000000,
    0x4EFFFFFF,
    0xCF000001,
    # inexact decimals: 0.1, -0.1, 1e20, -1e20, 1e-20
    0x3DCCCCCD,
    0xBDCCCCCD,
    0x60AD78EC,
    0xE0AD78EC,
    0x1E3CE508,
)


def edge_floats() -> np.ndarray:
    """EDGE_BITS as a float32 array (a fresh copy; NaN payloads kept bit for bit)."""
    return np.array(EDGE_BITS, dtype=np.uint32).view(np.float32)


def edge_array(
    shape: tuple[int, ...], seed: int, frac: float = 0.3, scale: float = 3.0, edges: np.ndarray | None = None
) -> np.ndarray:
    """Normal values (times ``scale``) with a fraction ``frac`` of them replaced by edge bit
    patterns (``edges``, uint32; default EDGE_BITS); replayable from ``seed``."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    bits = x.reshape(-1).view(np.uint32)
    pick = rng.random(bits.size) < frac
    pool = np.array(EDGE_BITS, dtype=np.uint32) if edges is None else np.asarray(edges, dtype=np.uint32)
    bits[pick] = rng.choice(pool, int(pick.sum()))
    return x

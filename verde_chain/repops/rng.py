"""Counter-based random numbers that every machine reproduces bit for bit.

Generator: Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11)
in pure uint32/uint64 integer arithmetic, so any element can be regenerated alone from
``(seed, stream, index)``:

    key     = (seed mod 2**32, seed >> 32)              64-bit job seed
    counter = (index mod 2**32, index >> 32, stream, attempt)
    words   = philox4x32_10(counter, key)               4 x uint32

Derived distributions (all exact, no libm):

* ``uniform``: ``(w0 >> 8) * 2**-24`` in [0, 1) — the top 24 bits, exactly representable.
* ``normal``: Marsaglia's polar method. Attempt j = 0, 1, ... of element i uses counter
  (i, stream, j): ``u = (w0 >> 8) / 2**23 - 1``, ``v = (w1 >> 8) / 2**23 - 1`` (exact, in [-1, 1)),
  ``s = FMA(u, u, MUL(v, v))``; the first attempt with ``0 < s < 1`` is accepted and gives
  ``z = MUL(u, SQRT(DIV(MUL(log(s), -2), s)))`` where ``log`` is the RepOps log program. Both
  steps are RepOps kernels run by ``reference.run``, so the result is defined by the RepOps
  instruction semantics. Then ``x = ADD(MUL(z, std), mean)``.
* ``dropout_keep``: keep element i iff ``(w0 >> 8) >= round(p * 2**24)`` (p rounded to binary32
  first, then the product rounded half-even to an integer exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Op
from verde_chain.repops.program import InputMap, KernelDesc

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF
MAX_ATTEMPTS = 64


def philox4x32_10(counter: Sequence[np.ndarray | np.integer], key: tuple[int, int]) -> list[np.ndarray]:
    """Philox-4x32 with 10 rounds on uint32 counter lanes (arrays broadcast together)."""
    c = [np.asarray(x, dtype=np.uint64) & np.uint64(MASK32) for x in counter]
    c = list(np.broadcast_arrays(*c))
    k0, k1 = np.uint64(key[0] & MASK32), np.uint64(key[1] & MASK32)
    for r in range(10):
        if r:
            k0 = np.uint64((int(k0) + W0) & MASK32)
            k1 = np.uint64((int(k1) + W1) & MASK32)
        p0 = c[0] * np.uint64(M0)  # 32x32 -> 64 bits, exact in uint64
        p1 = c[2] * np.uint64(M1)
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(MASK32)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(MASK32)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return [x.astype(np.uint32) for x in c]


def _words(seed: int, stream: int, n: int, offset: int, attempt: int | np.ndarray = 0) -> list[np.ndarray]:
    if not 0 <= seed < 2**64 or not 0 <= stream < 2**32:
        raise RepOpsError(f"rng: seed must be a uint64 and stream a uint32 (got {seed}, {stream})")
    idx = np.arange(offset, offset + n, dtype=np.uint64)
    return philox4x32_10(
        [idx & np.uint64(MASK32), idx >> np.uint64(32), np.uint64(stream), np.asarray(attempt, np.uint64)],
        (seed & MASK32, seed >> 32),
    )


def uniform(seed: int, stream: int, shape: Sequence[int], offset: int = 0) -> np.ndarray:
    """float32 uniforms in [0, 1): top 24 bits of word 0, times 2**-24 (exact)."""
    n = int(np.prod(shape, dtype=np.int64))
    w0 = _words(seed, stream, n, offset)[0]
    return ((w0 >> 8).astype(np.float32) * np.float32(2.0**-24)).reshape(tuple(shape))


def _signed_unit(w: np.ndarray) -> np.ndarray:
    # (w >> 8) - 2**23 is an integer in [-2**23, 2**23): exact in float32, then exact scaling
    return ((w >> 8).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)


def _polar_kernels(n: int) -> tuple[KernelDesc, KernelDesc]:
    """The two RepOps kernels of the polar method: s from (u, v), then z from (u, s)."""
    from verde_chain.repops.library.asm import I, const, load, transcendental

    m = InputMap(n, (1,))
    s_code = (
        load(0, 0),  # r0 = u
        load(1, 1),  # r1 = v
        I(Op.MUL, 1, 1, 1),  # r1 = v*v
        I(Op.FMA, 0, 0, 0, 1),  # s = u*u + v*v, one rounding
    )
    z_code = (
        load(0, 1),  # r0 = s
        *transcendental("log"),  # r0 = log(s); the program may clobber every other register
        load(1, 1),  # so s and u are loaded again after it
        const(2, -2.0),
        I(Op.MUL, 0, 0, 2),  # log(s) * -2
        I(Op.DIV, 0, 0, 1),  # / s
        I(Op.SQRT, 0, 0),
        load(1, 0),  # r1 = u
        I(Op.MUL, 0, 1, 0),  # z = u * sqrt(-2 log(s) / s)
    )
    return KernelDesc((n,), 1, (m, m), s_code, label="polar_s"), KernelDesc((n,), 1, (m, m), z_code, label="polar_z")


def normal(
    seed: int, stream: int, shape: Sequence[int], mean: float = 0.0, std: float = 1.0, offset: int = 0
) -> np.ndarray:
    """float32 normals by the polar method (see the module docstring), exactly reproducible."""
    from verde_chain.repops import reference

    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return np.zeros(tuple(shape), np.float32)
    u = np.zeros(n, np.float32)
    s = np.zeros(n, np.float32)
    todo = np.arange(n)
    for attempt in range(MAX_ATTEMPTS):
        if todo.size == 0:
            break
        w = philox4x32_10(
            [
                (todo.astype(np.uint64) + np.uint64(offset)) & np.uint64(MASK32),
                (todo.astype(np.uint64) + np.uint64(offset)) >> np.uint64(32),
                np.uint64(stream),
                np.uint64(attempt),
            ],
            (seed & MASK32, seed >> 32),
        )
        uu, vv = _signed_unit(w[0]), _signed_unit(w[1])
        s_desc, _ = _polar_kernels(todo.size)
        ss = reference.run(s_desc, [uu, vv])
        ok = (ss > 0) & (ss < 1)
        u[todo[ok]], s[todo[ok]] = uu[ok], ss[ok]
        todo = todo[~ok]
    if todo.size:
        raise RepOpsError(f"rng.normal: {todo.size} elements not accepted after {MAX_ATTEMPTS} attempts")
    _, z_desc = _polar_kernels(n)
    z = reference.run(z_desc, [u, s])
    with np.errstate(all="ignore"):  # numpy float32 MUL/ADD are single IEEE ops
        x = z * np.float32(std) if std != 1.0 else z
        x = x + np.float32(mean) if mean != 0.0 else x
    return x.astype(np.float32).reshape(tuple(shape))


def dropout_keep(seed: int, stream: int, shape: Sequence[int], p: float, offset: int = 0) -> np.ndarray:
    """float32 mask (1.0 keep / 0.0 drop) with drop probability fl32(p) (to 2**-24)."""
    if not 0.0 <= p < 1.0:
        raise RepOpsError(f"dropout: p={p} must be in [0, 1)")
    thr = round(Fraction(float(np.float32(p))) * (1 << 24))  # Fraction round: half-even, exact
    n = int(np.prod(shape, dtype=np.int64))
    w0 = _words(seed, stream, n, offset)[0]
    return ((w0 >> 8) >= thr).astype(np.float32).reshape(tuple(shape))

"""Measure the accuracy of the RepOps transcendental programs against MPFR (gmpy2).

Every program is run through the exact binary32 instruction semantics (``fp32.execute``) and
compared with the exact function value computed by MPFR at 160 bits. Error is reported in ulps of
the exact value (the binary32 ulp at its magnitude, 2**-149 below the normal range), so a
correctly rounded result has error <= 0.5. The ``*_grad`` programs are sums whose terms cancel at
the root of the derivative, where no ulp bound is possible; for them the error is measured in ulps
of the *sum of the absolute values of the terms* times |g| (a mixed, condition-aware error).

Samples: every ``--step``-th bit pattern of all 2**32 (both signs, all exponents, NaNs, infs),
``--random`` uniformly drawn floats in each function's interesting interval, and a fixed list of
edge cases (zeros, subnormals, thresholds, +-inf, NaN). Prints a markdown table.

    .venv/bin/python scripts/accuracy_transcendentals.py            # full table (~2-3 min)
    .venv/bin/python scripts/accuracy_transcendentals.py --step 65537 --random 20000   # quick
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import gmpy2
import numpy as np
import numpy.typing as npt
from gmpy2 import mpfr

from verde_chain.repops import transcendental

PREC = 160
CTX = gmpy2.context(precision=PREC, emin=-100000, emax=100000)
F32 = gmpy2.ieee(32)

MP = Callable[[mpfr], mpfr]


def _sigmoid(x: mpfr) -> mpfr:
    return 1 / (1 + gmpy2.exp(-x))


def _phi_upper(x: mpfr) -> mpfr:
    """Phi(x) = erfc(-x/sqrt2)/2 (no cancellation for x << 0)."""
    return gmpy2.erfc(-x / gmpy2.sqrt(2)) / 2


def _gelu_erf(x: mpfr) -> mpfr:
    return x * _phi_upper(x)


def _gelu_tanh_u(x: mpfr) -> mpfr:
    return 2 * gmpy2.sqrt(2 / gmpy2.const_pi()) * (x + mpfr("0.044715") * x**3)


def _gelu_tanh(x: mpfr) -> mpfr:
    # 0.5 x (1 + tanh z) written as x sigmoid(2z) (the same value; no cancellation)
    return x * _sigmoid(_gelu_tanh_u(x))


def _gelu_erf_grad_terms(x: mpfr) -> tuple[mpfr, mpfr]:
    pdf = gmpy2.exp(-x * x / 2) / gmpy2.sqrt(2 * gmpy2.const_pi())
    return _phi_upper(x), x * pdf


def _gelu_tanh_grad_terms(x: mpfr) -> tuple[mpfr, mpfr]:
    s = _sigmoid(_gelu_tanh_u(x))
    du = 2 * gmpy2.sqrt(2 / gmpy2.const_pi()) * (1 + 3 * mpfr("0.044715") * x * x)
    return s, x * du * s * (1 - s)


@dataclass(frozen=True)
class Spec:
    name: str
    interval: tuple[float, float]  # where the random samples go
    fn: MP | None = None  # one-input function
    grad_terms: Callable[[mpfr], tuple[mpfr, mpfr]] | None = None  # gradient = sum of terms
    fn2: Callable[[mpfr, mpfr], mpfr] | None = None  # two-operand function f(x, y)
    domain: float | None = None  # the error bound is claimed for |x| <= domain only


# the second operand of two-operand functions when a caller gives none: a fixed cycle of
# exponents (small integers, halves, thirds, negatives, and large ones that overflow)
Y_CYCLE = np.array([2.0, 3.0, 0.5, -1.0, -0.5, 1.5, -2.5, 7.0, 0.1, -3.0, 1 / 3, 24.5, -40.0, 1.0, 0.0],
                   dtype=np.float32).view(np.uint32)


def default_second(x_bits: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    return np.resize(Y_CYCLE, x_bits.shape).astype(np.uint32)


def _trig_grad(fn: MP, sign: int) -> Callable[[mpfr], tuple[mpfr, mpfr]]:
    return lambda x: (sign * fn(x), mpfr(0))


SPECS: list[Spec] = [
    Spec("exp", (-104.0, 89.0), gmpy2.exp),
    Spec("log", (0.0, 4.0), gmpy2.log),
    Spec("tanh", (-10.0, 10.0), gmpy2.tanh),
    Spec("erf", (-4.5, 4.5), gmpy2.erf),
    Spec("sigmoid", (-104.0, 20.0), _sigmoid),
    Spec("gelu_erf", (-15.0, 6.0), _gelu_erf),
    Spec("gelu_tanh", (-12.0, 6.0), _gelu_tanh),
    Spec("rsqrt", (0.0, 16.0), gmpy2.rec_sqrt),
    Spec("gelu_erf_grad", (-15.0, 6.0), grad_terms=_gelu_erf_grad_terms),
    Spec("gelu_tanh_grad", (-12.0, 6.0), grad_terms=_gelu_tanh_grad_terms),
    Spec("sin", (-100.0, 100.0), gmpy2.sin, domain=2.0**17),
    Spec("cos", (-100.0, 100.0), gmpy2.cos, domain=2.0**17),
    Spec("sin_grad", (-100.0, 100.0), grad_terms=_trig_grad(gmpy2.cos, 1), domain=2.0**17),
    Spec("cos_grad", (-100.0, 100.0), grad_terms=_trig_grad(gmpy2.sin, -1), domain=2.0**17),
    Spec("pow", (0.0, 16.0), fn2=lambda x, y: x**y),
]
BY_NAME = {s.name: s for s in SPECS}


def edge_cases() -> npt.NDArray[np.uint32]:
    """Zeros, subnormals, normal-range edges, +-inf, NaN, and each function's thresholds."""
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0,
            88.72283935546875, 88.72284698486328, 89.0, -87.33654, -103.27893, -103.97208, -104.0,
            -150.0, 150.0, 9.01, -9.01, 3.92, -3.92, 4.0, -4.0, 0.625, -0.625, 0.7518, -0.7518,
            1e-30, -1e-30, 1e-8, -1e-8, 16.0, -16.0, 20.0, -20.0, 14.0, -14.0, 10.5, -10.5, 13.3]
    bits = [int(np.float32(v).view(np.uint32)) for v in vals]
    bits += [1, 2, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x3F7FFFFF, 0x3F800001, 0x7FC00000]
    bits += [b | 0x80000000 for b in bits]
    return np.array(sorted(set(bits)), dtype=np.uint32)


def samples(spec: Spec, step: int, n_random: int, seed: int = 2026) -> npt.NDArray[np.uint32]:
    grid = np.arange(0, 2**32, step, dtype=np.uint64).astype(np.uint32)
    rng = np.random.default_rng(seed)
    lo, hi = spec.interval
    rand = rng.uniform(lo, hi, n_random).astype(np.float32).view(np.uint32)
    return np.concatenate([grid, rand, edge_cases()])


def ulp_of(v: mpfr) -> float:
    """binary32 ulp at the magnitude of v (2**-149 in the subnormal range)."""
    if v == 0:
        return 2.0**-149
    e = max(int(gmpy2.floor(gmpy2.log2(abs(v)))), -126)
    return 2.0 ** (e - 23)


def round_f32(v: mpfr) -> float:
    with F32:
        return float(+v)


def _error(got: float, exact: mpfr, scale: mpfr | None) -> float:
    """Error of got in ulps of exact (or of the mixed scale); 0 for equal specials."""
    if math.isnan(got) or gmpy2.is_nan(exact):
        return 0.0 if (math.isnan(got) and gmpy2.is_nan(exact)) else math.inf
    rounded = round_f32(exact)
    if math.isinf(got) or math.isinf(rounded):
        return 0.0 if got == rounded else math.inf
    ref = exact if scale is None else scale
    return float(abs(mpfr(got) - exact)) / ulp_of(ref)


def exact_values(spec: Spec, x: float, g: float) -> tuple[mpfr, mpfr | None]:
    xm = mpfr(x)
    if spec.fn2 is not None:
        if math.isnan(x) or math.isnan(g):  # C99: pow(x, 0) = 1 and pow(1, y) = 1 even for NaN
            return (mpfr(1) if (g == 0 or x == 1) else mpfr("nan")), None
        return spec.fn2(xm, mpfr(g)), None
    if spec.fn is not None:
        if math.isnan(x):
            return mpfr("nan"), None
        return _special_or(spec, x, lambda: spec.fn(xm)), None  # type: ignore[misc]
    assert spec.grad_terms is not None
    if math.isnan(x) or math.isnan(g):
        return mpfr("nan"), None
    if math.isinf(x):  # gelu's limits; periodic functions have none
        return (mpfr("nan") if spec.domain is not None else mpfr(g if x > 0 else 0.0)), None
    a, b = spec.grad_terms(xm)
    gm = mpfr(g)
    return gm * (a + b), abs(gm) * (abs(a) + abs(b))


def _special_or(spec: Spec, x: float, compute: Callable[[], mpfr]) -> mpfr:
    """MPFR's conventions at the edges, plus gelu's limits at +-inf."""
    if spec.name.startswith("gelu") and math.isinf(x):
        return mpfr(x) if x > 0 else mpfr("-0.0")
    return compute()


@dataclass
class Row:
    name: str
    n: int
    max_err: float
    where: float
    over_half: int  # results that are not the correctly rounded one (for plain functions)
    seconds: float


def measure(
    name: str, x_bits: npt.NDArray[np.uint32], g_bits: npt.NDArray[np.uint32] | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint32]]:
    """Per-sample error (ulps) and the program's outputs."""
    spec = BY_NAME[name]
    if spec.grad_terms is not None and g_bits is None:
        g_bits = np.full(x_bits.shape, 0x3F800000, dtype=np.uint32)
    if spec.fn2 is not None and g_bits is None:
        g_bits = default_second(x_bits)
    inputs = (x_bits,) if g_bits is None else (x_bits, g_bits)
    out = transcendental.evaluate(name, *inputs)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns widen with a warning
        xs = x_bits.view(np.float32).astype(np.float64)
        gs = np.ones_like(xs) if g_bits is None else g_bits.view(np.float32).astype(np.float64)
        got = out.view(np.float32).astype(np.float64)
    errs = np.empty(len(xs))
    with CTX:
        for i in range(len(xs)):
            if spec.domain is not None and not abs(xs[i]) <= spec.domain:
                errs[i] = 0.0  # outside the claimed domain (inf and NaN are checked as edges)
                if not math.isinf(xs[i]):
                    continue
            exact, scale = exact_values(spec, float(xs[i]), float(gs[i]))
            errs[i] = _error(float(got[i]), exact, scale)
    return errs, out


def run(name: str, step: int, n_random: int) -> Row:
    t0 = time.time()
    spec = BY_NAME[name]
    x = samples(spec, step, n_random)
    errs, _ = measure(name, x)
    i = int(np.argmax(errs))
    over = int(np.sum(errs > 0.5)) if spec.grad_terms is None else -1
    return Row(name, len(x), float(errs[i]), float(x.view(np.float32)[i]), over, time.time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step", type=int, default=4099, help="take every STEP-th bit pattern")
    ap.add_argument("--random", type=int, default=200_000, help="random samples per function")
    ap.add_argument("names", nargs="*", default=[s.name for s in SPECS])
    args = ap.parse_args()
    print("| function | samples | max error (ulp) | at x | not correctly rounded | instructions |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.names:
        row = run(name, args.step, args.random)
        metric = " (mixed)" if BY_NAME[name].grad_terms is not None else ""
        cr = f"{row.over_half / row.n:.2%}" if row.over_half >= 0 else "n/a"
        print(
            f"| {name} | {row.n} | {row.max_err:.3f}{metric} | {row.where:.9g} | {cr} | "
            f"{len(transcendental.PROGRAMS[name])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

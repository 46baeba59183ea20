"""Adam's per-step constants (step size, sqrt of the bias correction) by step number.

    .venv/bin/python scripts/bench_adam_constants.py [--steps 1 1000 10000 100000] [--repeat 9]

Every Adam step's batch carries ``library.adam_constants(lr, b1, b2, 0, t)``: exact rationals
rounded once to binary32. Per step number t, in this process: the median time of
``adam_constants`` (past t = EXACT_POWER_MAX_T the powers b**t enclosed at 256 bits, exact
only where the enclosure's corners round apart: ``exact.rounded_at_powers``) and of the same
call with every power exact (~24t-bit integers, as before the enclosures), their ratio, and
whether the bits agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

from verde_chain.repops import library
from verde_chain.repops.library import exact

LR, B1, B2 = 3e-4, 0.9, 0.999


def constants(t: int) -> tuple[float, float]:
    k = library.adam_constants(LR, B1, B2, 0.0, t)
    return k.step_size, k.bc2_sqrt


def exactly(t: int) -> tuple[float, float]:
    """adam_constants with every power exact (the definition, and the code before enclosures)."""
    with_max = exact.EXACT_POWER_MAX_T
    exact.EXACT_POWER_MAX_T = sys.maxsize
    try:
        return constants(t)
    finally:
        exact.EXACT_POWER_MAX_T = with_max


def median_s(fn: Callable[[int], tuple[float, float]], t: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, nargs="+", default=[1, 1000, 10000, 100000])
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args()
    if min(args.steps) < 1 or args.repeat < 1:
        p.error("--steps are 1-based and --repeat at least 1")
    rows = []
    for t in args.steps:
        new, old = median_s(constants, t, args.repeat), median_s(exactly, t, args.repeat)
        row = {"step": t, "enclosed_us": round(1e6 * new, 1), "exact_us": round(1e6 * old, 1),
               "exact/enclosed": round(old / new, 1), "same_bits": constants(t) == exactly(t)}
        print(" | ".join(f"{k} {v}" for k, v in row.items()), flush=True)
        rows.append(row)
    print(json.dumps({"adam_constants": rows}))


if __name__ == "__main__":
    main()

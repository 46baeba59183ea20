"""Gas per SoftFloat32 operation, measured inside the EVM on a fresh Anvil.

Method: ``SoftFloatHarness.measure(op, a, b, c)`` reads ``gasleft()`` immediately before and after
the library call inside the branch for that op; the same window around a plain copy (op NOP) is
the fixed overhead and is subtracted. The figure therefore covers the internal call (jump in,
argument and return shuffling) and the op's body, but not ABI decoding or dispatch.

Two operand sets per op:
  * ``normal``: 500 random normal numbers with exponents in [2^-63, 2^63] (seed 7), the common case;
  * ``vectors``: up to 5,000 cases from the Berkeley TestFloat files (every k-th line), which
    include zeros, subnormals, infinities, NaNs and overflow, so they show the worst paths.

Usage: python scripts/bench_softfloat_gas.py [--markdown]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the TestFloat reader is test support code

from tests.support.testfloat import TestFloatMissing, load_vectors
from verde_chain.chain.anvil import Anvil
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_contract

NOP = 255
# name, harness op, arity, TestFloat file (or None), positive operands only
OPS: list[tuple[str, int, int, str | None, bool]] = [
    ("add", 0, 2, "f32_add", False),
    ("sub", 1, 2, "f32_sub", False),
    ("mul", 2, 2, "f32_mul", False),
    ("div", 3, 2, "f32_div", False),
    ("fma", 4, 3, "f32_mulAdd", False),
    ("sqrt", 5, 1, "f32_sqrt", True),
    ("max", 6, 2, None, False),
    ("min", 7, 2, None, False),
    ("lt", 8, 2, "f32_lt", False),
    ("eq", 9, 2, "f32_eq", False),
    ("rint", 11, 1, "f32_roundToInt_rnear_even", False),
    ("floor", 22, 1, "f32_roundToInt_rmin", False),
    ("ldexp (float b)", 12, 2, None, False),
    ("getexp", 13, 1, None, False),
    ("getmant", 14, 1, None, False),
    ("fromInt32", 101, 1, "i32_to_f32", False),
    ("toInt32", 103, 1, "f32_to_i32_rminMag", False),
]
GOALS = {"add": 1_500, "mul": 1_200, "fma": 2_500, "div": 2_500, "sqrt": 5_000}


def normal_operands(rnd: random.Random, n: int, positive: bool) -> list[int]:
    return [
        ((0 if positive else rnd.getrandbits(1)) << 31) | (rnd.randint(64, 190) << 23) | rnd.getrandbits(23)
        for _ in range(n)
    ]


def vector_cases(name: str, arity: int, limit: int = 5_000) -> list[list[int]]:
    """The operands of every k-th case of a TestFloat file (about `limit` cases); [] without it."""
    try:
        rows = load_vectors(name)
    except TestFloatMissing:
        return []
    step = max(1, len(rows) // limit)
    return [row[:arity] for row in rows[::step]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()

    artifacts = compile_contracts()
    with Anvil() as node:
        w3 = node.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        h = deploy_contract(w3, artifacts, "SoftFloatHarness")
        _, overhead = h.functions.measure(NOP, 0, 0, 0).call()
        rnd = random.Random(7)
        rows = []
        for name, op, arity, vfile, positive in OPS:
            a = normal_operands(rnd, 500, positive)
            b = normal_operands(rnd, 500, False)
            c = normal_operands(rnd, 500, False)
            if op == 12:  # LDEXP: b must be an integral float for real work; use -40..40
                b = [
                    0x80000000 * (k < 0) | (0 if k == 0 else _int_bits(abs(k)))
                    for k in (rnd.randint(-40, 40) for _ in a)
                ]
            total, worst = h.functions.measureBatch(op, a, b, c).call()
            mean_n, worst_n = total / len(a) - overhead, worst - overhead
            mean_v = worst_v = None
            if vfile:
                cases = vector_cases(vfile, arity)
                if cases:
                    cols = [[cs[i] if i < arity else 0 for cs in cases] for i in range(3)]
                    tv, wv = h.functions.measureBatch(op, *cols).call({"gas": 900_000_000})
                    mean_v, worst_v = tv / len(cases) - overhead, wv - overhead
            rows.append((name, mean_n, worst_n, mean_v, worst_v, GOALS.get(name)))

    if args.markdown:
        print("| op | mean gas (normal) | max (normal) | mean (TestFloat) | max (TestFloat) | goal |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, mn, wn, mv, wv, goal in rows:
            print(f"| {name} | {mn:,.0f} | {wn:,} | {_fmt(mv, ',.0f')} | {_fmt(wv, ',.0f')} | {_fmt(goal, ',.0f')} |")
    else:
        print(f"window overhead subtracted: {overhead} gas")
        print(f"{'op':<16}{'mean':>8}{'max':>8}{'mean TF':>10}{'max TF':>9}{'goal':>8}")
        for name, mn, wn, mv, wv, goal in rows:
            print(
                f"{name:<16}{mn:>8.0f}{wn:>8}{_fmt(mv, '.0f', '-'):>10}{_fmt(wv, '.0f', '-'):>9}{_fmt(goal, '.0f', '-'):>8}"
            )
    failed = [r[0] for r in rows if r[5] is not None and r[1] > r[5]]
    if failed:
        print(f"over the gas goal: {failed}", file=sys.stderr)
        return 1
    return 0


def _fmt(x: float | None, spec: str, missing: str = "") -> str:
    return missing if x is None else format(x, spec)


def _int_bits(k: int) -> int:
    """binary32 bits of a small positive integer k (exact)."""
    e = k.bit_length() - 1
    return ((e + 127) << 23) | ((k << (23 - e)) & 0x7FFFFF)


if __name__ == "__main__":
    sys.exit(main())

"""SoftFloat32.sol (contracts/vm/) on Anvil against its Python twin verde_chain/vm/softfloat.py:
every TestFloat vector, differential fuzzing against the twin, revert decoding and the gas goals.

Vectors go through ``SoftFloatHarness.runPacked`` (4 bytes per operand and per result, so no ABI
word per value) in batches of BATCH cases per eth_call; all ~435k cases take a few seconds.
The Hypothesis differential test uses the ``uint32[]`` entry point ``run``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.floats import f32_st, s32  # the edge-biased operand strategy
from tests.support.testfloat import load_vectors, result_matches
from verde_chain.chain.tx import call
from verde_chain.errors import ContractRevert
from verde_chain.repops.isa import Op
from verde_chain.vm import softfloat as sf

pytestmark = pytest.mark.chain

BATCH = 16384
CALL_GAS = 900_000_000  # Anvil runs with a 1e9 block gas limit (verde_chain.chain.anvil)
EXAMPLES = int(os.environ.get("VERDE_SOFTFLOAT_CHAIN_EXAMPLES", "40"))

# Harness op codes (contracts/test/SoftFloatHarness.sol): RepOps opcodes plus conversions.
ADD, SUB, MUL, DIV, FMA, SQRT, MAX, MIN = Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FMA, Op.SQRT, Op.MAX, Op.MIN
LT, EQ, SELECT, RINT, LDEXP, GETEXP, GETMANT = Op.LT, Op.EQ, Op.SELECT, Op.RINT, Op.LDEXP, Op.GETEXP, Op.GETMANT
NEG, ABS, MOV, FLOOR = Op.NEG, Op.ABS, Op.MOV, Op.FLOOR
LE, FROM_I32, FROM_U32, TO_I32, LDEXP_INT = 100, 101, 102, 103, 104
NOP = 255

# file -> (harness op, arity)
VECTOR_OPS: dict[str, tuple[int, int]] = {
    "f32_add": (ADD, 2),
    "f32_sub": (SUB, 2),
    "f32_mul": (MUL, 2),
    "f32_div": (DIV, 2),
    "f32_sqrt": (SQRT, 1),
    "f32_mulAdd": (FMA, 3),
    "f32_eq": (EQ, 2),
    "f32_lt": (LT, 2),
    "f32_roundToInt_rnear_even": (RINT, 1),
    "f32_roundToInt_rmin": (FLOOR, 1),
    "i32_to_f32": (FROM_I32, 1),
    "ui32_to_f32": (FROM_U32, 1),
    "f32_to_i32_rminMag": (TO_I32, 1),
}


# harness op -> (arity, twin on operand bits returning the harness' uint32 result)
TWIN: dict[int, tuple[int, Callable[..., int]]] = {
    ADD: (2, sf.add),
    SUB: (2, sf.sub),
    MUL: (2, sf.mul),
    DIV: (2, sf.div),
    FMA: (3, sf.fma),
    SQRT: (1, sf.sqrt),
    MAX: (2, sf.max_),
    MIN: (2, sf.min_),
    LT: (2, lambda a, b: int(sf.lt(a, b))),
    EQ: (2, lambda a, b: int(sf.eq(a, b))),
    LE: (2, lambda a, b: int(sf.le(a, b))),
    SELECT: (3, sf.select),
    RINT: (1, sf.rint),
    FLOOR: (1, sf.floor),
    LDEXP: (2, sf.ldexp_f),
    LDEXP_INT: (2, lambda a, b: sf.ldexp(a, s32(b))),
    GETEXP: (1, sf.getexp),
    GETMANT: (1, sf.getmant),
    NEG: (1, sf.neg),
    ABS: (1, sf.abs_),
    MOV: (1, sf.mov),
    FROM_I32: (1, lambda a: sf.from_int32(s32(a))),
    FROM_U32: (1, sf.from_uint32),
    TO_I32: (1, lambda a: sf.to_int32(a) & 0xFFFFFFFF),
}


@pytest.fixture(scope="module")
def harness(_session_w3, artifacts):  # type: ignore[no-untyped-def]
    from verde_chain.chain.deploy import deploy_contract

    return deploy_contract(_session_w3, artifacts, "SoftFloatHarness")


def run_packed(harness, op: int, cases: list[list[int]]) -> list[int]:  # type: ignore[no-untyped-def]
    out: list[int] = []
    for i in range(0, len(cases), BATCH):
        chunk = cases[i : i + BATCH]
        data = b"".join(v.to_bytes(4, "big") for case in chunk for v in case)
        raw = harness.functions.runPacked(op, data).call({"gas": CALL_GAS})
        assert len(raw) == 4 * len(chunk)
        out.extend(int.from_bytes(raw[j : j + 4], "big") for j in range(0, len(raw), 4))
    return out


# ------------------------------------------------------------------------- TestFloat vectors


@pytest.mark.parametrize("name", sorted(VECTOR_OPS))
def test_testfloat_vectors_on_chain(harness, name: str) -> None:  # type: ignore[no-untyped-def]
    op, arity = VECTOR_OPS[name]
    rows = load_vectors(name, missing=pytest.skip)
    results = run_packed(harness, op, [r[:arity] for r in rows])
    assert len(results) == len(rows)
    mismatches = []
    for row, got in zip(rows, results):
        if not result_matches(name, got, row[arity]):
            mismatches.append((" ".join(f"{v:08X}" for v in row), f"{got:08X}"))
    assert not mismatches, f"{name}: {len(mismatches)}/{len(rows)} differ on chain, first: {mismatches[:5]}"


# ------------------------------------------------------------------------- Solidity vs twin

triples = st.lists(st.tuples(f32_st, f32_st, f32_st), min_size=1, max_size=64)


@pytest.mark.parametrize("op", sorted(TWIN))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=triples)
def test_solidity_matches_twin(harness, op: int, cases: list[tuple[int, int, int]]) -> None:  # type: ignore[no-untyped-def]
    arity, twin = TWIN[op]
    a = [t[0] for t in cases]
    b = [t[1] for t in cases] if arity >= 2 else []
    c = [t[2] for t in cases] if arity == 3 else []
    got = harness.functions.run(op, a, b, c).call()
    expected = [twin(*t[:arity]) for t in cases]
    assert list(got) == expected


def test_random_bulk_matches_twin(harness) -> None:  # type: ignore[no-untyped-def]
    """20k uniformly random bit patterns per arithmetic op (a deterministic seed), packed."""
    rnd = random.Random(0x5EED)
    for op in (ADD, SUB, MUL, DIV, FMA, SQRT, RINT, FLOOR, LDEXP_INT, GETEXP, GETMANT, TO_I32):
        arity, twin = TWIN[op]
        cases = [[rnd.getrandbits(32) for _ in range(arity)] for _ in range(20_000)]
        if op == LDEXP_INT:
            cases = [[x, rnd.randint(-300, 300) & 0xFFFFFFFF] for x, _ in cases]
        got = run_packed(harness, op, cases)
        bad = [(case, g) for case, g in zip(cases, got) if g != twin(*case)]
        assert not bad, f"op {op}: {len(bad)} differ, first {bad[:3]}"


# ------------------------------------------------------------------------- reverts


def test_unknown_op_reverts_with_its_code(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as ei:
        call(harness.functions.run(77, [1], [], []), artifacts)
    assert ei.value.name == "UnknownOp" and ei.value.fields["op"] == 77


def test_operand_length_mismatch_reverts(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as ei:
        call(harness.functions.run(ADD, [1, 2, 3], [1], []), artifacts)
    assert ei.value.name == "OperandLengthMismatch"
    assert ei.value.fields == {"op": ADD, "aLength": 3, "otherLength": 1}


def test_measure_returns_the_op_result_and_reverts_on_unknown_ops(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    """measure shares run's dispatch: same result for every op, same UnknownOp for a bad code."""
    a, b, c = 0x3FC00000, 0xC0200001, 0x00400000  # 1.5, -2.5000002, a subnormal
    for op, (arity, twin) in TWIN.items():
        r, gas = harness.functions.measure(op, a, b, c).call()
        assert r == twin(*(a, b, c)[:arity]), op
        assert 0 < gas < 10_000
    with pytest.raises(ContractRevert) as ei:
        call(harness.functions.measure(77, 0, 0, 0), artifacts)
    assert ei.value.name == "UnknownOp" and ei.value.fields["op"] == 77


def test_packed_length_must_be_whole_cases(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as ei:
        call(harness.functions.runPacked(FMA, b"\x00" * 16), artifacts)
    assert ei.value.name == "PackedLengthNotMultiple"
    assert ei.value.fields == {"op": FMA, "length": 16, "caseBytes": 12}


# ------------------------------------------------------------------------- gas goals

GAS_GOALS = {ADD: 1_500, MUL: 1_200, FMA: 2_500, DIV: 2_500, SQRT: 5_000}


def _normal_operands(rnd: random.Random, n: int, positive: bool = False) -> list[int]:
    return [
        ((0 if positive else rnd.getrandbits(1)) << 31) | (rnd.randint(64, 190) << 23) | rnd.getrandbits(23)
        for _ in range(n)
    ]


def test_gas_goals(harness) -> None:  # type: ignore[no-untyped-def]
    """Mean gas per op over random normal operands, window overhead subtracted (brief A goals)."""
    rnd = random.Random(7)
    n = 200
    _, overhead = harness.functions.measure(NOP, 0, 0, 0).call()
    for op, goal in GAS_GOALS.items():
        a = _normal_operands(rnd, n, positive=op == SQRT)
        b, c = _normal_operands(rnd, n), _normal_operands(rnd, n)
        total, worst = harness.functions.measureBatch(op, a, b, c).call()
        mean = total / n - overhead
        assert mean <= goal, f"op {op}: mean {mean:.0f} gas > goal {goal}"
        assert worst - overhead <= goal * 1.2, f"op {op}: worst {worst - overhead} gas"

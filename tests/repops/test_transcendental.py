"""Transcendental RepOps programs: structure, exact edge cases, and accuracy against MPFR.

The accuracy bounds asserted here are the ones documented in docs/repops-transcendentals.md
(measured there on ~1.2M samples per function by scripts/accuracy_transcendentals.py); this file
checks a smaller sample so it stays fast.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verde_chain.errors import RepOpsError
from verde_chain.repops import ssa
from verde_chain.repops import transcendental as T
from verde_chain.repops.isa import CANONICAL_NAN, NUM_REGS, Instr, Op, decode_program, encode_program

ROOT = Path(__file__).resolve().parents[2]


def _load_accuracy() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "accuracy_transcendentals", ROOT / "scripts" / "accuracy_transcendentals.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


ACC = _load_accuracy()

# Documented bounds (max error in ulps; the *_grad ones are the mixed error, see the docs): the
# full measurement's maximum plus a small margin, since these samples are different points.
BOUNDS = {
    "exp": 1.0,
    "log": 1.0,
    "tanh": 1.0,
    "erf": 1.1,
    "sigmoid": 1.0,
    "gelu_erf": 1.25,
    "gelu_tanh": 1.0,
    "rsqrt": 1.6,
    "gelu_erf_grad": 1.5,
    "gelu_tanh_grad": 1.5,
    "sin": 1.0,  # for |x| <= 2^17 (the documented domain)
    "cos": 1.0,
    "sin_grad": 1.0,
    "cos_grad": 1.0,
    "pow": 4.0,  # grows with |y log x| (3.4 ulp measured at y log x ~ -41)
}
REQUIRED = {"exp", "log", "tanh", "erf", "sigmoid", "gelu_erf", "gelu_tanh", "gelu_erf_grad",
            "gelu_tanh_grad", "sin", "cos", "sin_grad", "cos_grad", "pow"}

INF, NINF, NZ, ONE = 0x7F800000, 0xFF800000, 0x80000000, 0x3F800000


def f32(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def run1(name: str, x: float, g: float = 1.0) -> int:
    xb = np.array([x if isinstance(x, int) else f32(x)], dtype=np.uint32)
    if T.N_INPUTS[name] == 2:
        return int(T.evaluate(name, xb, np.array([f32(g)], dtype=np.uint32))[0])
    return int(T.evaluate(name, xb)[0])


# ------------------------------------------------------------------------------- structure

def test_all_required_programs_exist() -> None:
    assert REQUIRED <= set(T.PROGRAMS)
    assert set(BOUNDS) == set(T.PROGRAMS)


@pytest.mark.parametrize("name", sorted(T.PROGRAMS))
def test_program_is_straight_line_and_encodable(name: str) -> None:
    prog = T.PROGRAMS[name]
    assert prog and all(isinstance(i, Instr) for i in prog)
    forbidden = {Op.LOAD, Op.LOADIDX, Op.COORD}
    assert not any(i.op in forbidden for i in prog)
    for i in prog:
        assert max(i.dst, i.a, i.b) < NUM_REGS
        if i.op in (Op.FMA, Op.SELECT):
            assert i.c < NUM_REGS
        if i.op == Op.CONST:  # constants are plain binary32 bit patterns, never NaN payloads
            assert (i.imm & 0x7FFFFFFF) <= 0x7F800000 or i.imm == CANONICAL_NAN
    # every register read is either an input or written before
    written = set(range(T.N_INPUTS[name]))
    for i in prog:
        reads = [] if i.op == Op.CONST else [i.a]
        if i.op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.LT, Op.EQ, Op.LDEXP):
            reads.append(i.b)
        if i.op in (Op.FMA, Op.SELECT):
            reads += [i.b, i.c]
        assert set(reads) <= written, (name, i)
        written.add(i.dst)
    assert decode_program(encode_program(prog)) == prog


def test_unknown_function_and_wrong_arity() -> None:
    with pytest.raises(T.UnknownFunction):
        T.evaluate("cosh", np.zeros(1, np.uint32))
    with pytest.raises(RepOpsError):
        T.evaluate("gelu_erf_grad", np.zeros(1, np.uint32))


def test_builder_rejects_inexact_constant() -> None:
    b = ssa.ProgramBuilder(1)
    with pytest.raises(ssa.ProgramBuildError):
        b.k(0.1)


def test_evaluate_is_vectorised_over_shapes() -> None:
    x = np.array([[f32(0.5), f32(-1.0)], [f32(2.0), f32(3.0)]], dtype=np.uint32)
    out = T.evaluate("exp", x)
    assert out.shape == (2, 2) and out.dtype == np.uint32
    assert out[0, 0] == T.evaluate("exp", x[0, :1])[0]


# ------------------------------------------------------------------------------- exact edges

EDGE = [
    # exp: +-0 -> 1, overflow threshold, underflow to subnormal/zero, infinities
    ("exp", 0.0, ONE), ("exp", -0.0, ONE), ("exp", INF, INF), ("exp", NINF, 0),
    ("exp", 89.0, INF), ("exp", 88.72284698486328, INF), ("exp", -104.0, 0), ("exp", 1, ONE),
    ("exp", 88.72283172607422, 0x7F7FFF84),  # largest x with a finite result
    # log: zeros, negative, inf, one, subnormal minimum
    ("log", 0.0, NINF), ("log", -0.0, NINF), ("log", -1.0, CANONICAL_NAN), ("log", INF, INF),
    ("log", NINF, CANONICAL_NAN), ("log", 1.0, 0), ("log", 1, f32(-103.27893)),
    # tanh: signed zeros, saturation to exactly +-1, infinities, subnormals
    ("tanh", 0.0, 0), ("tanh", -0.0, NZ), ("tanh", 9.1, ONE), ("tanh", -9.1, 0xBF800000),
    ("tanh", INF, ONE), ("tanh", NINF, 0xBF800000), ("tanh", 1, 1), ("tanh", 0x80000001, 0x80000001),
    # erf: same, saturation from 3.92
    ("erf", 0.0, 0), ("erf", -0.0, NZ), ("erf", 3.92, ONE), ("erf", -3.92, 0xBF800000),
    ("erf", INF, ONE), ("erf", NINF, 0xBF800000), ("erf", 1, 1),
    # sigmoid
    ("sigmoid", 0.0, 0x3F000000), ("sigmoid", -0.0, 0x3F000000), ("sigmoid", INF, ONE),
    ("sigmoid", NINF, 0), ("sigmoid", 17.0, 0x3F7FFFFF), ("sigmoid", 17.5, ONE), ("sigmoid", -104.0, 0),
    # gelus: signs of zero, identity for large x, -0 in the far negative tail
    ("gelu_erf", 0.0, 0), ("gelu_erf", -0.0, NZ), ("gelu_erf", INF, INF),
    ("gelu_erf", NINF, NZ), ("gelu_erf", 10.0, f32(10.0)), ("gelu_erf", -20.0, NZ),
    ("gelu_tanh", 0.0, 0), ("gelu_tanh", -0.0, NZ), ("gelu_tanh", INF, INF),
    ("gelu_tanh", NINF, NZ), ("gelu_tanh", 10.0, f32(10.0)), ("gelu_tanh", -20.0, NZ),
    ("gelu_tanh", 3e38, f32(3e38)),
    # gradients: 1/2 at 0, 1 and 0 at the ends
    ("gelu_erf_grad", 0.0, 0x3F000000), ("gelu_erf_grad", INF, ONE), ("gelu_erf_grad", 20.0, ONE),
    ("gelu_tanh_grad", 0.0, 0x3F000000), ("gelu_tanh_grad", INF, ONE),
    ("gelu_tanh_grad", 30.0, ONE),
    # rsqrt
    ("rsqrt", 0.0, INF), ("rsqrt", -0.0, INF), ("rsqrt", -1.0, CANONICAL_NAN), ("rsqrt", INF, 0),
    ("rsqrt", 4.0, 0x3F000000),
    # sin / cos: signed zero, exact 1 at 0, NaN at the infinities
    ("sin", 0.0, 0), ("sin", -0.0, NZ), ("cos", 0.0, ONE), ("cos", -0.0, ONE),
    ("sin", INF, CANONICAL_NAN), ("cos", NINF, CANONICAL_NAN), ("sin", 2.0**-140, 0x00000200),
]

# pow(x, y): the C99 special cases (x, y, want)
POW_EDGE = [
    (2.0, 0.0, ONE), (math.nan, 0.0, ONE), (math.nan, -0.0, ONE), (1.0, math.nan, ONE), (1.0, math.inf, ONE),
    (-1.0, math.inf, ONE), (-1.0, -math.inf, ONE), (math.nan, 1.0, CANONICAL_NAN), (2.0, math.nan, CANONICAL_NAN),
    (-2.0, 0.5, CANONICAL_NAN), (-2.0, 3.0, f32(-8.0)), (-2.0, 2.0, f32(4.0)), (-2.0, -1.0, f32(-0.5)),
    (0.0, -1.0, INF), (-0.0, -1.0, NINF), (-0.0, -2.0, INF), (0.0, 3.0, 0), (-0.0, 3.0, NZ), (-0.0, 0.5, 0),
    (0.5, math.inf, 0), (0.5, -math.inf, INF), (2.0, math.inf, INF), (2.0, -math.inf, 0),
    (math.inf, -1.0, 0), (math.inf, 0.5, INF), (-math.inf, 3.0, NINF), (-math.inf, 2.0, INF),
    (-math.inf, -3.0, NZ), (-math.inf, -2.5, 0), (-math.inf, 0.5, INF), (4.0, 0.5, f32(2.0)),
    (2.0, 10.0, f32(1024.0)), (2.0, 128.0, INF), (2.0, -149.0, 1), (2.0, -150.0, 0),
]


@pytest.mark.parametrize(("x", "y", "want"), POW_EDGE)
def test_pow_special_cases_exact(x: float, y: float, want: int) -> None:
    got = int(T.evaluate("pow", np.array([f32(x)], np.uint32), np.array([f32(y)], np.uint32))[0])
    assert got == want, f"pow({x!r}, {y!r}) = {got:#010x}, want {want:#010x}"


@pytest.mark.parametrize(("name", "x", "want"), EDGE)
def test_edge_cases_exact(name: str, x: float, want: int) -> None:
    got = run1(name, x)
    assert got == want, f"{name}({x!r}) = {got:#010x}, want {want:#010x}"


@pytest.mark.parametrize("name", sorted(T.PROGRAMS))
def test_nan_in_canonical_nan_out(name: str) -> None:
    assert run1(name, CANONICAL_NAN) == CANONICAL_NAN
    assert run1(name, 0xFFC12345) == CANONICAL_NAN  # payload and sign are not propagated
    if T.N_INPUTS[name] == 2:  # (pow(1, NaN) = 1 by C99, so pow is checked at x = 2)
        assert run1(name, 2.0 if name in T.BINARY_PROGRAMS else 1.0, math.nan) == CANONICAL_NAN


def test_negative_underflow_thresholds() -> None:
    # exp and sigmoid round into the subnormal range once, never flush
    assert run1("exp", -103.0) != 0 and run1("exp", -103.0) < 0x00800000
    assert run1("sigmoid", -100.0) == run1("exp", -100.0)
    # gelu tails stay negative and relatively accurate deep into the subnormals
    for name in ("gelu_erf", "gelu_tanh"):
        v = run1(name, -9.0)
        assert v & NZ and (v & 0x7FFFFFFF) != 0


@pytest.mark.parametrize("name", ["tanh", "erf", "gelu_erf", "gelu_tanh", "sigmoid"])
def test_monotone_on_a_fine_grid(name: str) -> None:
    # a property the polynomial/branch joins could break: checked across every join point
    lo = -6.0 if name.startswith("gelu") else -10.0
    xs = np.linspace(-0.7 if name.startswith("gelu") else lo, 10.0, 200001).astype(np.float32)
    ys = T.evaluate(name, xs.view(np.uint32)).view(np.float32)
    assert np.all(np.diff(ys.astype(np.float64)) >= 0), name


# ------------------------------------------------------------------------------- accuracy

@pytest.mark.parametrize("name", sorted(T.PROGRAMS))
def test_accuracy_sample_within_documented_bound(name: str) -> None:
    spec = ACC.BY_NAME[name]
    x = ACC.samples(spec, step=2**32 // 3000 + 1, n_random=4000, seed=7)
    errs, _ = ACC.measure(name, x)
    worst = int(np.argmax(errs))
    assert errs[worst] <= BOUNDS[name], (
        f"{name}: {errs[worst]:.3f} ulp at x={float(x.view(np.float32)[worst])!r}"
    )


@pytest.mark.parametrize("name", ["gelu_erf_grad", "gelu_tanh_grad"])
def test_grad_scales_with_upstream_gradient(name: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-8, 4, 3000).astype(np.float32).view(np.uint32)
    g = rng.uniform(-4, 4, 3000).astype(np.float32).view(np.uint32)
    errs, _ = ACC.measure(name, x, g)
    assert errs.max() <= BOUNDS[name]
    # g = 1 and g = 2 differ by exactly a factor 2 (the product with g is exact scaling)
    ones = np.full(3000, ONE, np.uint32)
    twos = np.full(3000, 0x40000000, np.uint32)
    a = T.evaluate(name, x, ones).view(np.float32)
    b = T.evaluate(name, x, twos).view(np.float32)
    normal = np.abs(a) > 2e-38
    assert np.array_equal(b[normal], 2 * a[normal])


finite_in = st.floats(min_value=-120.0, max_value=120.0, width=32, allow_subnormal=True)


@settings(max_examples=150, deadline=None)
@given(x=finite_in, name=st.sampled_from(sorted(T.PROGRAMS)))
def test_accuracy_hypothesis(x: float, name: str) -> None:
    xb = np.array([f32(x)], dtype=np.uint32)
    errs, _ = ACC.measure(name, xb)
    assert errs[0] <= BOUNDS[name], (name, x, errs[0])


# ------------------------------------------------------------------------------- other executors

def test_programs_are_deterministic_builds() -> None:
    for name, build in T.PROGRAM_BUILDERS.items():
        assert encode_program(build()) == encode_program(T.PROGRAMS[name]), name


@pytest.mark.parametrize("name", sorted(T.PROGRAMS))
def test_scalar_softfloat_twin_agrees_bit_for_bit(name: str) -> None:
    """Run every program one instruction at a time through the integer SoftFloat twin of the
    on-chain ScalarVM: the chain would compute exactly what the vectorised reference computes."""
    softfloat = pytest.importorskip("verde_chain.vm.softfloat")
    rng = np.random.default_rng(11)
    lo, hi = ACC.BY_NAME[name].interval
    xs = [f32(v) for v in rng.uniform(lo, hi, 24)]
    xs += [0, NZ, 1, 0x80000001, INF, NINF, CANONICAL_NAN, f32(0.5), f32(-0.5), f32(4.0), f32(-13.3)]
    gs = [f32(v) for v in rng.uniform(-3, 3, len(xs))]
    want = (
        T.evaluate(name, np.array(xs, np.uint32))
        if T.N_INPUTS[name] == 1
        else T.evaluate(name, np.array(xs, np.uint32), np.array(gs, np.uint32))
    )
    for x, g, w in zip(xs, gs, want, strict=True):
        regs = [0] * NUM_REGS
        regs[0], regs[1] = x, (g if T.N_INPUTS[name] == 2 else 0)
        for ins in T.PROGRAMS[name]:
            if ins.op == Op.CONST:
                regs[ins.dst] = ins.imm
            else:
                regs[ins.dst] = softfloat.execute(int(ins.op), regs[ins.a], regs[ins.b], regs[ins.c])
        assert regs[0] == int(w), (name, hex(x), hex(regs[0]), hex(int(w)))

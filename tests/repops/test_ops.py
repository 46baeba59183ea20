"""Every operator: scalar spec == numpy reference bit for bit (edge-biased Hypothesis), exact
checks where IEEE fixes the answer, and torch agreement (forward and backward) within the
tolerances stated in docs/repops-spec.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import verde_chain.repops as rops
from verde_chain.errors import RepOpsError
from verde_chain.repops import library, program
from verde_chain.repops.isa import CANONICAL_NAN

F32 = np.float32
MAXF = float(np.finfo(F32).max)
EDGES = [
    0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -7.0,
    2.0**-149, -(2.0**-149), 2.0**-126, -(2.0**-126), float(np.nextafter(F32(2.0**-126), F32(0))),
    MAXF, -MAXF, float("inf"), float("-inf"), float("nan"),
    1.0 + 2.0**-23, 1.0 - 2.0**-24, 16777216.0, 16777217.0, 88.7, -103.9, 1e-20, 1e20,
]
f32s = st.one_of(
    st.sampled_from(EDGES),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.floats(-8, 8, width=32),
)
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


def arr(draw: st.DrawFn, shape: tuple[int, ...], elems: st.SearchStrategy[float] = f32s) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    return np.array(draw(st.lists(elems, min_size=n, max_size=n)), F32).reshape(shape)


def ints(draw: st.DrawFn, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    return arr(draw, shape, st.integers(lo, hi).map(float))


def assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    ab, bb = a.reshape(-1).view(np.uint32), b.reshape(-1).view(np.uint32)
    bad = np.nonzero(ab != bb)[0]
    assert bad.size == 0, f"{bad.size} differing elements, first {bad[:5]}: {ab[bad[:5]]} vs {bb[bad[:5]]}"


def _canonical_nans(x: np.ndarray) -> bool:
    b = x.reshape(-1).view(np.uint32)
    return bool((b[np.isnan(x.reshape(-1))] == CANONICAL_NAN).all())


def spec_vs_reference(comp: library.Composite, ins: list[np.ndarray]) -> list[np.ndarray]:
    slow = comp.run(ins, program.run_spec)
    fast = comp.run(ins)
    assert len(slow) == len(fast)
    for s, f in zip(slow, fast):
        assert_bits_equal(s, f)
        # Arithmetic always yields the canonical NaN; only pure data movement (LOAD, SELECT) can
        # pass a non-canonical input NaN through, so with canonical inputs every NaN is canonical.
        if all(_canonical_nans(x) for x in ins):
            assert _canonical_nans(f), comp.label
    return fast


# ------------------------------------------------------------------ case table

Case = Callable[[st.DrawFn], tuple[library.Composite, list[np.ndarray]]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def deco(f: Case) -> Case:
        CASES[name] = f
        return f

    return deco


def bcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Random small output shape and two inputs that broadcast to it (dims set to 1 / dropped)."""
    out = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))

    def derive() -> tuple[int, ...]:
        drop = draw(st.integers(0, len(out)))
        return tuple(1 if draw(st.booleans()) else d for d in out[drop:])

    return derive(), derive()


for _op in library.BINARY_CODE:
    def _bin(draw: st.DrawFn, op: str = _op) -> tuple[library.Composite, list[np.ndarray]]:
        sa, sb = bcast_pair(draw)
        return library.single(library.binary(op, sa, sb), [sa, sb]), [arr(draw, sa), arr(draw, sb)]
    CASES[f"binary_{_op}"] = _bin

for _u in list(library.UNARY_CODE) + list(library.TRANSCENDENTAL_UNARY):
    def _un(draw: st.DrawFn, name: str = _u) -> tuple[library.Composite, list[np.ndarray]]:
        return library.single(library.map_unary(name, (6,))), [arr(draw, (6,))]
    CASES[f"unary_{_u}"] = _un

for _g in list(library.GRAD_CODE) + list(library.TRANSCENDENTAL_GRAD):
    def _gr(draw: st.DrawFn, name: str = _g) -> tuple[library.Composite, list[np.ndarray]]:
        return library.single(library.unary_grad(name, (5,))), [arr(draw, (5,)), arr(draw, (5,))]
    CASES[f"grad_{_g}"] = _gr


@case("affine_clip_leaky_where")
def _misc(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    b = library.Builder("misc", (2, 3), (2, 3), (3,))
    x, y, c = b.inputs()
    a = b.node(library.map_affine((2, 3), 0.5, -3.0), x)
    cl = b.node(library.clip((2, 3), -1.0, 2.0), y)
    lr = b.node(library.leaky_relu((2, 3), 0.01), x)
    w = b.node(library.where((3,), (2, 3), (2, 3)), c, a, cl)
    return b.build(a, cl, lr, w), [arr(draw, (2, 3)), arr(draw, (2, 3)), arr(draw, (3,))]


REDUCE_AXES = [((2, 3, 4), (2,)), ((2, 3, 4), (1, 2)), ((2, 3, 4), (0,)), ((2, 3, 4), (0, 2)),
               ((2, 3, 4), None), ((3, 1, 2), (1,)), ((4,), (0,))]


def shape_axes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    if draw(st.booleans()):
        return shape, None
    axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    return shape, tuple(axes)


for _k in library.REDUCE_KINDS + ("log_sum", "log_sum_exp"):
    def _red(draw: st.DrawFn, kind: str = _k) -> tuple[library.Composite, list[np.ndarray]]:
        shape, axes = draw(st.sampled_from(REDUCE_AXES)) if draw(st.booleans()) else shape_axes(draw)
        return library.reduce_composite(kind, shape, axes, draw(st.booleans())), [arr(draw, shape)]
    CASES[f"reduce_{_k}"] = _red


@case("reduce_dot")
def _rdot(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape, axes = draw(st.sampled_from([s for s in REDUCE_AXES if s[1] != (0, 2)]))
    b = library.Builder("dot", shape, shape)
    return b.build(b.reduce_dot(0, 1, axes, draw(st.booleans()), draw(st.booleans()))), [arr(draw, shape), arr(draw, shape)]


MATMUL_SHAPES = [((2, 3), (3, 4), False, False), ((3, 2), (3, 4), True, False), ((2, 3), (4, 3), False, True),
                 ((3, 2), (4, 3), True, True), ((2, 2, 3), (3, 2), False, False), ((2, 1, 2, 3), (3, 3, 2), False, False),
                 ((3,), (3, 2), False, False), ((2, 3), (3,), False, False), ((3,), (3,), False, False),
                 ((2, 1), (1, 3), False, False)]


@case("matmul")
def _mm(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    if draw(st.booleans()):
        sa, sb, ta, tb = draw(st.sampled_from(MATMUL_SHAPES))
    else:  # random batched/broadcast shapes with random transposes
        m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
        ba, bb = bcast_pair(draw)
        ta, tb = draw(st.booleans()), draw(st.booleans())
        # keep the trailing (right-aligned) batch dims: suffixes of broadcastable shapes broadcast
        sa = ba[-2:] + ((k, m) if ta else (m, k))
        sb = bb[-2:] + ((n, k) if tb else (k, n))
    return library.single(library.matmul(sa, sb, ta, tb), [sa, sb]), [arr(draw, sa), arr(draw, sb)]


@case("gemm")
def _gemm(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    cs = draw(st.sampled_from([(2, 4), (4,), (1,), None]))
    alpha, beta = draw(st.sampled_from([(1.0, 1.0), (0.5, 2.0), (0.25, 0.0)]))
    desc = library.gemm((3, 2), (4, 3), cs, alpha, beta, True, True)
    ins = [arr(draw, (3, 2)), arr(draw, (4, 3))] + ([arr(draw, cs)] if cs is not None and beta != 0.0 else [])
    return library.single(desc, [x.shape for x in ins]), ins


@case("data_movement")
def _move(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    b = library.Builder("move", (2, 3, 4))
    x = 0
    t = b.node(library.transpose((2, 3, 4), (2, 0, 1)), x)
    r = b.node(library.reshape((4, 2, 3), (6, 4)), t)
    e = b.node(library.expand((2, 1, 4), (3, 2, 5, 4)), b.node(library.slice_((2, 3, 4), (0, 2, 0), (2, 3, 4), (1, 1, 1)), x))
    s = b.node(library.slice_((2, 3, 4), (1, 2, 3), (-3, -4, -5), (-1, -1, -2)), x)
    return b.build(t, r, e, s), [arr(draw, (2, 3, 4))]


@case("gather")
def _gather(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    axis = draw(st.sampled_from([0, 1, -1]))
    ds = (4, 3)
    idx = arr(draw, (2, 2), st.one_of(st.integers(-5, 5).map(float), st.sampled_from([0.5, float("nan"), -0.0, float("inf")])))
    return library.single(library.gather(ds, (2, 2), axis), [ds, (2, 2)]), [arr(draw, ds), idx]


@case("gather_elements")
def _gather_el(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    axis = draw(st.sampled_from([0, 1, -1]))
    idx = arr(draw, (2, 3), st.one_of(st.integers(-4, 4).map(float), st.sampled_from([0.5, float("nan"), -0.0])))
    return library.single(library.gather_elements((3, 3), (2, 3), axis), [(3, 3), (2, 3)]), [arr(draw, (3, 3)), idx]


@case("scatter_add")
def _scatter(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    idx = ints(draw, (5,), -1, 4)
    return library.single(library.scatter_add(5, (2,), 4), [(5, 2), (5,)]), [arr(draw, (5, 2)), idx]


@case("concat_slice_grad_trilu")
def _lm_movement(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    b = library.Builder("lm_move", (2, 3, 4), (2, 1, 4), (2, 2, 4))
    x, y, z = b.inputs()
    axis = draw(st.sampled_from([1, -2]))
    c = b.node(library.concat([(2, 3, 4), (2, 1, 4), (2, 2, 4)], axis), x, y, z)
    start, end, step = draw(st.sampled_from([((0, 1, 0), (2, 3, 4), (1, 1, 2)), ((1, 2, 3), (-3, -4, -5), (-1, -1, -2)),
                                             ((0, 0, 1), (2, 3, 3), (1, 2, 1))]))
    sl = b.node(library.slice_((2, 3, 4), start, end, step), x)
    back = b.node(library.slice_grad((2, 3, 4), start, end, step), sl)
    k, upper = draw(st.integers(-2, 3)), draw(st.booleans())
    tri = b.node(library.trilu((2, 3, 4), k, upper), x)
    return b.build(c, back, tri), [arr(draw, (2, 3, 4)), arr(draw, (2, 1, 4)), arr(draw, (2, 2, 4))]


@case("write_row")
def _write_row(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    r = ints(draw, (1,), -1, 3)  # -1 and 3 are outside the 3 rows: nothing is written
    return library.single(library.write_row(3, 4), [(3, 4), (4,), (1,)]), [arr(draw, (3, 4)), arr(draw, (4,)), r]


@case("gather_grads")
def _gather_grads(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    axis = draw(st.sampled_from([0, 1, 2]))
    ds = (3, 4, 2)
    js = (2, 3)
    gshape = ds[:axis] + js + ds[axis + 1 :]
    idx = ints(draw, js, 0, ds[axis] - 1)
    b = library.Builder("gather_grads", gshape, js, (3, 2, 2), (3, 2, 2))
    g, i, ge, ie = b.inputs()
    d1 = b.node(library.gather_grad(ds, js, axis), g, i)
    d2 = b.node(library.gather_elements_grad((3, 4, 2), (3, 2, 2), 1), ge, ie)
    return b.build(d1, d2), [arr(draw, gshape), idx, arr(draw, (3, 2, 2)), ints(draw, (3, 2, 2), 0, 3)]


@case("minmax_where_pow_grads")
def _bin_grads(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    sa, sb = bcast_pair(draw)
    out = tuple(int(d) for d in np.broadcast_shapes(sa, sb))
    op, wrt = draw(st.sampled_from(["max", "min"])), draw(st.integers(0, 1))
    expo = draw(st.sampled_from([2.0, 3.0, 0.5, -1.0, -2.0, 0.0, 1.0, 1.5, -0.7]))
    b = library.Builder("bin_grads", sa, sb, out)
    x, y, g = b.inputs()
    mm = b.node(library.minmax_grad(op, sa, sb, wrt), x, y, g)
    wg = b.node(library.where_grad(sa, out, draw(st.sampled_from([1, 2]))), x, g)
    pc = b.node(library.pow_const(sa, expo), x)
    return b.build(mm, wg, pc), [arr(draw, sa), arr(draw, sb), arr(draw, out)]


@case("rms_norm")
def _rms(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape, axis = draw(st.sampled_from([((2, 4), -1), ((2, 2, 3), 1), ((3,), 0)]))
    comp = (library.rms_norm(shape, axis, 1e-6, draw(st.booleans())) if draw(st.booleans())
            else library.rms_norm_backward(shape, axis))
    return comp, [arr(draw, s) for s in comp.in_shapes]


@case("softmax_family")
def _smx(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    which = draw(st.sampled_from(["softmax", "log_softmax", "softmax_backward", "log_softmax_backward"]))
    shape, axis = draw(st.sampled_from([((2, 3), -1), ((2, 3, 2), 1), ((4,), 0)]))
    comp = getattr(library, which)(shape, axis)
    return comp, [arr(draw, s) for s in comp.in_shapes]


@case("layer_norm")
def _ln(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape, axis = draw(st.sampled_from([((2, 4), -1), ((2, 2, 3), 1), ((3,), 0)]))
    comp = library.layer_norm(shape, axis, 1e-5, draw(st.booleans()), draw(st.booleans()))
    return comp, [arr(draw, s) for s in comp.in_shapes]


@case("layer_norm_backward")
def _lnb(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape, axis = draw(st.sampled_from([((2, 4), -1), ((2, 2, 3), 1), ((3,), 0)]))
    comp = library.layer_norm_backward(shape, axis)
    return comp, [arr(draw, s) for s in comp.in_shapes]


@case("cross_entropy")
def _ce(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape = draw(st.sampled_from([(3, 4), (2, 3, 2)]))
    red = draw(st.sampled_from(["mean", "sum", "none"]))
    w = draw(st.booleans())
    ign = draw(st.sampled_from([None, 1, -1]))
    comp = (library.nll_loss if draw(st.booleans()) else library.softmax_cross_entropy)(shape, red, w, ign)
    lab = ints(draw, comp.in_shapes[1], -1, shape[1] - 1)
    ins = [arr(draw, shape), lab] + ([arr(draw, (shape[1],))] if w else [])
    return comp, ins


@case("cross_entropy_backward")
def _ceb(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    shape = draw(st.sampled_from([(3, 4), (2, 3, 2)]))
    red = draw(st.sampled_from(["mean", "sum", "none"]))
    comp = library.softmax_cross_entropy_backward(shape, red)
    return comp, [arr(draw, shape), ints(draw, comp.in_shapes[1], 0, shape[1] - 1), arr(draw, comp.in_shapes[2])]


@case("optimizers")
def _opt(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    which = draw(st.sampled_from(["sgd", "sgd_first", "sgd_nesterov", "adam", "adamw", "onnx_momentum", "onnx_adam"]))
    s = (5,)
    comp = {
        "sgd": lambda: library.sgd(s, 0.1, 0.9, 0.1, 0.01),
        "sgd_first": lambda: library.sgd(s, 0.1, 0.9, 0.0, 0.0, first_step=True),
        "sgd_nesterov": lambda: library.sgd(s, 0.05, 0.8, 0.0, 0.001, nesterov=True),
        "adam": lambda: library.adam(s, 1e-3, 3, weight_decay=0.01),
        "adamw": lambda: library.adam(s, 1e-3, 1, weight_decay=0.1, decoupled=True),
        "onnx_momentum": lambda: library.onnx_momentum(s, 0.1, 1, 0.9, 0.7, 0.01, "nesterov"),
        "onnx_adam": lambda: library.onnx_adam(s, 0.1, 2, 0.9, 0.999, 1e-6, 0.01, 0.02),
    }[which]()
    return comp, [arr(draw, x) for x in comp.in_shapes]


@pytest.mark.parametrize("name", sorted(CASES))
def test_spec_equals_reference(name: str) -> None:
    @FAST
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        comp, ins = CASES[name](data.draw)
        spec_vs_reference(comp, ins)

    run()


# ------------------------------------------------------------------ exact checks (IEEE decides)


def test_elementwise_bitwise_equals_numpy_ieee() -> None:
    r = np.random.default_rng(0)
    a = np.concatenate([r.standard_normal(200), EDGES]).astype(F32)
    b = np.concatenate([r.standard_normal(200) * 1e-3, EDGES[::-1]]).astype(F32)
    from verde_chain.repops import reference

    with np.errstate(all="ignore"):
        for op, f in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide)]:
            got = reference.run(library.binary(op, a.shape, b.shape), [a, b])
            want = f(a, b).astype(F32)
            want[np.isnan(want)] = np.uint32(CANONICAL_NAN).view(F32)
            assert_bits_equal(got, want)
        got = reference.run(library.map_unary("sqrt", a.shape), [a])
        want = np.sqrt(a)
        want[np.isnan(want)] = np.uint32(CANONICAL_NAN).view(F32)
        assert_bits_equal(got, want)


def test_reduction_order_is_fixed() -> None:
    from verde_chain.repops import reference

    # k ascending: (1e8 + 1) - 1e8 + ... depends on order; check the exact sequential value
    x = np.array([1e8, 1.0, -1e8, 1.0], F32)
    got = reference.run(library.reduce("sum", (4,), None, False), [x])
    acc = F32(0)
    acc = x[0]
    for v in x[1:]:
        acc = F32(acc + v)
    assert got.view(np.uint32) == np.array(acc).view(np.uint32)
    # dot product: all -0 products stay -0 (MUL first, then FMA chain)
    z = np.array([-0.0, -0.0, -0.0], F32)
    o = np.array([1.0, 1.0, 1.0], F32)
    got = reference.run(library.matmul((3,), (3,)), [z, o])
    assert got.view(np.uint32) == 0x80000000
    # relu(-0) = +0, relu(NaN) = canonical NaN
    got = reference.run(library.map_unary("relu", (2,)), [np.array([-0.0, np.nan], F32)]).view(np.uint32)
    assert list(got) == [0, CANONICAL_NAN]


def test_scatter_add_matches_sequential_definition() -> None:
    from verde_chain.repops import reference

    r = np.random.default_rng(2)
    g = r.standard_normal((7, 3)).astype(F32)
    idx = np.array([2, 0, 2, 2, 1, 0, 2], F32)
    got = reference.run(library.scatter_add(7, (3,), 4), [g, idx])
    want = np.zeros((4, 3), F32)
    for v in range(4):
        acc = np.where(idx[0] == v, g[0], F32(0))
        for p in range(1, 7):
            acc = (acc + np.where(idx[p] == v, g[p], F32(0))).astype(F32)
        want[v] = acc
    assert_bits_equal(got, want)


def test_write_row_replaces_exactly_one_row() -> None:
    from verde_chain.repops import reference

    r = np.random.default_rng(3)
    buf, row = r.standard_normal((4, 5)).astype(F32), r.standard_normal(5).astype(F32)
    row[1] = np.float32(np.nan)  # bits are moved, not computed
    for t in (-1.0, 0.0, 2.0, 3.0, 4.0, 1.5):
        got = reference.run(library.write_row(4, 5), [buf, row, np.array([t], F32)])
        want = buf.copy()
        if t in (0.0, 2.0, 3.0):
            want[int(t)] = row
        assert_bits_equal(got, want)


# ------------------------------------------------------------------ torch agreement

TOL: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-6}  # single IEEE ops or short chains
TOL_TR: dict[str, Any] = {"rtol": 2e-5, "atol": 1e-6}  # transcendental programs (<= few ulp, see transcendentals doc)
TOL_RED: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-5}  # different summation orders than torch


def _t(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 17 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g) * scale


def test_torch_forward_elementwise_and_linear() -> None:
    a, b = _t(3, 4), _t(4, seed=1)
    for f, tf in [(rops.add, torch.add), (rops.sub, torch.sub), (rops.mul, torch.mul), (rops.div, torch.div),
                  (rops.maximum, torch.maximum), (rops.minimum, torch.minimum)]:
        torch.testing.assert_close(f(a, b), tf(a, b), **TOL)
    for f, tf in [(rops.relu, torch.relu), (rops.neg, torch.neg), (rops.abs, torch.abs), (rops.exp, torch.exp),
                  (rops.tanh, torch.tanh), (rops.erf, torch.erf), (rops.sigmoid, torch.sigmoid)]:
        torch.testing.assert_close(f(a), tf(a), **TOL_TR)
    torch.testing.assert_close(rops.log(a.abs() + 0.1), torch.log(a.abs() + 0.1), **TOL_TR)
    torch.testing.assert_close(rops.sqrt(a.abs()), torch.sqrt(a.abs()), **TOL)
    for approx in ("none", "tanh"):
        torch.testing.assert_close(rops.gelu(a, approx), torch.nn.functional.gelu(a, approximate=approx), **TOL_TR)
    x, w, bias = _t(2, 5, 8), _t(6, 8, seed=2), _t(6, seed=3)
    torch.testing.assert_close(rops.matmul(x, w, trans_b=True), x @ w.T, **TOL_RED)
    torch.testing.assert_close(rops.linear(x[0], w, bias), torch.nn.functional.linear(x[0], w, bias), **TOL_RED)
    torch.testing.assert_close(rops.linear(x, w, bias), torch.nn.functional.linear(x, w, bias), **TOL_RED)
    torch.testing.assert_close(rops.permute(x, (2, 0, 1)), x.permute(2, 0, 1), rtol=0, atol=0)
    torch.testing.assert_close(rops.transpose(x, 0, 2), x.transpose(0, 2), rtol=0, atol=0)
    torch.testing.assert_close(rops.reshape(x, (10, 8)), x.reshape(10, 8), rtol=0, atol=0)


def test_torch_reductions_softmax_layernorm() -> None:
    x = _t(3, 4, 5)
    for dim in (None, 1, (0, 2), (1, 2)):
        kw = {} if dim is None else {"dim": dim}
        torch.testing.assert_close(rops.sum(x, dim), torch.sum(x, **kw), **TOL_RED)
        torch.testing.assert_close(rops.mean(x, dim), torch.mean(x, **kw), **TOL_RED)
        torch.testing.assert_close(rops.amax(x, dim), torch.amax(x, **({} if dim is None else {"dim": dim})), rtol=0, atol=0)
    for dim in (-1, 1, 0):
        torch.testing.assert_close(rops.softmax(x, dim), torch.softmax(x, dim), **TOL_RED)
        torch.testing.assert_close(rops.log_softmax(x, dim), torch.log_softmax(x, dim), **TOL_RED)
    w, b = _t(5, seed=4), _t(5, seed=5)
    torch.testing.assert_close(rops.layer_norm(x, (5,), w, b), torch.nn.functional.layer_norm(x, (5,), w, b), **TOL_RED)
    w2 = _t(4, 5, seed=6)
    torch.testing.assert_close(rops.layer_norm(x, (4, 5), w2, None, 1e-3),
                               torch.nn.functional.layer_norm(x, (4, 5), w2, None, 1e-3), **TOL_RED)


def _grads(fn: Callable[..., torch.Tensor], *xs: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    leaves = [x.clone().requires_grad_(True) for x in xs]
    fn(*leaves).backward(g)
    return [leaf.grad for leaf in leaves]


def test_torch_backward() -> None:
    x, g = _t(3, 5), _t(3, 5, seed=9)
    (dx,) = _grads(torch.relu, x, g=g)
    torch.testing.assert_close(rops.relu_backward(x, g), dx, rtol=0, atol=0)
    for approx in ("none", "tanh"):
        (dx,) = _grads(lambda t, approx=approx: torch.nn.functional.gelu(t, approximate=approx), x, g=g)
        torch.testing.assert_close(rops.gelu_backward(x, g, approx), dx, **TOL_RED)
    for dim in (-1, 0):
        (dx,) = _grads(lambda t, dim=dim: torch.softmax(t, dim), x, g=g)
        torch.testing.assert_close(rops.softmax_backward(torch.softmax(x, dim), g, dim), dx, **TOL_RED)
        (dx,) = _grads(lambda t, dim=dim: torch.log_softmax(t, dim), x, g=g)
        torch.testing.assert_close(rops.log_softmax_backward(torch.log_softmax(x, dim), g, dim), dx, **TOL_RED)
    xs, w, b = _t(2, 3, 6), _t(6, seed=10), _t(6, seed=11)
    gy = _t(2, 3, 6, seed=12)
    dx, dw, db = _grads(lambda a, c, d: torch.nn.functional.layer_norm(a, (6,), c, d), xs, w, b, g=gy)
    _, mean_, istd = rops.layer_norm_with_stats(xs, (6,), w, b)
    rdx, rdw, rdb = rops.layer_norm_backward(xs, w, mean_, istd, gy)
    torch.testing.assert_close(rdx, dx, **TOL_RED)
    torch.testing.assert_close(rdw, dw, **TOL_RED)
    torch.testing.assert_close(rdb, db, **TOL_RED)
    scores, labels = _t(4, 7, seed=13), torch.tensor([0, 6, 3, 3])
    for red in ("mean", "sum"):
        loss = rops.cross_entropy(scores, labels, red)
        torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(scores, labels, reduction=red), **TOL_RED)
        (ds,) = _grads(lambda s, red=red: torch.nn.functional.cross_entropy(s, labels, reduction=red), scores, g=torch.tensor(1.5))
        torch.testing.assert_close(rops.cross_entropy_backward(scores, labels, torch.tensor(1.5), red), ds, **TOL_RED)
    table, idx = _t(6, 4, seed=14), torch.tensor([[1, 5, 1], [0, 1, 2]])
    torch.testing.assert_close(rops.embedding(idx, table), torch.nn.functional.embedding(idx, table), rtol=0, atol=0)
    ge = _t(2, 3, 4, seed=15)
    (dt,) = _grads(lambda t: torch.nn.functional.embedding(idx, t), table, g=ge)
    torch.testing.assert_close(rops.embedding_backward(idx, ge, 6), dt, **TOL)


def test_torch_optimizers() -> None:
    p0, g = _t(10), _t(10, seed=20)
    kws: list[dict[str, Any]] = [{"momentum": 0.0}, {"momentum": 0.9, "weight_decay": 0.01}, {"momentum": 0.9, "nesterov": True},
               {"momentum": 0.9, "dampening": 0.1}]
    for kw in kws:
        p = p0.clone().requires_grad_(True)
        opt = torch.optim.SGD([p], lr=0.1, **kw)
        buf = torch.zeros(10)
        mine = p0.clone()
        for step in range(3):
            p.grad = g * (step + 1)
            opt.step()
            mine, buf = rops.sgd_step(mine, g * (step + 1), buf, 0.1, first_step=step == 0, **kw)
            torch.testing.assert_close(mine, p.detach(), **TOL_RED)
    for decoupled, cls in ((False, torch.optim.Adam), (True, torch.optim.AdamW)):
        p = p0.clone().requires_grad_(True)
        opt = cls([p], lr=1e-2, weight_decay=0.05)
        m, v, mine = torch.zeros(10), torch.zeros(10), p0.clone()
        for t in range(1, 4):
            p.grad = g * t
            opt.step()
            mine, m, v = rops.adam_step(mine, g * t, m, v, 1e-2, t, weight_decay=0.05, decoupled=decoupled)
            torch.testing.assert_close(mine, p.detach(), **TOL_RED)


def test_unsupported_inputs_raise() -> None:
    with pytest.raises(RepOpsError, match="float32"):
        rops.add(torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    with pytest.raises(RepOpsError, match="broadcast"):
        rops.add(torch.ones(2), torch.ones(3))
    with pytest.raises(RepOpsError, match="inner dims"):
        rops.matmul(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(RepOpsError, match="gelu"):
        rops.gelu(torch.ones(2), "fast")
    with pytest.raises(RepOpsError, match="no RepOps backend 'meta'"):
        rops.add(torch.ones(2, device="meta"), torch.ones(2, device="meta"))


def test_package_forwards_exactly_the_torch_api() -> None:
    """``verde_chain.repops.<name>`` forwards the torch API's ``__all__`` (and only it): a function
    added to torch_api.py without its public name in the package would be unreachable there."""
    from verde_chain.repops import torch_api

    public = {rops._ALIASES.get(n, n) for n in rops._TORCH_API}
    assert public == set(torch_api.__all__)
    for name in rops._TORCH_API:
        assert getattr(rops, name) is getattr(torch_api, rops._ALIASES.get(name, name))
    with pytest.raises(AttributeError):
        rops.no_such_op  # noqa: B018


def test_backend_dispatch_hook() -> None:
    calls: list[str] = []

    def fake(desc: program.KernelDesc, ins: list[np.ndarray]) -> np.ndarray | None:
        calls.append(desc.label)
        return None  # not handled: falls back to the reference

    old = rops.backends.BACKENDS["cpu"]
    rops.backends.register("cpu", fake)
    try:
        y = rops.softmax(_t(2, 3))
    finally:
        rops.backends.register("cpu", old)
    assert calls == ["reduce_max", "sub_exp", "reduce_sum", "div"]
    torch.testing.assert_close(y, torch.softmax(_t(2, 3), -1), **TOL_RED)


@case("binary_backward")
def _binb(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    sa, sb = bcast_pair(draw)
    op = draw(st.sampled_from(["add", "sub", "mul", "div"]))
    comp = library.binary_backward(op, sa, sb)
    return comp, [arr(draw, s) for s in comp.in_shapes]


@case("matmul_backward")
def _mmb(draw: st.DrawFn) -> tuple[library.Composite, list[np.ndarray]]:
    sa, sb, ta, tb = draw(st.sampled_from([((2, 3), (3, 4), False, False), ((3, 2), (4, 3), True, True),
                                           ((2, 2, 3), (4, 3), False, True), ((2, 3, 2), (2, 3, 4), True, False)]))
    comp = library.matmul_backward(sa, sb, ta, tb)
    return comp, [arr(draw, s) for s in comp.in_shapes]


def test_torch_linear_backward() -> None:
    for op in ("add", "sub", "mul", "div"):
        a, b, g = _t(2, 3, 4), _t(3, 1, seed=1) + 2.0, _t(2, 3, 4, seed=2)
        da, db = _grads(getattr(torch, op), a, b, g=g)
        rda, rdb = rops.apply(library.binary_backward(op, (2, 3, 4), (3, 1)), a, b, g)
        torch.testing.assert_close(rda, da, **TOL_RED)
        torch.testing.assert_close(rdb, db, **TOL_RED)
    for sa, sb, ta, tb in [((2, 3), (3, 4), False, False), ((3, 2), (4, 3), True, True), ((3, 2), (3, 4), True, False),
                           ((2, 5, 3), (4, 3), False, True), ((2, 3, 2), (2, 3, 4), True, False)]:
        a, b = _t(*sa, seed=3), _t(*sb, seed=4)

        def f(x: torch.Tensor, y: torch.Tensor, ta: bool = ta, tb: bool = tb) -> torch.Tensor:
            return (x.transpose(-1, -2) if ta else x) @ (y.transpose(-1, -2) if tb else y)

        g = _t(*f(a, b).shape, seed=5)
        da, db = _grads(f, a, b, g=g)
        rda, rdb = rops.apply(library.matmul_backward(sa, sb, ta, tb), a, b, g)
        torch.testing.assert_close(rda, da, **TOL_RED)
        torch.testing.assert_close(rdb, db, **TOL_RED)


def test_torch_lm_operators_forward_and_backward() -> None:
    """The operators language models need, against torch (values and autograd)."""
    from verde_chain.repops import reference

    def run(comp: library.Composite, *xs: torch.Tensor) -> list[torch.Tensor]:
        return [torch.from_numpy(o) for o in comp.run([x.numpy() for x in xs])]

    def one(desc: Any, *xs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(reference.run(desc, [x.numpy().reshape(-1) for x in xs]).reshape(desc.out_shape))

    x, y = _t(3, 5), _t(5, seed=1)
    g = _t(3, 5, seed=2)
    exact = {"rtol": 0, "atol": 0}
    # sin / cos and their gradients, pow with constant and tensor exponents
    for name, f in (("sin", torch.sin), ("cos", torch.cos)):
        torch.testing.assert_close(one(library.map_unary(name, (3, 5)), x * 7), f(x * 7), **TOL_TR)
        (dx,) = _grads(f, x, g=g)
        torch.testing.assert_close(one(library.unary_grad(f"{name}_grad", (3, 5)), x, g), dx, **TOL_TR)
    for c in (2.0, 3.0, 0.5, -1.0, 1.7):
        base = x.abs() + 0.1 if c in (0.5, 1.7) else x
        torch.testing.assert_close(one(library.pow_const((3, 5), c), base), torch.pow(base, c), **TOL_TR)
    torch.testing.assert_close(one(library.binary("pow", (3, 5), (5,)), x.abs(), y), torch.pow(x.abs(), y), **TOL_TR)
    # comparisons, logic and isnan as 0.0 / 1.0
    a = torch.tensor([0.0, 1.0, float("nan"), -2.0])
    b = torch.tensor([0.0, 2.0, float("nan"), -2.0])
    torch.testing.assert_close(one(library.binary("ne", (4,), (4,)), a, b), (a != b).float(), **exact)
    torch.testing.assert_close(one(library.map_unary("isnan", (4,)), a), torch.isnan(a).float(), **exact)
    p, q = torch.tensor([0.0, 1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0, 1.0, 1.0])
    for op, f in (("and", torch.logical_and), ("or", torch.logical_or), ("xor", torch.logical_xor)):
        torch.testing.assert_close(one(library.binary(op, (4,), (4,)), p, q), f(p, q).float(), **exact)
    torch.testing.assert_close(one(library.map_unary("not", (4,)), p), torch.logical_not(p).float(), **exact)
    # max / min gradients (ties split as torch does), where's gradients
    xt = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    yt = torch.tensor([2.0, 2.0, 2.0])
    gt = _t(2, 3, seed=3)
    for op, f in (("max", torch.maximum), ("min", torch.minimum)):
        da, db = _grads(f, xt, yt, g=gt)
        torch.testing.assert_close(one(library.minmax_grad(op, (2, 3), (3,), 0), xt, yt, gt), da, **exact)
        full_db = one(library.minmax_grad(op, (2, 3), (3,), 1), xt, yt, gt)
        torch.testing.assert_close(full_db.sum(0), db, **TOL)
    cond = torch.tensor([1.0, 0.0, 1.0])
    dxw, dyw = _grads(lambda u, v: torch.where(cond.bool(), u, v), xt, yt.expand(2, 3).clone(), g=gt)
    torch.testing.assert_close(one(library.where_grad((3,), (2, 3), 1), cond, gt), dxw, **exact)
    torch.testing.assert_close(one(library.where_grad((3,), (2, 3), 2), cond, gt), dyw, **exact)
    # concat, slice and its gradient, trilu
    u, v = _t(2, 3, 4, seed=4), _t(2, 2, 4, seed=5)
    torch.testing.assert_close(one(library.concat([(2, 3, 4), (2, 2, 4)], 1), u, v), torch.cat([u, v], 1), **exact)
    (du,) = _grads(lambda t: t[:, 1:, ::2], u, g=_t(2, 2, 2, seed=6))
    torch.testing.assert_close(one(library.slice_grad((2, 3, 4), (0, 1, 0), (2, 3, 4), (1, 1, 2)), _t(2, 2, 2, seed=6)),
                               du, **exact)
    for k in (-1, 0, 2):
        torch.testing.assert_close(one(library.trilu((2, 3, 4), k, True), u), torch.triu(u, k), **exact)
        torch.testing.assert_close(one(library.trilu((2, 3, 4), k, False), u), torch.tril(u, k), **exact)
    # gather on a middle axis and gather_elements, forward and backward
    data, idx = _t(3, 4, 2, seed=7), torch.tensor([[3, 0, 3], [1, 1, 2]])
    want = torch.index_select(data, 1, idx.reshape(-1)).reshape(3, 2, 3, 2)
    torch.testing.assert_close(one(library.gather((3, 4, 2), (2, 3), 1), data, idx.float()), want, **exact)
    gg = _t(3, 2, 3, 2, seed=8)
    (dd,) = _grads(lambda t: torch.index_select(t, 1, idx.reshape(-1)).reshape(3, 2, 3, 2), data, g=gg)
    torch.testing.assert_close(one(library.gather_grad((3, 4, 2), (2, 3), 1), gg, idx.float()), dd, **TOL)
    eidx = torch.tensor([[[0, 1], [3, 3]], [[2, 2], [1, 0]], [[0, 0], [0, 0]]])
    ge = _t(3, 2, 2, seed=9)
    (de,) = _grads(lambda t: torch.gather(t, 1, eidx), data, g=ge)
    torch.testing.assert_close(one(library.gather_elements_grad((3, 4, 2), (3, 2, 2), 1), ge, eidx.float()), de, **TOL)
    # RMSNorm as Llama writes it, forward and backward
    h, w, gy = _t(2, 3, 8, seed=10), _t(8, seed=11), _t(2, 3, 8, seed=12)

    def llama_rms(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return s * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6))

    yr, inv = run(library.rms_norm((2, 3, 8), -1, 1e-6), h, w)
    torch.testing.assert_close(yr, llama_rms(h, w), **TOL_RED)
    dh, dw = _grads(llama_rms, h, w, g=gy)
    rdh, rdw = run(library.rms_norm_backward((2, 3, 8), -1), h, w, inv, gy)
    torch.testing.assert_close(rdh, dh, **TOL_RED)
    torch.testing.assert_close(rdw, dw, **TOL_RED)

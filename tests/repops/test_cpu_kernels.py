"""RepOps C++ CPU kernels: bitwise equal across ISAs, threads and tiles, and to an exact reference.

The reference here is written independently of the kernels: numpy, vectorised over output
elements, k serial. fma is emulated exactly (float64 product is exact for binary32 inputs;
TwoSum + round-to-odd makes the float64 sum round correctly to binary32), and that emulation is
itself checked against Berkeley SoftFloat (softfloatpy). The kernels are also compared to
``reference.run`` of the operator library's KernelDescs.
"""

from __future__ import annotations

import itertools
import time
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.threads import THREAD_COUNTS, as_bits, engaged, run_engaged
from verde_chain.errors import RepOpsError
from verde_chain.repops import library, reference
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.codes import BinOp
from verde_chain.repops.edges import edge_floats

CANON = np.uint32(0x7FC00000)

ISAS = [pytest.param(isa, id=isa) for isa in cpu_ext.ISAS]


def need(isa: str) -> None:
    if not cpu_ext.cpu_supports(isa):
        pytest.skip(f"CPU lacks {isa}")


@pytest.fixture(scope="module", autouse=True)
def _need_compiler() -> None:
    # The kernels are compiled at first use; without a C++ compiler there is nothing to test.
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the RepOps CPU kernels")


@pytest.fixture(scope="module", autouse=True)
def _fp_env() -> None:
    # The reference is numpy in this thread: it must not run under FTZ/DAZ.
    torch.set_flush_denormal(False)


# --------------------------------------------------------------------------------------------
# Exact reference
# --------------------------------------------------------------------------------------------


def bits(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.numpy()
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def canon(x: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).copy()
    b[np.isnan(x)] = CANON
    return b.view(np.float32)


def ref_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a*b + c rounded once to binary32 (elementwise, float32 arrays)."""
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)  # exact: 24+24 bits
        z = c.astype(np.float64)
        s = p + z
        v = s - p
        err = (p - (s - v)) + (z - v)  # p + z == s + err exactly (finite s)
        even = (s.view(np.uint64) & np.uint64(1)) == 0
        fix = np.isfinite(s) & (err != 0) & even
        # Round to odd: the exact value lies strictly between s and its neighbour towards err,
        # and exactly one of the two is odd; odd rounding then rounds correctly to 24 bits.
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., M, K) @ (..., K, N) with acc = a0*b0, then acc = fma(a_k, b_k, acc)."""
    a3, b3 = np.broadcast_arrays(a[..., :, :, None], b[..., None, :, :])  # (..., M, K, N)
    with np.errstate(all="ignore"):
        acc = (a3[..., 0, :].astype(np.float64) * b3[..., 0, :].astype(np.float64)).astype(np.float32)
    for k in range(1, a.shape[-1]):
        acc = ref_fma(a3[..., k, :], b3[..., k, :], acc)
    return canon(acc)


def ref_reduce(kind: str, x: np.ndarray, axis: int) -> np.ndarray:
    xs = np.moveaxis(x, axis, -1)
    acc = xs[..., 0].copy()
    with np.errstate(all="ignore"):
        for k in range(1, xs.shape[-1]):
            v = xs[..., k]
            if kind in ("sum", "mean"):
                acc = (acc + v).astype(np.float32)
            else:
                nan = np.isnan(acc) | np.isnan(v)
                eq = acc == v
                signs = (bits(acc) & bits(v)) if kind == "max" else (bits(acc) | bits(v))
                pick = np.where(acc > v, acc, v) if kind == "max" else np.where(acc < v, acc, v)
                acc = np.where(eq, signs.view(np.float32), pick).astype(np.float32)
                acc[nan] = np.float32(np.nan)
        if kind == "mean":
            acc = (acc / np.float32(xs.shape[-1])).astype(np.float32)
    return canon(acc)


def ref_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op in ("max", "min"):
            a, b = np.broadcast_arrays(a, b)
            r = ref_reduce(op, np.stack([a, b], axis=-1), -1)
        else:
            ufuncs: dict[str, np.ufunc] = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
            r = ufuncs[op](a, b)
    return canon(r.astype(np.float32))


EDGE = edge_floats()


def edge_matrix(shape: tuple[int, ...], seed: int, edge_fraction: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < edge_fraction
    x[mask] = rng.choice(EDGE, size=int(mask.sum()))
    return x


def subnormal_matrix(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Tiny values whose products and sums stay subnormal or cross the normal boundary."""
    rng = np.random.default_rng(seed)
    mant = rng.integers(-(2**23) + 1, 2**23, size=shape).astype(np.float64)
    return (mant * 2.0**-149 * 2.0 ** rng.integers(0, 4, size=shape)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# The reference itself
# --------------------------------------------------------------------------------------------


def test_reference_fma_matches_softfloat() -> None:
    sf = pytest.importorskip("softfloatpy")
    rng = np.random.default_rng(5)
    n = 3000
    a = edge_matrix((n,), 1, 0.2)
    b = edge_matrix((n,), 2, 0.2)
    c = edge_matrix((n,), 3, 0.2)
    # Cancellation-heavy triples: c close to -a*b.
    with np.errstate(all="ignore"):
        c[:500] = -(a[:500].astype(np.float64) * b[:500]).astype(np.float32)
    c[500:1000] = subnormal_matrix((500,), 4)
    a[1000:1200] = subnormal_matrix((200,), 6)
    b[1000:1200] = rng.uniform(0.5, 2, 200).astype(np.float32)
    got = canon(ref_fma(a, b, c)).view(np.uint32)

    def f(v: np.float32) -> object:
        return sf.Float32.from_bytes(np.array([v], dtype=">f4").tobytes())

    for i in range(n):
        r = sf.f32_mul_add(f(a[i]), f(b[i]), f(c[i]))
        want = int.from_bytes(r.to_bytes(), "big")
        if (want & 0x7FFFFFFF) > 0x7F800000:
            want = int(CANON)
        assert got[i] == want, (i, a[i], b[i], c[i])


# --------------------------------------------------------------------------------------------
# MatMul
# --------------------------------------------------------------------------------------------


def assert_same_bits(got: torch.Tensor | np.ndarray, want: np.ndarray) -> None:
    g = bits(got)
    w = bits(want)
    assert g.shape == w.shape
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    assert bad.size == 0, (
        f"{bad.size} elements differ, first at {bad[:5]}: {g.reshape(-1)[bad[:5]]} vs {w.reshape(-1)[bad[:5]]}"
    )


MM_SHAPES = [(1, 1, 1), (1, 5, 1), (3, 1, 4), (7, 13, 5), (13, 64, 33), (25, 40, 70), (50, 300, 37)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,k,n", MM_SHAPES)
def test_matmul_matches_exact_reference(isa: str, m: int, k: int, n: int) -> None:
    need(isa)
    a = edge_matrix((m, k), m * 1000 + k, 0.1)
    b = edge_matrix((k, n), n, 0.1)
    want = ref_matmul(a, b)
    for threads in (1, 2):
        assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=threads), want)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_tiles_and_threads_do_not_change_bits(isa: str) -> None:
    need(isa)
    m, k, n = 61, 403, 75  # > 2^20 FMAs, so threads are really used
    a = edge_matrix((m, k), 11, 0.05)
    b = edge_matrix((k, n), 12, 0.05)
    want = ref_matmul(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    # kc = 1 and 7: the accumulator is carried through memory between every K block.
    for tile, threads in itertools.product([None, (1, 1, 1), (12, 7, 32), (24, 64, 16), (600, 1000, 600)], (1, 2, 3)):
        assert_same_bits(cpu_ext.matmul(ta, tb, isa=isa, threads=threads, tile=tile), want)
    # A stored transposed (the weight-gradient layout) is packed along its contiguous rows.
    at = torch.from_numpy(np.ascontiguousarray(a.T))
    for tile, threads in itertools.product([None, (1, 1, 1), (12, 7, 32), (600, 1000, 600)], (1, 2)):
        assert_same_bits(cpu_ext.matmul(at, tb, trans_a=True, isa=isa, threads=threads, tile=tile), want)


def test_big_results_serve_the_next_call_and_never_while_alive() -> None:
    """A kernel's result of 1 MiB or more (bindings.cpp result_tensor) goes back to a pool when
    the caller drops it, and the next result of its size is written there (no fresh pages to
    fault in): same memory, its own bits. A result still alive, as a tensor or as a numpy view
    of one, is never handed out: its values stay. Switched off (set_result_recycling), no
    result comes from the pool, and the bits are the same."""
    isa = cpu_ext.best_isa()
    ext = cpu_ext.extension(isa)
    a, b = (torch.from_numpy(edge_matrix(s, 40 + i, 0.05)) for i, s in enumerate([(512, 64), (64, 512)]))
    ext.release_idle_results()

    def served() -> int:
        return int(ext.result_recycling_counts()[1])

    first = cpu_ext.matmul(a, b, isa=isa, threads=2)  # 512 x 512 floats: 1 MiB
    want, ptr = bits(first).copy(), first.data_ptr()
    kept = cpu_ext.matmul(a, -b, isa=isa, threads=2).numpy()  # alive as a numpy view only
    kept_bits = bits(kept).copy()
    del first
    n = served()
    again = cpu_ext.matmul(a, b, isa=isa, threads=2)
    assert served() == n + 1 and again.data_ptr() == ptr
    assert (bits(again) == want).all()
    other = cpu_ext.matmul(a, -b, isa=isa, threads=2)  # the pool is empty again: fresh memory
    assert served() == n + 1 and other.data_ptr() not in (ptr, kept.ctypes.data)
    assert (bits(kept) == kept_bits).all() and (bits(other) == kept_bits).all()
    small = cpu_ext.matmul(a[:100], b, isa=isa, threads=2)  # 200 KiB: torch's allocator
    del small
    cpu_ext.matmul(a[:100], b, isa=isa, threads=2)
    assert served() == n + 1
    before = ext.set_result_recycling(False)
    try:
        del again
        third = cpu_ext.matmul(a, b, isa=isa, threads=2)
        assert served() == n + 1 and (bits(third) == want).all()
    finally:
        ext.set_result_recycling(before)
    assert ext.result_recycling_counts()[0] >= 512 * 512 * 4  # `again` went back, idle


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_row_tails_of_every_height(isa: str) -> None:
    """The micro-kernel computes a tail of mr rows as 4, 8 or MR rows and a tail of nr columns as
    one vector where they fit in one (gemm_tile.h): every tail height 1..12 (MR is 12, 6 or 4),
    N past the small path's limit with column tails of 5, 13, 18 and 22 (one or two vectors of
    16 or 8 lanes), and K in three blocks (the accumulators resumed from C), against the exact
    chain."""
    need(isa)
    k = 37
    for n in (133, 141, 146, 150):
        b = edge_matrix((k, n), n, 0.05)
        for m in range(24, 37):
            a = edge_matrix((m, k), m, 0.05)
            want = ref_matmul(a, b)
            for tile in (None, (600, 16, 600)):
                got = cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=1, tile=tile)
                assert_same_bits(got, want)


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (True, True)])
def test_matmul_transposes(trans_a: bool, trans_b: bool) -> None:
    m, k, n = 17, 29, 21
    a = edge_matrix((m, k), 21, 0.1)
    b = edge_matrix((k, n), 22, 0.1)
    at = np.ascontiguousarray(a.T) if trans_a else a
    bt = np.ascontiguousarray(b.T) if trans_b else b
    want = ref_matmul(a, b)
    for isa in cpu_ext.available_isas():
        got = cpu_ext.matmul(torch.from_numpy(at), torch.from_numpy(bt), trans_a, trans_b, isa=isa, threads=2)
        assert_same_bits(got, want)


def test_matmul_batched_broadcast_and_vectors() -> None:
    a = edge_matrix((2, 1, 5, 9), 31, 0.1)
    b = edge_matrix((3, 9, 4), 32, 0.1)
    want = ref_matmul(a, b)
    for isa in cpu_ext.available_isas():
        assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa), want)
    v = edge_matrix((9,), 33, 0.1)
    assert_same_bits(cpu_ext.matmul(torch.from_numpy(v), torch.from_numpy(b)), ref_matmul(v[None, :], b)[..., 0, :])
    assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(v)), ref_matmul(a, v[:, None])[..., 0])
    # Non-contiguous inputs (sliced views) are read through their strides.
    big = edge_matrix((20, 30), 34, 0.1)
    view = torch.from_numpy(big)[2:15:2, 1:28:3]
    assert_same_bits(cpu_ext.matmul(view, torch.from_numpy(b[0])), ref_matmul(view.numpy(), b[0]))


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_edge_values_nan_inf_and_cancellation(isa: str) -> None:
    need(isa)
    a = edge_matrix((14, 40), 41, 0.6)
    b = edge_matrix((40, 35), 42, 0.6)
    # Exact cancellation: row 0 . col 0 = x - x + y - y ... ends in +0 or -0 depending on order.
    a[0, :] = 1.0
    b[:, 0] = np.repeat(np.array([3.0, -3.0], dtype=np.float32), 20)
    a[1, :] = -0.0
    b[:, 1] = 0.0
    want = ref_matmul(a, b)
    assert np.isnan(want).any() and np.isinf(want).any()
    assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=2), want)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_subnormals_survive_ftz(isa: str) -> None:
    need(isa)
    a = subnormal_matrix((20, 30), 51)
    b = np.random.default_rng(52).uniform(-2, 2, (30, 40)).astype(np.float32)
    want = ref_matmul(a, b)
    assert (np.abs(want[want != 0]) < 1.1754944e-38).any(), "test must produce subnormal results"
    torch.set_flush_denormal(True)
    try:
        got = cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=2)
        mx = cpu_ext.worker_mxcsr(isa)
    finally:
        torch.set_flush_denormal(False)
    assert_same_bits(got, want)
    if mx >= 0:
        assert mx & 0x8040 == 0, f"FTZ/DAZ still on in the worker: MXCSR=0x{mx:04x}"


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 40),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**31),
    threads=st.integers(1, 3),
    raw=st.booleans(),
)
def test_matmul_property_all_isas(m: int, k: int, n: int, seed: int, threads: int, raw: bool) -> None:
    rng = np.random.default_rng(seed)
    if raw:  # any bit pattern: NaN payloads, signalling NaNs, subnormals, infinities
        a = rng.integers(0, 2**32, (m, k), dtype=np.uint32).view(np.float32)
        b = rng.integers(0, 2**32, (k, n), dtype=np.uint32).view(np.float32)
    else:
        a, b = edge_matrix((m, k), seed, 0.2), edge_matrix((k, n), seed + 1, 0.2)
    want = ref_matmul(a, b)
    for isa in cpu_ext.available_isas():
        assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=threads), want)


def test_batched_threads_take_whole_matrices() -> None:
    # 8 (batch, column block) pairs >= 2 x threads: each thread packs its own B blocks.
    a = edge_matrix((8, 64, 130), 141, 0.02)
    b = edge_matrix((8, 130, 70), 142, 0.02)
    want = ref_matmul(a, b)
    for isa in cpu_ext.available_isas():
        for threads in (1, 2, 4):
            assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=threads), want)


def test_isas_agree_on_a_larger_problem() -> None:
    a = torch.randn(257, 511, generator=torch.Generator().manual_seed(1))
    b = torch.randn(511, 300, generator=torch.Generator().manual_seed(2))
    outs = [cpu_ext.matmul(a, b, isa=isa, threads=2) for isa in cpu_ext.available_isas()]
    want = ref_matmul(a.numpy(), b.numpy())
    for out in outs:
        assert_same_bits(out, want)


# --------------------------------------------------------------------------------------------
# Reductions and elementwise ops
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reductions_match_reference(isa: str, kind: str) -> None:
    need(isa)
    x = edge_matrix((37, 70, 5), 61, 0.15)
    x[3, :, 1] = np.float32(1e30) * np.where(np.arange(70) % 2 == 0, 1, -1)  # cancellation
    x[4, :, 2] = -0.0
    x[5, ::2, 3] = 0.0
    x[5, 1::2, 3] = -0.0
    fn = {"sum": cpu_ext.reduce_sum, "mean": cpu_ext.reduce_mean, "max": cpu_ext.reduce_max, "min": cpu_ext.reduce_min}[kind]
    t = torch.from_numpy(x)
    for axis in range(3):
        want = ref_reduce(kind, x, axis)
        for threads in (1, 2):
            assert_same_bits(fn(t, axis, isa=isa, threads=threads), want)
    # Two axes: k runs row-major over (0, 2), i.e. like reducing the flattened pair.
    merged = ref_reduce(kind, np.transpose(x, (1, 0, 2)).reshape(70, -1), 1)
    assert_same_bits(fn(t, (0, 2), isa=isa), merged)
    assert_same_bits(fn(t, (2, 0), keepdim=True, isa=isa), merged.reshape(1, 70, 1))
    assert_same_bits(fn(t, None, isa=isa), ref_reduce(kind, x.reshape(-1), 0))


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    seed=st.integers(0, 2**31),
    kind=st.sampled_from(["sum", "mean", "max", "min"]),
    axis_pick=st.integers(0, 2),
)
def test_reductions_property_raw_bits(shape: list[int], seed: int, kind: str, axis_pick: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32)
    mask = rng.random(shape) < 0.5  # repeated values: ties between equal values and between ±0
    x[mask] = rng.choice(np.array([0.0, -0.0, rng.standard_normal()], dtype=np.float32), size=int(mask.sum()))
    axis = axis_pick % len(shape)
    want = ref_reduce(kind, x, axis)
    fn = getattr(cpu_ext, f"reduce_{kind}")
    for isa in cpu_ext.available_isas():
        assert_same_bits(fn(torch.from_numpy(x), axis, isa=isa, threads=2), want)


def test_reduction_large_uses_threads_and_vector_path() -> None:
    x = edge_matrix((300, 1000), 71, 0.01)
    t = torch.from_numpy(x)
    for axis in (0, 1):
        want = ref_reduce("sum", x, axis)
        for isa in cpu_ext.available_isas():
            assert_same_bits(cpu_ext.reduce_sum(t, axis, isa=isa, threads=2), want)


@pytest.mark.parametrize("op", sorted(op.name.lower() for op in BinOp))
def test_binary_ops_broadcast(op: str) -> None:
    a = edge_matrix((4, 1, 33), 81, 0.4)
    b = edge_matrix((5, 33), 82, 0.4)
    b[0, :] = -0.0
    b[1, :] = 0.0
    want = ref_binary(op, a, b)
    for isa in cpu_ext.available_isas():
        for threads in (1, 2):
            assert_same_bits(cpu_ext.binary(op, torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=threads), want)


def test_binary_large_threaded_subnormal() -> None:
    a = subnormal_matrix((400_000,), 91)
    b = np.random.default_rng(92).uniform(-1, 1, 400_000).astype(np.float32)
    for op in ("add", "mul", "div"):
        want = ref_binary(op, a, b)
        for isa in cpu_ext.available_isas():
            assert_same_bits(cpu_ext.binary(op, torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=2), want)


# --------------------------------------------------------------------------------------------
# Against the operator library's KernelDescs run on the vectorised reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_shape,b_shape,ta,tb",
    [
        ((6, 9), (9, 5), False, False),
        ((9, 6), (5, 9), True, True),
        ((2, 4, 7), (7, 3), False, False),
        ((7,), (7, 4), False, False),
        ((2, 4, 7), (7,), False, False),
        ((4, 7), (1, 4), True, True),
        ((7,), (4, 7), False, True),
    ],
)
def test_matmul_matches_library_reference(a_shape: tuple[int, ...], b_shape: tuple[int, ...], ta: bool, tb: bool) -> None:
    a = edge_matrix(a_shape, 101, 0.2)
    b = edge_matrix(b_shape, 102, 0.2)
    desc = library.matmul(a_shape, b_shape, ta, tb)
    want = reference.run(desc, [a, b])
    for isa in cpu_ext.available_isas():
        assert_same_bits(cpu_ext.matmul(torch.from_numpy(a), torch.from_numpy(b), ta, tb, isa=isa), want)


@pytest.mark.parametrize(
    "c_shape,alpha,beta,ta,tb",
    [(None, 1.0, 1.0, False, False), ((5,), 0.5, 1.0, False, True), ((6, 5), 1.0, -2.0, True, False),
     ((6, 1), 0.1, 0.3, True, True), ((6, 5), 2.0, 0.0, False, False)],
)  # fmt: skip
def test_gemm_matches_library_reference(
    c_shape: tuple[int, ...] | None, alpha: float, beta: float, ta: bool, tb: bool
) -> None:
    a = edge_matrix((9, 6) if ta else (6, 9), 131, 0.2)
    b = edge_matrix((5, 9) if tb else (9, 5), 132, 0.2)
    inputs = [a, b]
    c = None
    if c_shape is not None:
        c = edge_matrix(c_shape, 133, 0.2)
        if beta != 0.0:
            inputs.append(c)
    desc = library.gemm(a.shape, b.shape, c_shape, alpha, beta, ta, tb)
    want = reference.run(desc, inputs)
    tc = None if c is None else torch.from_numpy(c)
    for isa in cpu_ext.available_isas():
        got = cpu_ext.gemm(torch.from_numpy(a), torch.from_numpy(b), tc, alpha, beta, ta, tb, isa=isa)
        assert_same_bits(got, want)


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reductions_match_library_reference(kind: str) -> None:
    x = edge_matrix((6, 11, 4), 111, 0.2)
    for axes in [(1,), (0,), (1, 2), None]:
        desc = library.reduce(kind, x.shape, axes, keepdims=False)
        want = reference.run(desc, [x])
        fn = getattr(cpu_ext, f"reduce_{kind}")
        for isa in cpu_ext.available_isas():
            assert_same_bits(fn(torch.from_numpy(x), axes, isa=isa), want)


@pytest.mark.parametrize("op", sorted(op.name.lower() for op in BinOp))
def test_binary_matches_library_reference(op: str) -> None:
    a = edge_matrix((3, 1, 8), 121, 0.4)
    b = edge_matrix((4, 8), 122, 0.4)
    want = reference.run(library.binary(op, a.shape, b.shape), [a, b])
    for isa in cpu_ext.available_isas():
        assert_same_bits(cpu_ext.binary(op, torch.from_numpy(a), torch.from_numpy(b), isa=isa), want)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_errors() -> None:
    f = torch.zeros(3, 4)
    with pytest.raises(RepOpsError, match="inner dims"):
        cpu_ext.matmul(f, f)
    with pytest.raises(RepOpsError, match="K = 0"):
        cpu_ext.matmul(torch.zeros(3, 0), torch.zeros(0, 2))
    with pytest.raises(RepOpsError, match="float32"):
        cpu_ext.matmul(f.double(), f.T.double())
    with pytest.raises(RepOpsError, match="unknown op"):
        cpu_ext.binary("pow", f, f)
    with pytest.raises(RepOpsError, match="empty reduction"):
        cpu_ext.reduce_sum(torch.zeros(3, 0), 1)
    with pytest.raises(RepOpsError, match="unknown ISA"):
        cpu_ext.cpu_supports("neon")
    with pytest.raises(RepOpsError, match="threads"):
        cpu_ext.matmul(f, f.T, threads=0)


# --------------------------------------------------------------------------------------------
# Threads: the same bits at 1, 2, 3, 4 and 7 threads, and more than one thread really worked
# --------------------------------------------------------------------------------------------

# (name, a shape, b shape): the blocked path on one matrix and on a few (threads share packed
# B and take 2-D tiles, one B for all entries packed once; square-256 is the size issue #14
# found running on one thread at 2), on
# many (batch, column block) pairs (threads take whole pairs when there are >= 2 per thread,
# or when half as wide column blocks give them two: gemm.cpp GEMM_HALF_NC_ROWS),
# and the small path (whole batch entries, or row blocks of entries after packing B).
THREADED_GEMMS = [
    ("one-matrix", (301, 257), (257, 203)),
    ("square-256", (256, 256), (256, 256)),
    ("few-matrices", (3, 150, 140), (3, 140, 170)),
    ("few-matrices-one-b", (3, 150, 140), (140, 170)),
    ("few-matrices-one-b-a-gapped", (3, 160, 140), (140, 170)),
    ("batch-pairs", (16, 70, 130), (16, 130, 140)),
    # 200 rows, 800 columns: two column blocks of 512 at 2 threads, so gemm() halves them (the
    # pairs path, four blocks of 256, the last 32 wide); at 3+ threads still the tiles
    ("half-column-blocks", (200, 70), (70, 800)),
    ("small", (8, 1024, 16), (8, 16, 16)),
    # at most 64 rows against a B with contiguous rows: B read in place (gemm.cpp gemm_b_in_place).
    # A classifier's weight gradient dlogits^T @ h (A a transposed view, 10 rows: one 12-row panel
    # computing 10; 1000 columns: a last strip 8 wide, packed); 64 rows (5 whole panels and 4 rows);
    # a batch of 5-row entries, each with its own B; two 20-row entries against one B (folded
    # into 40 rows first)
    ("b-in-place-transposed-a", (300, 10), (300, 1000)),
    ("b-in-place-64-rows", (64, 130), (130, 600)),
    ("b-in-place-batch", (3, 5, 200), (3, 200, 300)),
    ("b-in-place-batch-one-b", (2, 20, 130), (130, 300)),
    # a classifier's logits, N within one vector past the small GEMMs' work bound: rows computed
    # directly 12 at a time (gemm_small), then 4 and one
    ("narrow-n", (305, 200), (200, 10)),
    # a tiny K (a classifier's dlogits @ W): one column block as wide as C (gemm.cpp GEMM_TINY_K),
    # its last panel 28 wide; 12-row blocks on the pairs path at one thread, tiles at more
    ("tiny-k", (300, 10), (10, 700)),
    # A transposed past the few-row paths (a weight gradient x^T @ dy): 203 rows, 16 whole 12-row
    # panels copied a k row at a time and a last one of 11 rows; K = 300 crosses a K block
    ("transposed-a", (300, 203), (300, 150)),
    # a C past gemm_tile.h's GEMM_FETCH_C_MIN_FLOATS (each next tile's C fetched ahead): ragged
    # last row and column tiles (10 rows, 6 columns); K = 260 crosses a K block, so tiles reload C
    ("c-fetched-ahead", (1030, 260), (260, 1030)),
    # at least 2048 rows at several threads: column blocks of 1024, not 512 (gemm.cpp
    # GEMM_WIDE_NC_ROWS), so 1100 columns are two blocks (the last 76 wide) on the 2-D tiles
    ("tall-wide-column-blocks", (2050, 40), (40, 1100)),
]
# A's entries with rows between them that are not A's (a view of the first 150 of 160): not
# one taller matrix (gemm.cpp folds entries that follow each other row after row), so the
# batch runs against its one B as a batch (gemm_tiles' shared B).
A_VIEWS = {"few-matrices-one-b-a-gapped": lambda a: a[:, :150, :], "b-in-place-transposed-a": lambda a: a.T,
           "transposed-a": lambda a: a.T}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name,a_shape,b_shape", THREADED_GEMMS, ids=[g[0] for g in THREADED_GEMMS])
def test_gemm_paths_on_every_thread_count(isa: str, name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    need(isa)
    a = A_VIEWS.get(name, lambda a: a)(edge_matrix(a_shape, 151, 0.02))
    b = edge_matrix(b_shape, 152, 0.02)
    want = bits(ref_matmul(a, b))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for threads in THREAD_COUNTS:
        got = run_engaged(isa, threads, partial(cpu_ext.matmul, ta, tb, isa=isa, threads=threads))
        np.testing.assert_array_equal(got, want, err_msg=f"{name}, {threads} threads")


# A thread's share of at least 2^30 FMAs, N cut evenly among the threads: the pairs path on those
# blocks (gemm.cpp even_column_blocks). 1100 x 1500 x 2048: at 2 threads one block of 1024 a
# thread (AVX-512; 1024 for AVX2's and the scalar's panels too), at 3 one of 704 (the last 640),
# at 4 and 7 threads too little a thread (the tiles). Against one thread (the pairs path whose
# bits test_gemm_paths_on_every_thread_count checks against the reference): a reference of 3.4e9
# FMAs would take minutes.
@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
def test_gemm_on_column_blocks_cut_evenly_among_threads_keeps_one_threads_bits(isa: str) -> None:
    need(isa)
    a = torch.from_numpy(edge_matrix((1100, 1500), 153, 0.02))
    b = torch.from_numpy(edge_matrix((1500, 2048), 154, 0.02))
    want = run_engaged(isa, 1, partial(cpu_ext.matmul, a, b, isa=isa, threads=1))
    for threads in THREAD_COUNTS[1:]:
        got = run_engaged(isa, threads, partial(cpu_ext.matmul, a, b, isa=isa, threads=threads))
        np.testing.assert_array_equal(got, want, err_msg=f"{threads} threads")


# One matrix of more than 768 rows whose N fits one column block of the 1-thread width (nc to
# 2 nc) with at least 384 rows a thread: the pairs path in row bands, one a thread (gemm.cpp
# GEMM_BAND_MIN_ROWS). At the tile (48, 64, 64), N = 100 is one block of 128 wide, 2,700 rows give
# every count up to 7 its bands (the last 324 rows at 7) and K = 150 three K blocks, the last
# ragged. One item a thread: a thread done with its band splits off part of a late one's rows
# (gemm.cpp RowRegions).
BAND_GEMM = ((2700, 150), (150, 100))
BAND_TILE = (48, 64, 64)


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_in_row_bands_one_a_thread_keeps_the_reference_bits(isa: str) -> None:
    need(isa)
    a, b = edge_matrix(BAND_GEMM[0], 155, 0.02), edge_matrix(BAND_GEMM[1], 156, 0.02)
    want = bits(ref_matmul(a, b))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for threads in THREAD_COUNTS:
        got = run_engaged(isa, threads, partial(cpu_ext.matmul, ta, tb, isa=isa, threads=threads, tile=BAND_TILE))
        np.testing.assert_array_equal(got, want, err_msg=f"{threads} threads")


@pytest.mark.parametrize("isa", ISAS)
def test_a_late_threads_row_band_is_taken_over_by_the_other_with_the_same_bits(isa: str) -> None:
    """The thread that takes band 1 waits 300 ms first (a test knob of the extension): the other
    one, done with band 0 long before, splits off and runs some of band 1's row blocks, packing
    their B blocks itself."""
    need(isa)
    a, b = edge_matrix(BAND_GEMM[0], 157, 0.02), edge_matrix(BAND_GEMM[1], 158, 0.02)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = as_bits(cpu_ext.matmul(ta, tb, isa=isa, threads=1, tile=BAND_TILE))
    ext = cpu_ext.extension(isa)
    before = ext.gemm_helped_blocks()
    previous = ext.set_gemm_late_item_us(300_000)
    try:
        got = as_bits(cpu_ext.matmul(ta, tb, isa=isa, threads=2, tile=BAND_TILE))
    finally:
        ext.set_gemm_late_item_us(previous)
    helped = ext.gemm_helped_blocks() - before
    assert helped > 0, "no row block of the late thread's band was run by the other thread"
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="microseconds"):
        ext.set_gemm_late_item_us(-1)


# Shapes whose threads pack B into buffers of their own at several threads, kept from call to
# call: gemm_tiles (one matrix; a batch whose entries have B's of their own) and gemm_small's
# row blocks (N within one vector; a batch of a few entries, each with its own B).
OWN_B_GEMMS = [((301, 257), (257, 203)), ((3, 150, 140), (3, 140, 170)), ((305, 200), (200, 10)),
               ((3, 120, 64), (3, 64, 32))]


@pytest.mark.parametrize("isa", ISAS)
def test_threads_pack_each_calls_own_b_at_several_threads(isa: str) -> None:
    """A thread's own packed B holds this call's (entry, column block) only: calls of the same
    shapes one after the other, B changed in place between them (same address), each result
    its own B's."""
    need(isa)
    for n, (a_shape, b_shape) in enumerate(OWN_B_GEMMS):
        a = torch.from_numpy(edge_matrix(a_shape, 181 + n, 0.02))
        b = torch.from_numpy(edge_matrix(b_shape, 191 + n, 0.02))
        for threads in (2, 3, 4):
            for round_ in range(3):
                b.copy_(torch.from_numpy(edge_matrix(b_shape, 200 + 100 * n + 10 * threads + round_, 0.02)))
                got = run_engaged(isa, threads, partial(cpu_ext.matmul, a, b, isa=isa, threads=threads))
                np.testing.assert_array_equal(got, bits(ref_matmul(a.numpy(), b.numpy())),
                                              err_msg=f"{a_shape} @ {b_shape}, {threads} threads, round {round_}")


# GEMMs of at most 128 rows (gemm.cpp GEMM_FEW_ROWS: tiles cut by columns only, one a thread)
# with B stored transposed, as a weight is used as W^T (pack_b's k blocks of 64: K past a block
# and not a multiple of it, a ragged last panel), one weight shared by a batch of two as the tiny
# Llama's projections (2 x 16 tokens) have it, 32, 100 (a ragged last micro-tile) and 128 rows
# of one matrix, and 64-row entries against one weight that do not fold (past
# GEMM_FEW_ROWS_ONE_B: the pairs path at one thread, the tiles at more).
FEW_ROW_GEMMS = [
    ("few-rows-shared-weight", (2, 16, 517), (259, 517)),
    ("few-rows-shared-weight-a-gapped", (2, 20, 517), (259, 517)),
    ("few-rows", (32, 130), (300, 130)),
    ("few-rows-100", (100, 67), (300, 67)),
    ("few-rows-128", (128, 300), (520, 300)),
    ("few-rows-64-shared-weight-a-gapped", (2, 70, 300), (259, 300)),
    # W read in place, transposed (gemm.cpp gemm_w_rows: one vector < rows <= the micro-tile's
    # width): 17 rows (AVX-512: one lane past a vector) against 125 rows of W (a last group of
    # 5); entries of 24 rows that do not fold (x^T packed per entry); 12 rows (AVX2), 3 (scalar)
    ("w-rows-17", (17, 300), (125, 300)),
    ("w-rows-batch-a-gapped", (2, 30, 300), (80, 300)),
    ("w-rows-12", (12, 300), (150, 300)),
    ("w-rows-3", (3, 1000), (200, 1000)),
]
FEW_ROW_A_VIEWS = {  # as A_VIEWS
    "few-rows-shared-weight-a-gapped": lambda a: a[:, 2:18, :],
    "few-rows-64-shared-weight-a-gapped": lambda a: a[:, 3:67, :],
    "w-rows-batch-a-gapped": lambda a: a[:, 3:27, :],
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name,a_shape,b_shape", FEW_ROW_GEMMS, ids=[g[0] for g in FEW_ROW_GEMMS])
def test_few_row_gemms_with_b_transposed_on_every_thread_count(
    isa: str, name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    need(isa)
    a = FEW_ROW_A_VIEWS.get(name, lambda a: a)(edge_matrix(a_shape, 171, 0.02))
    w = edge_matrix(b_shape, 172, 0.02)
    want = bits(ref_matmul(a, np.ascontiguousarray(w.T)))
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    for threads in THREAD_COUNTS:
        got = run_engaged(isa, threads, partial(cpu_ext.matmul, ta, tw, False, True, isa=isa, threads=threads))
        np.testing.assert_array_equal(got, want, err_msg=f"{name}, {threads} threads")


@pytest.mark.parametrize("isa", ISAS)
def test_folds_and_binaries_on_every_thread_count(isa: str) -> None:
    need(isa)
    x = edge_matrix((3000, 211), 161, 0.05)  # rows along lanes (axis 1) and along memory (axis 0)
    t = torch.from_numpy(x)
    a = subnormal_matrix((1 << 20,), 162)
    b = edge_matrix((1 << 20,), 163, 0.1)
    wants = [bits(ref_reduce("max", x, 1)), bits(ref_reduce("sum", x, 0)), bits(ref_binary("div", a, b))]
    torch.set_flush_denormal(True)  # in the caller, which runs items too (the references are done)
    try:
        for threads in THREAD_COUNTS:
            calls = [
                partial(cpu_ext.reduce_max, t, 1, isa=isa, threads=threads),
                partial(cpu_ext.reduce_sum, t, 0, isa=isa, threads=threads),
                partial(cpu_ext.binary, "div", torch.from_numpy(a), torch.from_numpy(b), isa=isa, threads=threads),
            ]
            for call, want in zip(calls, wants):
                np.testing.assert_array_equal(run_engaged(isa, threads, call), want, err_msg=f"{threads} threads")
    finally:
        torch.set_flush_denormal(False)


def test_worker_threads_never_flush() -> None:
    # Workers started while the caller flushes inherit its MXCSR; the pool clears it per job.
    torch.set_flush_denormal(True)
    try:
        for isa in cpu_ext.available_isas():
            for threads in THREAD_COUNTS:
                mx = engaged(isa, threads, partial(cpu_ext.worker_mxcsr, isa, threads))  # every thread looked
                if mx >= 0:
                    assert mx & 0xE040 == 0, f"{isa}, {threads} threads: MXCSR=0x{mx:04x} (FTZ/DAZ/rounding)"
    finally:
        torch.set_flush_denormal(False)


def test_an_idle_worker_stays_awake_between_calls_that_follow_closely() -> None:
    # pool.cpp spin_ns: a worker with no job spins (yielding its core) ~2 ms before it sleeps,
    # since a sleeping thread came back late into the next call on the VM. Calls back to back
    # find it awake (mostly: on a loaded machine the caller can be kept off a core that long;
    # with 2 busy processes beside it, 12-13 sleeps in 40 calls). With a 50 us spin
    # (VERDE_REPOPS_SPIN_US=50) it slept in 30-31 of them on a quiet machine and failed; beside
    # the 2 busy processes, 22 once, and once 20 or fewer. Calls 30 ms apart find it asleep,
    # which shows the counter counts.
    isa = cpu_ext.best_isa()
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    call = partial(cpu_ext.matmul, a, b, isa=isa, threads=2)
    engaged(isa, 2, call)  # the worker exists and takes items
    cpu_ext.probe_reset(isa)
    before = cpu_ext.pool_sleeps(isa)
    for _ in range(40):
        call()
    close = cpu_ext.pool_sleeps(isa) - before
    assert len(cpu_ext.probe_threads(isa)) == 2, "the back-to-back calls ran on one thread"
    before = cpu_ext.pool_sleeps(isa)
    for _ in range(8):
        call()
        time.sleep(0.03)
    apart = cpu_ext.pool_sleeps(isa) - before
    assert apart >= 6, f"the worker slept {apart} times in 8 calls 30 ms apart"
    assert close <= 20, f"the worker slept {close} times in 40 calls back to back"

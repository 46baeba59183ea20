"""The normalisation compositions' fast paths in the C++ backend: per-row dot chains
(kernels/cpu/norm.cpp: layer norm's variance, RMSNorm's mean square, the backward passes' row
sums) and compiled maps that read broadcast statistics, scales and biases in place
(``plan.periodic_map``). Each must give the spec's bits (``reference.run``) on every ISA and
thread count, and a wrong chain must be told apart by the same data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.threads import THREAD_COUNTS, run_engaged, spread_check
from verde_chain.repops import edges, library, reference
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.jit import map_address
from verde_chain.repops.backends.plan import periodic_map
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import load
from verde_chain.repops.program import InputMap, KernelDesc

ISAS = cpu_ext.available_isas()


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return edges.edge_array(shape, seed, frac=0.2)


def assert_reference(be: CpuBackend, desc: KernelDesc, ins: list[np.ndarray], path: str) -> np.ndarray:
    assert be.path(desc) == path, desc.label
    got, want = bits(be(desc, ins)), bits(reference.run(desc, ins))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{desc.label}: {bad.size} elements differ, first {bad[0]}"
    return got


# (shape, reduced axes): rows of contiguous k (the norms' statistics), rows adjacent in memory
# (a backward's sum over the batch), one row, K = 1, row counts off the vector width; rows of
# contiguous k in 8x8 blocks with row counts off 8/16/32 and K off 8 (K < 8, K = 8, a tail)
ROWDOT_CASES = [((128, 32), (1,)), ((33, 64), (1,)), ((7, 5), (1,)), ((3, 16, 16), (2,)), ((128, 32), (0,)),
                ((37, 19), (0,)), ((1, 40), (1,)), ((9, 1), (1,)), ((2, 3, 8), (1, 2)), ((77, 19), (1,)),
                ((45, 5), (1,)), ((41, 8), (1,)), ((41, 1), (1,))]  # fmt: skip


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape,axes", ROWDOT_CASES)
def test_row_dot_chains_equal_the_reference(isa: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    a, b = data(shape, 1), data(shape, 2)
    for threads in (1, 2):
        be = CpuBackend(isa, threads)
        for mean in (False, True):
            assert_reference(be, library.reduce_dot(shape, axes, True, mean), [a, b], "rowdot")
        for kind in ("meansq", "sumsq"):
            assert_reference(be, library.reduce(kind, shape, axes), [a], "rowdot")


def test_a_gemv_runs_on_the_row_kernel_with_the_vector_broadcast() -> None:
    """(1, K) @ (K, N): the output is not GEMM-shaped; A's row stride is 0 (every lane reads the
    same vector element)."""
    for isa in ISAS:
        be = CpuBackend(isa, 1)
        for m, n in ((1, 37), (37, 1)):
            desc = library.matmul((m, 24), (24, n))
            assert_reference(be, desc, [data((m, 24), 3), data((24, n), 4)], "rowdot")


def test_the_data_tells_a_wrong_chain_apart() -> None:
    """Row data catches a kernel that changed the chain: the same dot in reverse k order, or
    started from +0 with an FMA (a -0 row sum would become +0), gives other bits."""
    shape = (128, 32)
    rng = np.random.default_rng(1)  # finite values: the rows of edge data are mostly NaN
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    good = reference.run(library.reduce_dot(shape, (1,)), [a, b])
    m = InputMap(a.size, (32, 0), 1)
    pro = (load(1, 0), load(2, 1))
    body = (load(1, 0), load(2, 1), Instr(Op.FMA, 0, 1, 2, 0))
    reversed_k = KernelDesc((128, 1), 32, (InputMap(a.size, (32, 0), -1, 31),) * 2,
                            pro + (Instr(Op.MUL, 0, 1, 2),), body)  # fmt: skip
    from_zero = KernelDesc((128, 1), 32, (m, m), pro + (Instr(Op.FMA, 0, 1, 2, 0),), body)
    assert not np.array_equal(bits(reference.run(reversed_k, [a, b])), bits(good))
    neg = a.copy()
    neg[5] = -0.0  # a row of -0 * |b| products: -0 by the spec's MUL, +0 from an FMA on +0
    pos = np.abs(b)
    assert not np.array_equal(bits(reference.run(from_zero, [neg, pos])),
                              bits(reference.run(library.reduce_dot(shape, (1,)), [neg, pos])))
    for wrong in (reversed_k, from_zero):  # and the plan never takes them for the chain
        assert CpuBackend(threads=1).path(wrong) != "rowdot"


@pytest.mark.parametrize("isa", ISAS)
def test_row_dot_on_every_thread_count_engages_threads(isa: str) -> None:
    shape = (4096, 64)
    a, b = (edges.edge_array(shape, seed, frac=0.002) for seed in (5, 6))  # most rows finite
    desc = library.reduce_dot(shape, (1,))
    want = bits(reference.run(desc, [a, b])).reshape(-1)
    ta, tb = (torch.from_numpy(x).reshape(shape) for x in (a, b))
    ext = cpu_ext.extension(isa)
    for threads in THREAD_COUNTS:
        got = run_engaged(isa, threads, lambda t=threads: ext.rowdot(ta, tb, t))
        assert np.array_equal(got, want), threads


def _rowdot_views(layout: str, R: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) as (R, K) views with unit k stride in the layouts the row kernel tells apart:
    rows padded apart (row stride K + 3), b the same view as a (a mean square), b or a one
    vector broadcast over rows (row stride 0: a GEMV), and rows one element apart (row stride
    1: the first rows go to lanes as adjacent rows, the rest to 8x8 blocks)."""
    g = np.random.default_rng(R * 1000 + K)
    # few edge values (-0, subnormals, inf, NaN) per row, so most chains stay finite
    a, b = (torch.from_numpy(edges.edge_array((R, K + 3), s, frac=0.01)) for s in g.integers(1 << 30, size=2))
    a[3 % R, :] = -0.0  # a row of -0 products: -0 by the spec's first MUL (+0 from an FMA on +0)
    b[3 % R, :] = b[3 % R, :].abs().nan_to_num(1.0, 1.0, 1.0) + 1.0
    a, b = a[:, :K], b[:, :K]
    if layout == "same":
        return a, a
    if layout in ("bcast_b", "bcast_a"):
        v = b[3 % R].expand(R, K)
        return (a, v) if layout == "bcast_b" else (v, a)
    if layout == "adjacent":
        return tuple(torch.as_strided(x.reshape(-1)[: R + K], (R, K), (1, 1)) for x in (a, b))  # type: ignore[return-value]
    return a, b


@pytest.mark.parametrize("layout", ["rows", "same", "bcast_b", "bcast_a", "adjacent"])
def test_row_dot_of_contiguous_k_in_blocks_equals_the_reference(layout: str) -> None:
    """ext.rowdot straight on strided views (k stride 1): every ISA, 1 and 2 threads (two OS
    threads engaged on the largest case), rows off 8/16/32, K below, at and off 8, against the
    reference on contiguous copies of the rows."""
    ran = dict.fromkeys(ISAS, 0)  # the most OS threads one 2-thread call engaged, per ISA
    for R in (7, 45, 131, 1031):  # 1031 x 77 is worth two threads (the others one)
        for K in (1, 5, 8, 19, 77):
            ta, tb = _rowdot_views(layout, R, K)
            assert ta.stride(1) == tb.stride(1) == 1
            ca, cb = (np.ascontiguousarray(t.numpy()) for t in (ta, tb))
            want = bits(reference.run(library.reduce_dot((R, K), (1,), keepdims=False), [ca, cb]))
            if layout in ("rows", "bcast_a", "bcast_b"):
                assert want[3] == 0x80000000  # the -0 row (the test can tell a chain started from +0)
            for isa in ISAS:
                ext = cpu_ext.extension(isa)
                for threads in (1, 2):
                    with spread_check(isa):
                        cpu_ext.probe_reset(isa)
                        got = bits(ext.rowdot(ta, tb, threads).numpy())
                        count = len(cpu_ext.probe_threads(isa))
                    assert 1 <= count <= threads
                    if threads == 2:
                        ran[isa] = max(ran[isa], count)
                    bad = np.flatnonzero(got != want)
                    assert bad.size == 0, f"{layout} R={R} K={K} threads={threads}: rows {bad[:8]} differ"
    assert all(n == 2 for n in ran.values()), ran


def test_row_dot_test_data_tells_a_reversed_chain_apart() -> None:
    """The blocks' data catches a kernel that ran k descending (e.g. a transposed block read
    backwards): the reversed chain gives other bits on most rows."""
    ta, tb = _rowdot_views("rows", 131, 77)
    ca, cb = (np.ascontiguousarray(t.numpy()) for t in (ta, tb))
    desc = library.reduce_dot((131, 77), (1,), keepdims=False)
    want = bits(reference.run(desc, [ca, cb]))
    rev = bits(reference.run(desc, [np.ascontiguousarray(ca[:, ::-1]), np.ascontiguousarray(cb[:, ::-1])]))
    assert np.count_nonzero(rev != want) > 131 // 4, np.count_nonzero(rev != want)


# ------------------------------------------------------------------ broadcast maps, compiled

def test_periodic_maps() -> None:
    assert periodic_map(InputMap(128, (1, 0)), (128, 32)) == (1, 32, 128)  # a row statistic
    assert periodic_map(InputMap(32, (0, 1)), (128, 32)) == (1, 1, 32)  # a scale over rows
    assert periodic_map(InputMap(4096, (32, 1)), (128, 32)) == (1, 1, 4096)  # contiguous
    assert periodic_map(InputMap(1, (0, 0)), (128, 32)) == (0, 1, 1)  # a scalar
    assert periodic_map(InputMap(256, (16, 0, 1)), (8, 2, 16)) is None  # not one period
    assert periodic_map(InputMap(64, (2, 0, 1)), (8, 4, 2)) is None  # a transpose


# (out shape, the shapes broadcast against it): layer norm's (x - mean) and affine, softmax's
# e / s, a mask over heads, rows off the vector width
MAP_CASES = [((128, 32), [(128, 32), (128, 1), (32,), (32,)]), ((8, 2, 16, 16), [(8, 2, 16, 16), (8, 2, 16, 1)]),
             ((8, 2, 16, 16), [(8, 2, 16, 16), (16, 16)]), ((7, 37), [(7, 37), (7, 1), (37,)]),
             ((5, 13, 3), [(5, 13, 3), (5, 13, 1), (13, 1)]), ((3, 5), [(3, 5), (1, 1)])]  # fmt: skip


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape,in_shapes", MAP_CASES)
def test_compiled_maps_read_broadcast_inputs_in_place(isa: str, shape: tuple[int, ...],
                                                      in_shapes: list[tuple[int, ...]]) -> None:  # fmt: skip
    code = [Instr(Op.SUB, 0, 0, 1)] + [Instr(Op.MUL if t % 2 else Op.ADD, 0, 0, t) for t in range(2, len(in_shapes))]
    desc = library.elementwise("bcast", in_shapes, code)
    assert desc.out_shape == shape
    ins = [data(s, 10 + t) for t, s in enumerate(in_shapes)]
    want = None
    for threads in (1, 2):
        got = assert_reference(CpuBackend(isa, threads, jit_min_instrs=1), desc, ins, "jit")
        want = got if want is None else want
        assert np.array_equal(got, want)


@pytest.mark.parametrize("isa", ISAS)
def test_broadcast_maps_on_every_thread_count_engage_threads(isa: str) -> None:
    """Layer norm's affine over 4096 rows of 64: statistic, scale and bias read in place."""
    shapes = [(4096, 64), (4096, 1), (64,), (64,)]
    code = [Instr(Op.SUB, 0, 0, 1), Instr(Op.MUL, 0, 0, 2), Instr(Op.ADD, 0, 0, 3)]
    desc = library.elementwise("affine", shapes, code)
    ins = [data(s, 20 + t) for t, s in enumerate(shapes)]
    want = bits(reference.run(desc, ins)).reshape(-1)
    for threads in THREAD_COUNTS:
        be = CpuBackend(isa, threads)
        assert be.path(desc) == "jit"
        got = run_engaged(isa, threads, lambda b=be: b(desc, ins))
        assert np.array_equal(got.reshape(-1), want), threads


@pytest.mark.parametrize("isa", ISAS)
def test_compiled_maps_read_output_coordinates(isa: str) -> None:
    """COORD (cross-entropy backward's one-hot) in a compiled map, on every axis: lanes across
    coordinates, at one coordinate (one value) and inside one run (c0 + i)."""
    code = [Instr(Op.COORD, 1, imm=d) for d in range(3)]
    code = [code[0], Instr(Op.ADD, 0, 0, 1), code[1], Instr(Op.MUL, 0, 0, 1), code[2], Instr(Op.SUB, 0, 0, 1)]
    for shape in ((5, 7, 3), (3, 40, 37)):  # rows shorter and longer than the vector width
        desc = library.elementwise("coords", [shape], code)
        for threads in (1, 2):
            assert_reference(CpuBackend(isa, threads, jit_min_instrs=1), desc, [data(shape, 3)], "jit")


def test_a_compiled_map_refuses_rows_outside_its_input() -> None:
    desc = library.elementwise("bcast", [(128, 32), (128, 1)], [Instr(Op.SUB, 0, 0, 1)])
    be = CpuBackend(threads=1, jit_min_instrs=1)
    prep = be.prepare(desc)
    assert prep.jit is not None and prep.lin is not None
    bad = prep.lin.clone()
    bad[1, 3] = 129  # a period of 129 rows of an input of 128
    bad[1, 2] = 1
    ins = [torch.from_numpy(data(s, 1).view(np.int32).reshape(-1)) for s in ((128, 32), (128, 1))]
    with pytest.raises(RuntimeError, match="leave"):
        be.extension.run_map(map_address(prep.jit), ins, bad, desc.numel, 1, 1)


# ------------------------------------------------------------------ whole training steps

def _step_paths_equal_the_reference(job) -> None:  # type: ignore[no-untyped-def]
    """Two training steps on the whole-step kernel at every thread count: every node output and
    C_2 equal the node-by-node reference (numpy spec) path."""
    from tests.repops.test_step_kernel import assert_same_steps, run_steps

    graph = job.program.graph
    paths = {CpuBackend(threads=1).path(n.desc) for n in graph.nodes}
    assert {"rowdot", "jit"} <= paths
    labels = {n.label.split("/")[0] for n in graph.nodes if CpuBackend(threads=1).path(n.desc) == "rowdot"}
    assert labels & {"layer_norm", "layer_norm_bwd", "rms_norm", "rms_norm_bwd", "softmax_bwd"}, labels
    base = run_steps(graph, job.init_state, job.batch, lambda desc, ins: reference.run(desc, ins), steps=2)
    for threads in THREAD_COUNTS:
        assert_same_steps(run_steps(graph, job.init_state, job.batch, CpuBackend(threads=threads), steps=2), base)


def test_transformer_steps_equal_the_reference_path() -> None:
    from verde_chain.examples import EXAMPLES

    _step_paths_equal_the_reference(EXAMPLES["transformer"](steps=2))


@pytest.mark.slow
def test_tiny_llama_steps_equal_the_reference_path() -> None:
    """RMSNorm (forward and backward), RoPE, SwiGLU and the causal softmax of LlamaForCausalLM."""
    pytest.importorskip("transformers")
    from verde_chain.examples.lm import LMConfig, lm_job

    _step_paths_equal_the_reference(lm_job(LMConfig("llama"), steps=2))


def test_tiny_gpt2_steps_equal_on_every_isa_build_and_the_reference() -> None:
    """Two steps of tiny GPT-2, whose layer norms' and softmax backward's row chains have unit k
    stride (the 8x8 blocks on the AVX2 / AVX-512 builds; eight scalar chains on the scalar
    build): every node output and C_2 equal across ISA builds and the numpy reference."""
    from tests.repops.test_step_kernel import assert_same_steps, run_steps
    from verde_chain.examples.lm import LMConfig, lm_job
    from verde_chain.graph.backend import make_runner
    from verde_chain.repops.backends.plan import classify

    job = lm_job(LMConfig("gpt2"), steps=2)
    graph = job.program.graph
    blocks = [n.label for n in graph.nodes if (p := classify(n.desc)).kind == "rowdot"
              and p.views[0][1][1] == p.views[1][1][1] == 1 and n.desc.K >= 8 and n.desc.numel >= 8]  # fmt: skip
    assert {label.split("/")[0] for label in blocks} >= {"layer_norm", "layer_norm_bwd", "softmax_bwd"}, blocks
    base = run_steps(graph, job.init_state, job.batch, make_runner("reference"), steps=2)
    for isa in ISAS:
        assert_same_steps(run_steps(graph, job.init_state, job.batch, CpuBackend(isa, threads=2), steps=2), base)

"""The C++ CPU backend (``verde_chain/repops/backends/cpu/``) against the numpy reference.

The bar is bit equality with ``reference.run`` (the scalar interpreter ``program.run_spec`` where
the two disagree) for every RepOps family, on edge values (signed zeros, subnormals, infinities,
NaN with non-canonical payloads, largest finite, ties), with 1 and 2 threads and on every ISA
build, through each of the backend's paths (GEMM, fold, binary, generic interpreter), and for
whole training steps: C_T must not depend on the backend.
"""

from __future__ import annotations

import dataclasses
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cxx import syntax_check, torch_includes
from tests.support.threads import run_engaged
from verde_chain.repops import edges, library, program, reference, torch_api
from verde_chain.repops.backends import BACKENDS, BackendUnavailable
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.jit import jit_source, min_instrs_for
from verde_chain.repops.backends.plan import live_in
from verde_chain.repops.isa import THREE_REG_OPS, Instr, Op, f32_bits
from verde_chain.repops.library import ConvGeometry

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler for the RepOps kernels"
)

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 3.0, -7.0, 0.1, 128.0, -150.0, 300.0, 2.0**24 + 2, 1e30, -1e-30]
EDGE_BITS = np.array(
    [f32_bits(x) for x in EDGE_FLOATS]
    + [
        0x00000001,  # smallest subnormal
        0x807FFFFF,  # largest negative subnormal
        0x00800000,  # smallest normal
        0x7F7FFFFF,  # largest finite
        0xFF7FFFFF,
        0x7F800000,  # +inf
        0xFF800000,  # -inf
        0x7FC00000,  # canonical NaN
        0x7F800001,  # signalling NaN
        0xFFC12345,  # negative NaN with a payload
        0x3F7FFFFF,  # just below 1
    ],
    dtype=np.uint32,
)


@pytest.fixture(scope="module", autouse=True)
def _fp_env() -> None:
    torch.set_flush_denormal(False)  # the numpy reference runs in this thread


@pytest.fixture(scope="module", params=[(1, True), (2, True), (2, False)], ids=["t1", "t2", "t2-nojit"])
def be(request: pytest.FixtureRequest) -> CpuBackend:
    threads, jit = request.param
    return CpuBackend(threads=threads, jit=jit)


def edge_array(shape: tuple[int, ...], seed: int, frac: float = 0.3, scale: float = 3.0) -> np.ndarray:
    return edges.edge_array(shape, seed, frac, scale, EDGE_BITS)


def assert_same(desc: program.KernelDesc, ins: list[np.ndarray], be: CpuBackend, want_kind: str | None = None) -> None:
    want = reference.run(desc, ins)
    got = be(desc, ins)
    assert got.shape == want.shape and got.dtype == np.float32
    g, w = got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{desc.label}: {bad.size} elements differ, first {bad[0]}: {g[bad[0]]:#x} != {w[bad[0]]:#x}"
    if want_kind is not None:
        jit = be.jit and jit_source(desc, min_instrs=min_instrs_for(desc, be.jit_min_instrs))
        assert be.path(desc) == ("jit" if want_kind == "program" and jit else want_kind)


def run_composite(comp: library.Composite, ins: list[np.ndarray], be: CpuBackend) -> None:
    want = comp.run(ins, reference.run)
    got = comp.run(ins, be)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32), err_msg=comp.label)


# ======================================================================= instructions


@pytest.mark.parametrize("isa", cpu_ext.available_isas())
def test_every_instruction_on_all_edge_pairs(isa: str) -> None:
    """Each arithmetic opcode on the full grid of edge operand pairs (c random edges), every ISA,
    1 and 2 threads: the interpreter's instruction semantics are fp32.py's."""
    a, b = (g.reshape(-1) for g in np.meshgrid(EDGE_BITS, EDGE_BITS))
    a, b = np.tile(a, 4), np.tile(b, 4)  # > 2^12 lanes, several blocks per thread
    c = np.random.default_rng(3).choice(EDGE_BITS, a.size)
    n = a.size
    ins = [x.view(np.float32) for x in (a, b, c)]
    for threads in (1, 2):
        be = CpuBackend(isa, threads)
        for op in Op:
            if op in (Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX):
                continue
            instr = Instr(op, 0, 0, 1, 2 if op in THREE_REG_OPS else 0)
            assert_same(library.elementwise(op.name, [(n,)] * 3, (instr,)), ins, be, "program")


@pytest.mark.parametrize("isa", cpu_ext.available_isas())
def test_jit_every_instruction_on_all_edge_pairs(isa: str) -> None:
    """The same grid through generated vector code (every opcode compiled alone)."""
    a, b = (g.reshape(-1) for g in np.meshgrid(EDGE_BITS, EDGE_BITS))
    a, b = np.tile(a, 4), np.tile(b, 4)
    c = np.random.default_rng(3).choice(EDGE_BITS, a.size)
    n = a.size - 3  # not a multiple of the vector width: the tail path runs too
    ins = [x[:n].view(np.float32) for x in (a, b, c)]
    be = CpuBackend(isa, 1, jit_min_instrs=1)
    for op in Op:
        if op in (Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX):
            continue
        instr = Instr(op, 0, 0, 1, 2 if op in THREE_REG_OPS else 0)
        desc = library.elementwise(op.name, [(n,)] * 3, (instr,))
        assert_same(desc, ins, be)
        assert be.path(desc) == "jit"


NAN_CHAIN = (
    Instr(Op.SUB, 3, 0, 1),  # inf - inf, NaN - x: NaNs with hardware payloads
    Instr(Op.NEG, 4, 3),
    Instr(Op.ABS, 5, 4),
    Instr(Op.SELECT, 6, 5, 3, 1),
    Instr(Op.MAX, 7, 6, 0),
    Instr(Op.LT, 8, 3, 0),
    Instr(Op.FMA, 9, 6, 8, 5),
    Instr(Op.MIN, 10, 9, 2),
    Instr(Op.LDEXP, 11, 10, 8),
    Instr(Op.EQ, 12, 11, 11),
)


@pytest.mark.parametrize(
    "tail",
    [
        (Instr(Op.SELECT, 0, 12, 9, 6),),  # result from a register op: canonical
        (Instr(Op.MOV, 0, 2),),  # MOV of a raw loaded NaN: canonical
        (library.load(0, 1),),  # a LOAD writes r0 last: raw payload kept
        (Instr(Op.CONST, 0, imm=0xFFC00001),),  # raw CONST NaN kept
    ],
    ids=["select", "mov", "load", "const"],
)
def test_nan_payloads_through_chains(be: CpuBackend, tail: tuple[Instr, ...]) -> None:
    """Intermediate NaNs carry hardware payloads (x86's default NaN is 0xFFC00000); the
    generated code canonicalises only the result. No instruction's value may depend on them."""
    a, b = (g.reshape(-1) for g in np.meshgrid(EDGE_BITS, EDGE_BITS))
    c = np.random.default_rng(5).choice(EDGE_BITS, a.size)
    ins = [x.view(np.float32) for x in (a, b, c)]
    desc = library.elementwise("chain", [(a.size,)] * 3, NAN_CHAIN + tail)
    assert_same(desc, ins, be, "program")


def test_const_coord_mov_and_raw_loads_keep_payloads(be: CpuBackend) -> None:
    # CONST and LOAD copy raw bits (a NaN payload survives); MOV canonicalises; COORD is exact.
    code = (
        Instr(Op.COORD, 3, imm=0),
        Instr(Op.COORD, 4, imm=1),
        Instr(Op.CONST, 5, imm=0xFFC00001),
        Instr(Op.MOV, 6, 0),
        Instr(Op.SELECT, 0, 3, 0, 5),  # row 0: the raw CONST NaN, else the loaded value
    )
    x = edge_array((5, 7), 1, 0.6)
    assert_same(library.elementwise("raw", [(5, 7)], (library.load(0, 0), *code)), [x], be)
    assert_same(library.elementwise("mov", [(5, 7)], (library.load(1, 0), Instr(Op.MOV, 0, 1))), [x], be)
    assert_same(library.elementwise("coord", [(5, 7)], (Instr(Op.COORD, 0, imm=1), Instr(Op.MUL, 0, 0, 0))), [x], be)


def test_unwritten_and_loop_carried_registers_start_at_plus_zero(be: CpuBackend) -> None:
    """Every register starts as +0.0: a read of a never-written register (r7) gives +0, so
    -0 + r7 = +0; a body register carried across k (r9) starts at +0 in the first iteration."""
    x = edge_array((300, 6), 4, 0.3)
    m = program.InputMap(x.size, (6,), 1)
    desc = program.KernelDesc(
        (300,), 6, (m,),
        (library.load(1, 0), Instr(Op.ADD, 0, 1, 7)),
        (library.load(1, 0), Instr(Op.ADD, 9, 9, 1), Instr(Op.MUL, 0, 9, 9)),
        (Instr(Op.ADD, 0, 0, 11),),
        label="carried",
    )  # fmt: skip
    assert_same(desc, [x], be, "program")
    neg0 = np.full((300, 1), -0.0, np.float32)
    one = program.KernelDesc((300,), 1, (program.InputMap(300, (1,)),), (library.load(1, 0), Instr(Op.ADD, 0, 1, 7)))
    assert_same(one, [neg0], be)
    assert (be(one, [neg0]).view(np.uint32) == 0).all()


def test_loadidx_edge_indices_match_the_scalar_interpreter(be: CpuBackend) -> None:
    """Gather with every kind of bad index: NaN, inf, non-integral, negative (wraps once),
    out of range, huge. Huge integral indices are compared to ``program.run_spec`` (exact
    integers): ``reference.run`` clips them to 2**62 and its int64 product with the index
    stride can wrap."""
    data = edge_array((10, 4), 2)
    small = np.array([0, 3, -1, -10, -11, 10, 2.5, -0.0, np.nan, np.inf, -np.inf, 9, 1e9], np.float32)
    assert_same(library.gather((10, 4), small.shape, 0), [data, small], be)
    huge = np.array([1e30, 2.0**62, -(2.0**62), 4.6e18, 3e38, 1.0], np.float32)
    desc = library.gather((10, 4), huge.shape, 0)
    np.testing.assert_array_equal(be(desc, [data, huge]).view(np.uint32), program.run_spec(desc, [data, huge]).view(np.uint32))
    idx = np.array([[0, 3, 1], [-1, 7, 2]], np.float32)
    assert_same(library.gather_elements((2, 4), (2, 3), 1), [edge_array((2, 4), 3), idx], be)


def test_loadidx_outside_int32_is_nan_even_with_index_stride_zero(be: CpuBackend) -> None:
    """With idx_stride 0 every valid index reads the base address, so only the int32 rule can
    refuse 2^31 or 5e9: the interpreter once took any finite integral index (the address was in
    range) and read data[0] where the spec says NaN. The rule is rp_index now, shared with CUDA."""
    m = program.InputMap(4, (1,), 0, 0, 0)
    desc = program.KernelDesc((4,), 1, (m, program.InputMap(4, (1,))), (library.load(1, 1), Instr(Op.LOADIDX, 0, 1, 0, 0)))
    ix = np.array([2.0**31, -(2.0**31), 5e9, -3.0], np.float32)
    got = be(desc, [np.arange(4, dtype=np.float32), ix]).view(np.uint32)
    np.testing.assert_array_equal(got, program.run_spec(desc, [np.arange(4, dtype=np.float32), ix]).view(np.uint32))
    assert got[0] == got[2] == 0x7FC00000


@pytest.mark.parametrize("isa", cpu_ext.available_isas())
def test_jit_loadidx_equals_the_interpreter(isa: str) -> None:
    """LOADIDX compiled (repops_map.h): the 32-bit lanes with one gather where the input and its
    addresses are small, the 64-bit rule lane by lane where not, on every kind of index (NaN,
    inf, fractional, -0, negative, out of range, +-2^31, huge), index strides 0, 1, -1 and 2^20
    (the 32-bit path's limit: 1023 * 2^20 is out of range for a small input, and 4096 * 2^20 = 2^32
    would wrap to 0 in int32 without it), element counts that leave a tail; payloads: a result last written by LOADIDX keeps
    the input's NaN payload, concat's SELECT canonicalises. Bits against the interpreter and
    the spec, and the path must be the compiled map; a gather big enough to split gives the same
    bits on 1, 2 and 3 threads, which really ran."""
    bad = [np.nan, np.inf, -np.inf, 2.5, -0.0, -1.0, 1e9, 2.0**31, -(2.0**31), 3e38, 1023.0, 1024.0, -1024.0, 4096.0]
    rng = np.random.default_rng(11)

    def indices(n: int, hi: int, lo: int = 0) -> np.ndarray:
        ix = rng.integers(lo, hi, n).astype(np.float32)
        pick = rng.random(n) < 0.3
        ix[pick] = rng.choice(np.array(bad, np.float32), int(pick.sum()))
        return ix

    data = edge_array((37, 5), 7)
    data.reshape(-1).view(np.uint32)[3] = 0x7FC0_1234  # a payload NaN a raw read must keep
    n = 1000  # a tail at every width
    cases: list[tuple[program.KernelDesc, list[np.ndarray], bool]] = []
    for stride, offset in ((1, 0), (0, 3), (-1, 184), (1 << 20, 0)):
        m = program.InputMap(data.size, (0,), 0, offset, stride)
        desc = program.KernelDesc((n,), 1, (m, program.InputMap(n, (1,))), (library.load(1, 1), Instr(Op.LOADIDX, 0, 1, 0, 0)),
                                  label=f"loadidx stride {stride}")
        cases.append((desc, [data, indices(n, 190)], True))  # 185..189: past the end
    # a base of 2^30 (index -2^30 + j reads j): beyond the 32-bit lanes' bounds
    far = program.InputMap(data.size, (0,), 0, 1 << 30, 1)
    desc = program.KernelDesc((n,), 1, (far, program.InputMap(n, (1,))), (library.load(1, 1), Instr(Op.LOADIDX, 0, 1, 0, 0)),
                              label="loadidx far base")
    cases.append((desc, [data, indices(n, 185, 0) - np.float32(1 << 30)], False))
    cases.append((library.gather((37, 5), (n,), 0), [data, indices(n, 40, -40)], True))
    parts = ((3, 4, 7), (3, 4, 2), (3, 4, 9))  # along the last axis (periodic maps: a rotary embedding's halves)
    cases.append((library.concat(parts, -1), [edge_array(s, i) for i, s in enumerate(parts)], True))
    cases.append((library.slice_grad((6, 50), (1, 3), (6, 47), (2, 4)), [edge_array((3, 11), 9)], True))
    be = CpuBackend(isa, 1, jit_min_instrs=1)
    for desc, ins, small in cases:
        source = jit_source(desc, min_instrs=1)
        assert source is not None and ("rp_loadidx_lanes_small(" in source) == small, desc.label
        assert_same(desc, ins, be)
        assert be.path(desc) == "jit", desc.label
        np.testing.assert_array_equal(be(desc, ins).view(np.uint32), program.run_spec(desc, ins).view(np.uint32))
    got = be(cases[0][0], [data, np.full(n, 3.0, np.float32)])
    assert (got.view(np.uint32) == 0x7FC0_1234).all()  # raw: the last writer is LOADIDX
    # a gather big enough to split (the maps above are one thread's work): the same bits on 1, 2
    # and 3 threads, and more than one OS thread ran items at 2 and 3
    big = library.gather((37, 5), (1 << 17,), 0)
    ins = [data, indices(1 << 17, 40, -40)]
    want = program.run_spec(big, ins).reshape(-1).view(np.uint32)
    for threads in (1, 2, 3):
        threaded = CpuBackend(isa, threads)
        assert threaded.path(big) == "jit"
        np.testing.assert_array_equal(run_engaged(isa, threads, partial(threaded, big, ins)).reshape(-1), want)


@pytest.mark.parametrize("isa", cpu_ext.available_isas())
def test_jit_chains_equal_the_interpreter(isa: str) -> None:
    """K > 1 programs compiled (jit._chain_source: the prologue at k = 0, the body for k = 1 ..
    K - 1, the epilogue at K - 1, registers carried across k in each lane): a batch-norm
    statistic over a k-major operand (lanes contiguous at each k), a row-major one (lanes K
    apart), a negative k stride, a broadcast and a per-row input, COORD in the body, a register
    read before any write (+0), NaN payloads through the chain (canonical at the end) and a body
    whose last write of r0 is a LOAD after the prologue's register write (raw), an epilogue
    reading at k = K - 1, element counts that leave a tail. Bits against the
    interpreter and the reference, and the path must be the compiled map; a wide chain gives the
    same bits on 1, 2 and 3 threads, which really ran; a chain with LOADIDX stays on the
    interpreter."""
    L = library.load
    C, K = 37, 50
    xk = edge_array((K, C), 61, 0.3)  # k-major: row k holds every lane's element
    xk.view(np.uint32)[K - 1, 3] = 0x7FC0_0BAD  # a payload the raw result below must keep
    xr = edge_array((C, K), 62, 0.3)  # row-major: lane c's k run
    mu = edge_array((C,), 63, 0.3)
    var_pro = (L(1, 0), L(2, 1), Instr(Op.SUB, 1, 1, 2), Instr(Op.MUL, 0, 1, 1))
    var_body = (L(1, 0), L(2, 1), Instr(Op.SUB, 1, 1, 2), Instr(Op.FMA, 0, 1, 1, 0))
    half = (Instr(Op.CONST, 3, imm=0x3F000000), Instr(Op.MUL, 0, 0, 3), L(4, 0), Instr(Op.ADD, 0, 0, 4))  # reads k = K-1
    kmajor = program.InputMap(C * K, (1,), C)
    cases = [
        (program.KernelDesc((C,), K, (kmajor, program.InputMap(C, (1,))), var_pro, var_body, half,
                            label="k-major var"), [xk, mu]),
        (program.KernelDesc((C,), K, (program.InputMap(C * K, (K,), 1), program.InputMap(C, (1,))), var_pro, var_body,
                            (), label="row-major var"), [xr, mu]),
        # k walking backwards from the last row; the mean broadcast as one scalar; r7 never written
        (program.KernelDesc((C,), K, (program.InputMap(C * K, (1,), -C, (K - 1) * C), program.InputMap(1, (0,))),
                            (L(1, 0), L(2, 1), Instr(Op.ADD, 0, 1, 7)),
                            (L(1, 0), Instr(Op.SUB, 4, 1, 0), Instr(Op.COORD, 5, imm=0), Instr(Op.FMA, 0, 4, 5, 0),
                             Instr(Op.MAX, 6, 6, 4)),
                            (Instr(Op.ADD, 0, 0, 6),), label="backwards"), [xk, mu[:1].copy()]),
        # NaN payloads from inf - inf through the chain; the body ends with a raw LOAD into r0
        (program.KernelDesc((C,), K, (kmajor,), (L(1, 0), Instr(Op.SUB, 2, 1, 1), Instr(Op.MUL, 3, 2, 1),
                                                 Instr(Op.MOV, 0, 3)),
                            (L(1, 0), Instr(Op.SUB, 2, 1, 3), Instr(Op.SELECT, 3, 2, 3, 1), L(0, 0)), (),
                            label="raw load last"), [xk]),
        # per-row input (q > 1): 4 x 9 outputs, each row's scale broadcast along it
        (program.KernelDesc((4, 9), 6, (program.InputMap(216, (9, 1), 36), program.InputMap(4, (1, 0))),
                            (L(1, 0), L(2, 1), Instr(Op.MUL, 0, 1, 2)),
                            (L(1, 0), L(2, 1), Instr(Op.FMA, 0, 1, 2, 0)), (), label="per-row scale"),
         [edge_array((216,), 64, 0.3), edge_array((4,), 65, 0.3)]),
    ]
    be, interp = CpuBackend(isa, 1, jit_min_instrs=1), CpuBackend(isa, 1, jit=False)
    for desc, ins in cases:
        assert_same(desc, ins, be)
        assert be.path(desc) == "jit", desc.label
        np.testing.assert_array_equal(be(desc, ins).view(np.uint32), interp(desc, ins).view(np.uint32))
    # 1,024 chains (the cases above are one thread's work): split by elements, never along k, so
    # the same bits on 1, 2 and 3 threads, and more than one OS thread ran items at 2 and 3
    wide = program.KernelDesc((1024,), 300, (program.InputMap(1024 * 300, (1,), 1024), program.InputMap(1024, (1,))),
                              var_pro, var_body, half, label="wide var")
    ins = [edge_array((300, 1024), 66, 0.3), edge_array((1024,), 67, 0.3)]
    want = interp(wide, ins).reshape(-1).view(np.uint32)
    for threads in (1, 2, 3):
        threaded = CpuBackend(isa, threads)
        assert threaded.path(wide) == "jit"
        np.testing.assert_array_equal(run_engaged(isa, threads, partial(threaded, wide, ins)), want)
    raw = be(cases[3][0], cases[3][1]).view(np.uint32)
    np.testing.assert_array_equal(raw, xk[K - 1].view(np.uint32))  # the LOAD's bits, payloads and all
    gather = program.InputMap(C, (1,), 0, 0, 1)
    indexed = program.KernelDesc((C,), K, (kmajor, gather), (L(1, 0), Instr(Op.LOADIDX, 0, 1, 0, 1)),
                                 (L(1, 0), Instr(Op.LOADIDX, 2, 1, 0, 1), Instr(Op.ADD, 0, 0, 2)), (), label="indexed")
    assert jit_source(indexed, min_instrs=1) is None
    in_body = dataclasses.replace(indexed, prologue=(L(0, 0),))  # LOADIDX in the body only
    assert jit_source(in_body, min_instrs=1) is None
    # a windowed read outside a chain (K = 1: pad) is not compiled
    win = program.InputMap(C, (0,), windows=(program.Window(axis=0, out_mul=1, offset=-1, size=C, stride=1),))
    assert jit_source(program.KernelDesc((C,), 1, (win,), (L(0, 0), Instr(Op.ADD, 0, 0, 0))), min_instrs=1) is None


@pytest.mark.parametrize("isa", cpu_ext.available_isas())
def test_jit_windowed_chains_equal_the_interpreter(isa: str) -> None:
    """Windowed chains compile as they are, reading each input where it lies, with no gather
    into scratch. Windows that only move with k (jit.k_linear: batch-norm statistics over the
    batch and spatial digits): one gather of W channels a stride apart per k, or contiguous
    lanes; the library's statistics (37 channels: a tail; 7 x 5 pixels: lanes 35 apart; 1 x 1:
    lanes contiguous) and windows with a k multiplier of 2 or -1, an offset, a digit that no
    window reads and a k stride besides. Windows that follow output coordinates or can leave
    their range (jit.masked_window: pooling; the fill where out of range): every pooling
    descriptor of the library on a strided, dilated, asymmetrically padded, ceil-mode geometry,
    a window with a divisor (lanes whose v is not a multiple read the fill) and a fill with a
    NaN payload. Bits against the reference and the dewindowed interpreter, and the path must
    be the compiled chain; windows too far apart for 32-bit lanes stay dewindowed; 256 chains
    split among 1, 2 and 3 threads, which really ran, give the same bits."""
    L = library.load
    interp = CpuBackend(isa, 1, jit=False)
    be = CpuBackend(isa, 1, jit_min_instrs=1)  # small chains compile too

    def check(desc: program.KernelDesc, seed: int) -> None:
        ins = [edge_array((m.numel,), seed + t, 0.3) for t, m in enumerate(desc.inputs)]
        assert be.path(desc) == "windowed jit", desc.label
        got = be(desc, ins).view(np.uint32)
        np.testing.assert_array_equal(got, reference.run(desc, ins).view(np.uint32), err_msg=desc.label)
        np.testing.assert_array_equal(got, interp(desc, ins).view(np.uint32), err_msg=desc.label)

    for shape in ((3, 37, 7, 5), (4, 20, 1, 1)):
        for make in (library.channel_sum, library.channel_mean, library.channel_centered_meansq, library.channel_dot_xhat):
            check(make(shape), 70)
    # k = (a, b, c) digits 3 x 4 x 5: input 0 reads digit a forwards (k_mul 2, offset 1: every
    # other entry of 8), digit c backwards (k_mul -1, offset 4), never digit b, and moves by a k
    # stride as well; input 1 reads digit b at a fixed offset of 2 and digit a; 19 outputs 50 apart
    C, kd = 19, (3, 4, 5)
    x0 = program.InputMap(19 * 50 + 8 * 40 + 5 + 60 * 3, (50,), 3, 0, windows=(
        program.Window(digit=0, k_mul=2, offset=1, size=8, stride=40), program.Window(digit=2, k_mul=-1, offset=4, size=5, stride=1)))
    x1 = program.InputMap(C * 7 + 6 * 2 + 3, (7,), 0, 0, windows=(
        program.Window(digit=1, k_mul=1, offset=2, size=6, stride=2), program.Window(digit=0, k_mul=1, size=3, stride=1)))
    body = (L(1, 0), L(2, 1), Instr(Op.FMA, 0, 1, 2, 0), Instr(Op.MAX, 3, 3, 1))
    mixed = program.KernelDesc((C,), 60, (x0, x1), (L(1, 0), L(2, 1), Instr(Op.MUL, 0, 1, 2)), body,
                               (Instr(Op.SUB, 0, 0, 3), L(4, 1), Instr(Op.ADD, 0, 0, 4)), kdims=kd, label="mixed digits")
    check(mixed, 80)
    # masked: offset -1 reads the fill (a NaN payload) at digit 0; a divisor of 2 along an output
    # coordinate (lanes whose v is odd read the fill)
    leaves = dataclasses.replace(x1, fill=0x7FC0_1234, windows=(
        program.Window(digit=1, k_mul=1, offset=-1, size=6, stride=2),
        program.Window(axis=0, out_mul=3, digit=0, k_mul=1, offset=-2, div=2, size=7, stride=1)))
    check(dataclasses.replace(mixed, inputs=(x0, leaves), label="masked"), 85)
    g = ConvGeometry.make((3, 5, 9, 8), (3, 2), (2, 1), (1, 2), (1, 0, 2, 1), True)
    for desc in (library.max_pool(g), library.max_pool_argmax(g), library.avg_pool(g, True), library.avg_pool(g, False),
                 library.window_sum_backward(g)):
        check(desc, 87)
    far = dataclasses.replace(leaves, numel=1 << 29, windows=(program.Window(digit=1, k_mul=1, offset=-1, size=6, stride=1 << 26),))
    assert jit_source(dataclasses.replace(mixed, inputs=(x0, far)), min_instrs=1) is None
    assert be.path(library.pad((2, 3, 4), (1, 0, -1, 0, 2, 1), 0.5)) == "window"  # K = 1
    wide = library.channel_centered_meansq((3, 256, 20, 20))  # 256 chains over k = 1,200
    ins = [edge_array((m.numel,), 90 + t, 0.3) for t, m in enumerate(wide.inputs)]
    want = interp(wide, ins).reshape(-1).view(np.uint32)
    for threads in (1, 2, 3):
        threaded = CpuBackend(isa, threads)
        assert threaded.path(wide) == "windowed jit"
        np.testing.assert_array_equal(run_engaged(isa, threads, partial(threaded, wide, ins)).reshape(-1).view(np.uint32),
                                      want)


# ======================================================================= GEMM path


MATMUL_CASES = [  # (a, b, trans_a, trans_b, the backend's path)
    ((6, 9), (9, 5), False, False, "dot"),
    ((9, 6), (5, 9), True, True, "dot"),
    ((2, 4, 7), (7, 3), False, False, "dot"),
    ((7,), (7, 4), False, False, "rowdot"),  # GEMV shapes: per-row chains, the vector broadcast
    ((2, 4, 7), (7,), False, False, "rowdot"),
    ((4, 7), (1, 4), True, True, "rowdot"),
    ((7,), (4, 7), False, True, "rowdot"),
    ((1, 300), (300, 90), False, False, "rowdot"),
    ((3, 1, 4, 7), (2, 7, 5), False, False, "dot"),  # broadcast batches
    ((5, 1), (1, 6), False, False, "dot"),  # K = 1
    ((70, 300), (90, 300), False, True, "dot"),  # big enough for two threads (x @ W^T)
    ((64, 33), (64, 17), True, False, "dot"),  # x^T @ g (weight gradient)
    ((600, 77), (600, 45), True, False, "dot"),  # transposed A: partial row panels, 3 K blocks
    ((300, 200), (300, 64), True, False, "dot"),  # one column block: rows split across threads
    ((2, 300, 50), (2, 300, 40), True, False, "dot"),  # batched, transposed A
]


@pytest.mark.parametrize("a_shape,b_shape,ta,tb,path", MATMUL_CASES)
def test_matmul_path(
    be: CpuBackend, a_shape: tuple[int, ...], b_shape: tuple[int, ...], ta: bool, tb: bool, path: str
) -> None:
    desc = library.matmul(a_shape, b_shape, ta, tb)
    ins = [edge_array(a_shape, 11, 0.1), edge_array(b_shape, 12, 0.1)]
    assert_same(desc, ins, be, path)


def test_matmul_subnormal_products_are_not_flushed(be: CpuBackend) -> None:
    a = np.full((8, 16), 2.0**-70, np.float32)
    b = np.full((16, 8), 2.0**-70, np.float32)  # products 2**-140: subnormal
    torch.set_flush_denormal(True)
    try:
        got = be(library.matmul(a.shape, b.shape), [a, b])
    finally:
        torch.set_flush_denormal(False)
    assert_same(library.matmul(a.shape, b.shape), [a, b], be)
    assert (got.reshape(-1).view(np.uint32) == np.float32(16 * 2.0**-140).view(np.uint32)).all()


@pytest.mark.parametrize(
    "c_shape,alpha,beta,ta,tb",
    [(None, 1.0, 1.0, False, False), ((5,), 0.5, 1.0, False, True), ((6, 5), 1.0, -2.0, True, False),
     ((6, 1), 0.1, 0.3, True, True), ((6, 5), 2.0, 0.0, False, False)],
)  # fmt: skip
def test_gemm_epilogues(be: CpuBackend, c_shape: tuple[int, ...] | None, alpha: float, beta: float, ta: bool, tb: bool) -> None:
    a = edge_array((9, 6) if ta else (6, 9), 21, 0.2)
    b = edge_array((5, 9) if tb else (9, 5), 22, 0.2)
    ins = [a, b]
    if c_shape is not None and beta != 0.0:
        ins.append(edge_array(c_shape, 23, 0.3))
    assert_same(library.gemm(a.shape, b.shape, c_shape, alpha, beta, ta, tb), ins, be, "dot")


def test_epilogue_reading_body_registers_goes_to_the_interpreter(be: CpuBackend) -> None:
    """An epilogue that reads r1 (the last A value) is outside what the GEMM models: the plan
    must fall back to the interpreter, and the label ("matmul") must not fool it either way."""
    mm = library.matmul((4, 6), (6, 3))
    odd = program.KernelDesc(mm.out_shape, mm.K, mm.inputs, mm.prologue, mm.body, (Instr(Op.ADD, 0, 0, 1),), label="matmul")
    assert live_in(odd.epilogue) == {0, 1}
    assert_same(odd, [edge_array((4, 6), 31), edge_array((6, 3), 32)], be, "program")
    exp_named_matmul = program.KernelDesc((5,), 1, (program.InputMap(5, (1,)),), library.map_unary("exp", (5,)).prologue, label="matmul")
    assert_same(exp_named_matmul, [edge_array((5,), 33)], be, "program")


def test_reduce_dot_on_the_row_kernel_where_rows_are_linear(be: CpuBackend) -> None:
    """Rows read at offset + r*sr (the last axis, all axes) take the row kernel; a middle axis
    (output rows not linear in memory) stays on the interpreter."""
    x, y = edge_array((5, 7, 3), 41), edge_array((5, 7, 3), 42)
    for axes, mean, path in [((1,), False, "program"), ((2,), True, "rowdot"), (None, False, "rowdot")]:
        assert_same(library.reduce_dot(x.shape, axes, keepdims=True, mean=mean), [x, y], be, path)


# ======================================================================= folds


@pytest.mark.parametrize("kind", library.REDUCE_KINDS)
def test_reductions_every_kind_and_axes(be: CpuBackend, kind: str) -> None:
    x = edge_array((6, 11, 4), 51, 0.2)
    path = "fold" if kind in ("sum", "mean", "max", "min") else "rowdot" if kind in ("sumsq", "l2", "meansq") else "program"
    for axes, keep in [((1, 2), False), ((2,), True), ((0,), False), (None, True)]:
        desc = library.reduce(kind, x.shape, axes, keep)
        assert_same(desc, [x], be, path)


def test_k1_reduction_keeps_raw_nan_payloads(be: CpuBackend) -> None:
    """K = 1: the spec's result is the loaded bits themselves (a NaN payload survives); the
    reduce kernel canonicalises, so the plan must not use it."""
    x = np.array([[0x7F800001], [0xFFC12345], [0x80000000]], np.uint32).view(np.float32)
    for kind in ("sum", "max", "min"):
        desc = library.reduce(kind, x.shape, (1,), False)
        assert_same(desc, [x], be, "program")
        assert be(desc, [x]).view(np.uint32)[0] == 0x7F800001


def test_large_reductions_threaded(be: CpuBackend) -> None:
    x = edge_array((300, 257), 52, 0.01)
    for kind, axes in [("sum", (1,)), ("max", (0,)), ("mean", None), ("min", (1,))]:
        assert_same(library.reduce(kind, x.shape, axes, False), [x], be, "fold")


# ======================================================================= elementwise


@pytest.mark.parametrize("op", sorted(library.BINARY_CODE))
def test_binary_same_shape_and_broadcast(be: CpuBackend, op: str) -> None:
    a, b = edge_array((4, 8), 61, 0.4), edge_array((4, 8), 62, 0.4)
    fast = op in ("add", "sub", "mul", "div", "max", "min", "and", "or")  # and/or are the MIN/MAX programs
    assert_same(library.binary(op, a.shape, b.shape), [a, b], be, "binary" if fast else "program")
    c = edge_array((3, 1, 8), 63, 0.4)
    assert_same(library.binary(op, c.shape, b.shape), [c, b], be, "program")
    big = edge_array((1 << 17) + 5, 64, 0.05)
    assert_same(library.binary(op, big.shape, big.shape), [big, big[::-1].copy()], be)


UNARY = sorted(library.UNARY_CODE) + list(library.TRANSCENDENTAL_UNARY)


@pytest.mark.parametrize("name", UNARY)
def test_unary_maps_on_edges_and_wide_range(be: CpuBackend, name: str) -> None:
    x = np.concatenate([EDGE_BITS.view(np.float32), edge_array((3000,), 71, 0.1, 10.0), edge_array((500,), 72, 0, 200.0)])
    assert_same(library.map_unary(name, x.shape), [x], be, "program")


@pytest.mark.parametrize("name", sorted(library.GRAD_CODE) + ["gelu_erf_grad", "gelu_tanh_grad"])
def test_unary_grads(be: CpuBackend, name: str) -> None:
    x, g = edge_array((40, 30), 81, 0.2), edge_array((40, 30), 82, 0.2)
    assert_same(library.unary_grad(name, x.shape), [x, g], be)


def test_other_maps(be: CpuBackend) -> None:
    x = edge_array((9, 13), 91, 0.3)
    assert_same(library.map_affine(x.shape, 0.3, -1.25), [x], be)
    assert_same(library.clip(x.shape, -1.0, 2.0), [x], be)
    assert_same(library.leaky_relu(x.shape, 0.01), [x], be)
    cond = edge_array((9, 1), 92, 0.5)
    assert_same(library.where(cond.shape, x.shape, (13,)), [cond, x, edge_array((13,), 93)], be)


# ======================================================================= data movement


def test_copies_gathers_and_scatter(be: CpuBackend) -> None:
    x = edge_array((3, 4, 5), 101)
    assert_same(library.transpose(x.shape, (2, 0, 1)), [x], be)
    assert_same(library.reshape(x.shape, (5, 12)), [x], be)
    assert_same(library.expand((4, 1), (3, 4, 6)), [edge_array((4, 1), 102)], be)
    assert_same(library.slice_(x.shape, [2, 0, 4], [None, 4, None], [-1, 2, -2]), [x], be)  # negative strides
    v = edge_array((1001,), 104)
    assert_same(library.slice_(v.shape, [1], [None], [2]), [v], be)  # linear map, address stride 2
    assert_same(library.binary("mul", (600, 3), (1, 1)), [edge_array((600, 3), 105), np.float32([[0.5]])], be)  # stride 0
    assert_same(library.binary("sub", (3, 1, 500), (3, 7, 500)), [edge_array((3, 1, 500), 106), edge_array((3, 7, 500), 107)], be)
    # trailing size-1 output axes: runs follow the last axis of size > 1 (fill / strided runs)
    assert_same(library.binary("sub", (60, 40, 1), (60, 1, 1)), [edge_array((60, 40, 1), 108), edge_array((60, 1, 1), 109)], be)
    assert_same(library.transpose((50, 40, 1), (1, 0, 2)), [edge_array((50, 40, 1), 110)], be)
    g = edge_array((7, 3), 103)
    idx = np.array([0, 4, 4, 2, 0, 1, 4], np.float32)
    assert_same(library.scatter_add(7, (3,), 5), [g, idx], be)
    buf, row = edge_array((4, 300), 111), edge_array((300,), 112)  # an inference job's outputs buffer
    for r in (0.0, 3.0, 4.0, -1.0):  # rows 4 and -1 do not exist: nothing is written
        assert_same(library.write_row(4, 300), [buf, row, np.float32([r])], be)


# ======================================================================= compositions


def test_compositions_softmax_norms_losses_optimizers(be: CpuBackend) -> None:
    x = edge_array((6, 10), 111, 0.05)
    g = edge_array((6, 10), 112, 0.05)
    run_composite(library.softmax(x.shape, -1), [x], be)
    run_composite(library.log_softmax(x.shape, 0), [x], be)
    run_composite(library.softmax_backward(x.shape, -1), [x, g], be)
    run_composite(library.layer_norm(x.shape, 1, 1e-5, True, True), [x, edge_array((10,), 113), edge_array((10,), 114)], be)
    _, m, s = library.layer_norm(x.shape, 1, 1e-5, False, False).run([x])
    run_composite(library.layer_norm_backward(x.shape, 1), [x, edge_array((10,), 115), m, s, g], be)
    labels = np.array([0, 3, 9, 2, 2, 7], np.float32)
    run_composite(library.softmax_cross_entropy(x.shape, "mean"), [x, labels], be)
    run_composite(library.softmax_cross_entropy_backward(x.shape, "mean"), [x, labels, np.ones(1, np.float32)], be)
    p, buf = edge_array((5, 4), 116, 0.1), edge_array((5, 4), 117, 0.1)
    run_composite(library.sgd(p.shape, 0.1, 0.9, 0.0, 1e-4, True, False), [p, g[:5, :4].copy(), buf], be)
    v = np.abs(edge_array((5, 4), 118, 0.1))
    run_composite(library.adam(p.shape, 1e-3, 3, (0.9, 0.999), 1e-8, 0.01, True), [p, g[:5, :4].copy(), buf, v], be)
    run_composite(library.reduce_composite("log_sum_exp", x.shape, (1,), False), [x], be)
    run_composite(library.matmul_backward((6, 10), (10, 3)), [x, edge_array((10, 3), 119), edge_array((6, 3), 120)], be)


# ======================================================================= properties


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 20), batch=st.integers(1, 3),
    ta=st.booleans(), tb=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_property_matmul_raw_bits(m: int, k: int, n: int, batch: int, ta: bool, tb: bool, seed: int) -> None:
    be = CpuBackend(threads=2)
    rng = np.random.default_rng(seed)
    a_shape = (batch, k, m) if ta else (batch, m, k)
    b_shape = (n, k) if tb else (k, n)
    raw = lambda s: rng.integers(0, 2**32, s, dtype=np.uint64).astype(np.uint32).view(np.float32)
    assert_same(library.matmul(a_shape, b_shape, ta, tb), [raw(a_shape), raw(b_shape)], be)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), kind=st.sampled_from(library.REDUCE_KINDS),
    seed=st.integers(0, 2**16), data=st.data(),
)  # fmt: skip
def test_property_reductions_any_axes(shape: list[int], kind: str, seed: int, data: st.DataObject) -> None:
    be = CpuBackend(threads=2)
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
    x = edge_array(tuple(shape), seed, 0.3)
    run_composite(library.reduce_composite(kind, shape, axes, data.draw(st.booleans())), [x], be)


# ======================================================================= backend plumbing


def test_bad_maps_are_refused_before_any_read() -> None:
    """SAFETY: the interpreter re-checks LOAD address boxes (no out-of-bounds reads even if a
    caller bypasses KernelDesc.validate)."""
    x = torch.zeros(4, dtype=torch.int32)
    maps = torch.tensor([[1, 0, 2, 0, 4]], dtype=torch.int64)  # 5 elements at offset 2: beyond 4
    prog = torch.tensor([[int(Op.LOAD), 0, 0, 0, 0]], dtype=torch.int64)
    empty = torch.zeros((0, 5), dtype=torch.int64)
    with pytest.raises(RuntimeError, match="leave"):
        cpu_ext.run_program([x], maps, (5,), 1, (prog, empty, empty))


def test_register_puts_the_torch_api_on_the_cpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from verde_chain.repops.backends.cpu import backend as cpu_backend

    want = torch_api.softmax(torch.from_numpy(edge_array((4, 9), 131, 0.1)))
    monkeypatch.setitem(BACKENDS, "cpu", BACKENDS["cpu"])
    cpu_backend.register()
    assert BACKENDS["cpu"] is cpu_backend.backend
    got = torch_api.softmax(torch.from_numpy(edge_array((4, 9), 131, 0.1)))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_make_runner_falls_back_with_a_message(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from verde_chain.graph import backend
    from verde_chain.repops.backends import registry
    from verde_chain.repops.backends.cpu import backend as cpu_backend

    assert isinstance(backend.make_runner(), CpuBackend)  # the default
    assert backend.make_runner("cpu", threads=2).threads == 2  # type: ignore[attr-defined]

    def broken(*a: object, **k: object) -> None:
        raise BackendUnavailable("RepOps C++ kernels unavailable: no compiler (test)")

    monkeypatch.setattr(cpu_backend, "CpuBackend", broken)
    monkeypatch.setattr(registry, "_warned", set())
    assert backend.make_runner("cpu") is reference.run
    assert "falling back to the numpy reference" in capsys.readouterr().err


def test_threads_option_of_train_and_the_bots(capsys: pytest.CaptureFixture[str]) -> None:
    """``--threads`` of train, the client and the bots: a count >= 1, else argparse's error naming
    the option (no traceback); applied, it is the count every default runner reads per call."""
    from verde_chain.cli import build_parser
    from verde_chain.errors import RepOpsError
    from verde_chain.graph.backend import set_threads

    parser = build_parser()
    for argv in (["train", "digits"], ["trainer", "run"], ["challenger", "run"], ["client"]):
        assert parser.parse_args([*argv, "--threads", "3"]).threads == 3
        assert parser.parse_args(argv).threads is None  # default: torch's count, all cores
        for bad in ("0", "-2", "two"):
            with pytest.raises(SystemExit):
                parser.parse_args([*argv, "--threads", bad])
            err = capsys.readouterr().err
            assert "--threads" in err and "want a whole number of threads >= 1" in err and "Traceback" not in err
    before = torch.get_num_threads()
    try:
        set_threads(3)
        assert torch.get_num_threads() == 3 and CpuBackend().threads_now() == 3
        set_threads(None)  # no option: unchanged
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RepOpsError, match="--threads must be >= 1"):
        set_threads(0)


def test_one_name_per_backend_and_the_old_name_is_refused_naming_the_new() -> None:
    """The C++ backend is "cpu" for the executor and the torch API alike; "cpp" (its former name
    in make_runner) is a one-line error that names "cpu"."""
    from verde_chain.graph import backend
    from verde_chain.repops.backends import UnknownBackend

    assert {"reference", "cpu", "cuda"} <= set(BACKENDS) and "cpp" not in BACKENDS
    with pytest.raises(UnknownBackend, match="'cpp' \\(it is now called 'cpu'\\)") as info:
        backend.make_runner("cpp")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source", cpu_ext.SOURCES, ids=lambda p: p.name)
def test_sources_compile_after_an_older_torchs_std_flag(source: Path) -> None:
    """torch 2.11's cpp_extension puts -std=c++17 before the extension's flags (2.13's, -std=c++20),
    and the thread pool sleeps in std::atomic::wait (C++20): the extension's own flags must name
    the standard, or the kernels do not build beside an older torch (found on a lent GPU
    machine's torch 2.11). Each source, syntax-checked the way such a torch compiles it."""
    r = syntax_check(source, ["-std=c++17", *cpu_ext.extension_flags("scalar")], system=torch_includes())
    assert r.returncode == 0, r.stderr[-3000:]


# ======================================================================= whole steps


@pytest.mark.parametrize("example,steps", [("digits", 3), ("transformer", 2)])
def test_commitments_identical_between_backends(example: str, steps: int) -> None:
    from verde_chain.examples import EXAMPLES

    job = EXAMPLES[example](steps=steps, checkpoint_interval=0)
    runs = {
        "reference": job.make_run(None, 0, reference.run, steps),
        "cpu/1": job.make_run(None, 0, CpuBackend(threads=1), steps),
        "cpu/2": job.make_run(None, 0, CpuBackend(threads=2), steps),
    }
    finals = {name: r.run() for name, r in runs.items()}
    assert len(set(finals.values())) == 1, finals
    ref = runs["reference"].commitments
    assert all(r.commitments == ref for r in runs.values())
    assert len(set(ref.values())) == steps + 1


# ======================================================================= threads really engaged

WIDEST = cpu_ext.available_isas()[-1]


def _threaded_kernels() -> list[tuple[str, program.KernelDesc, list[np.ndarray], bool]]:
    """(path, descriptor, inputs, jit): one node per backend path that is not a plain GEMM, fold
    or binary (tests/repops/test_cpu_kernels.py has those), each big enough for 7 threads."""
    n = 1 << 20
    x, y, z = (edge_array((n,), seed, 0.2) for seed in (171, 172, 173))
    fma = library.elementwise("fma", [(n,)] * 3, (Instr(Op.FMA, 0, 0, 1, 2),))
    P, R, V = 4096, 128, 512
    g = edge_array((P, R), 174, 0.2)
    idx = np.random.default_rng(175).integers(0, V, P).astype(np.float32)
    return [
        ("program", fma, [x, y, z], False),  # the interpreter
        ("jit", fma, [x, y, z], True),  # the compiled map
        ("scatter", library.scatter_add(P, (R,), V), [g, idx], True),
    ]


@pytest.mark.parametrize("path,desc,ins,jit", _threaded_kernels(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_path_gives_the_same_bits_on_every_thread_count(
    path: str, desc: program.KernelDesc, ins: list[np.ndarray], jit: bool
) -> None:
    from tests.support.threads import THREAD_COUNTS, run_engaged

    want = None
    for threads in THREAD_COUNTS:
        be = CpuBackend(WIDEST, threads, jit=jit)
        assert be.path(desc) == path
        got = run_engaged(WIDEST, threads, partial(be, desc, ins))
        if want is None:
            want = reference.run(desc, ins).reshape(-1).view(np.uint32) if path != "scatter" else got
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, want, err_msg=f"{path}, {threads} threads")
    if path == "scatter":  # the reference loops over k = P in numpy: checked on a slice of rows
        assert_same(library.scatter_add(64, (8,), 16), [ins[0][:64, :8].copy(), np.minimum(ins[1][:64], 15)],
                    CpuBackend(WIDEST, 2))


def test_the_torch_api_runs_on_torch_s_thread_count() -> None:
    """The torch-facing API (the registered "cpu" backend, no count of its own) reads
    ``torch.get_num_threads()`` per call: set to N, N threads run its kernels."""
    from tests.support.threads import THREAD_COUNTS, run_engaged

    a, b = (torch.from_numpy(edge_array(s, seed, 0.1)) for s, seed in (((300, 257), 176), ((257, 203), 177)))
    before = torch.get_num_threads()
    want = None
    try:
        for threads in THREAD_COUNTS:
            torch.set_num_threads(threads)
            got = run_engaged(WIDEST, threads, partial(torch_api.matmul, a, b))
            want = got if want is None else want
            np.testing.assert_array_equal(got, want, err_msg=f"{threads} threads")
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_whole_steps_give_the_same_commitments_on_every_thread_count() -> None:
    """The whole-step kernel (big nodes split across threads, small ones side by side): the same
    C_s at 1, 2, 3, 4 and 7 threads, and more than one thread worked in each multi-thread step."""
    from tests.support.threads import THREAD_COUNTS, engaged
    from verde_chain.examples import EXAMPLES

    finals = {}
    for threads in THREAD_COUNTS:
        job = EXAMPLES["digits"](steps=2, checkpoint_interval=0, hidden=256, batch_size=128)
        run = job.make_run(None, 0, CpuBackend(WIDEST, threads), 2)
        finals[threads] = engaged(WIDEST, threads, run.run)
        assert run.exec.step_kernel() is not None, "the steps did not run on the whole-step kernel"
    assert len(set(finals.values())) == 1, finals

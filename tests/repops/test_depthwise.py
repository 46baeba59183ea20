"""Depthwise convolutions (groups = channels): the windowed GEMM of one row per batch entry
(kernels/cpu/conv.cpp, M == 1: each output's chain in its own vector lane, read through a plan
shared by the entries, or packed per item where the entries' tables differ) gives the
reference's bits on every ISA and thread count, edge values (NaN, infinities, signed zeros,
subnormals) and padding taps included."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from tests.support.threads import engaged
from verde_chain.repops import edges, fp32, library, reference, windowed
from verde_chain.repops.backends.cpu import extension as ck
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.isa import Op
from verde_chain.repops.library import ConvGeometry
from verde_chain.repops.program import KernelDesc


@pytest.fixture(scope="module", autouse=True)
def _fp_env() -> None:
    torch.set_flush_denormal(False)


# x shape, w shape (channel multiplier = w[0] / x[1]), strides, dilations, pads (begins, ends)
CASES = [
    ((2, 6, 9, 11), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((2, 6, 9, 11), (6, 1, 3, 3), (2, 2), (1, 1), (1, 2, 0, 1)),  # stride 2, asymmetric pads
    ((3, 4, 20, 22), (4, 1, 3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),  # dilation 2
    ((2, 5, 13, 18), (5, 1, 5, 3), (2, 1), (1, 2), (2, 0, 1, 3)),  # 5x3 taps, mixed strides
    ((3, 4, 37), (4, 1, 5), (1,), (1,), (2, 1)),  # 1-D
    ((2, 4, 17), (4, 1, 3), (2,), (2,), (0, 3)),  # 1-D, stride 2, dilation 2
    ((2, 4, 10, 12), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # multiplier 2 (Mg = 2)
    ((2, 3, 1, 1), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 1x1 maps: runs along images
    ((16, 3, 2, 2), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # runs of 2: the GEMM's tiles (vector ISAs)
]
SHORT_RUNS = CASES[-1]


def _descs(xs: tuple[int, ...], ws: tuple[int, ...], st: tuple[int, ...], dil: tuple[int, ...],
           pads: tuple[int, ...]) -> list[KernelDesc]:
    g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
    groups = xs[1]
    return [library.convolution(g, ws, groups), library.convolution(g, ws, groups, bias=True),
            library.conv_grad_input(g, ws, groups), library.conv_grad_weight(g, ws, groups)]


def _counters(isa: str) -> tuple[int, int]:
    ext = ck.extension(isa)
    return ext.row_plan_items(), ext.row_chain_items()


@pytest.mark.parametrize("isa", ck.available_isas())
def test_depthwise_equals_the_reference(isa: str) -> None:
    """Forward (with and without bias), grad input and grad weight of every case through the
    backend at 1, 2 and 3 threads against the reference; the M == 1 GEMMs ran through the
    shared plan (its counter grows), the others (a multiplier of 2 forward / grad weight: M = 2)
    did not touch it."""
    for i, case in enumerate(CASES):
        for desc in _descs(*case):
            plan = windowed.plan(desc)
            assert plan is not None, desc.label
            M = windowed.gemm_operands(desc, plan)[3]
            ins = [edges.edge_array((m.numel,), 40 + i + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
            want = reference.run(desc, ins).view(np.uint32)
            for threads in (1, 2, 3):
                before = _counters(isa)
                got = CpuBackend(isa=isa, threads=threads)(desc, ins).view(np.uint32)
                assert got.shape == want.shape and (got == want).all(), (isa, case, desc.label, threads)
                ran = _counters(isa)
                if case != SHORT_RUNS:
                    assert (ran[0] > before[0]) == (M == 1), (case, desc.label, M)
                assert ran[1] == before[1], (case, desc.label)


# big enough for threads (>= 2^20 FMAs): mobilenet_v2's shapes at a smaller batch
BIG = [
    ((16, 32, 16, 16), (32, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((16, 128, 16, 16), (128, 1, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # grad input: divisor-2 windows
]


@functools.cache
def _big() -> list[tuple]:  # type: ignore[type-arg]
    out = []
    for i, case in enumerate(BIG):
        for desc in _descs(*case)[::2] + [_descs(*case)[3]]:  # forward, grad input, grad weight
            plan = windowed.plan(desc)
            assert plan is not None
            ins = [edges.edge_array((m.numel,), 70 + i + t, 0.05, 2.0) for t, m in enumerate(desc.inputs)]
            want = reference.run(desc, ins).view(np.uint32).reshape(-1)
            a, b, nb, M, N = windowed.gemm_operands(desc, plan)
            assert M == 1 and nb * N * desc.K >= 1 << 20, (desc.label, nb, M, N)
            flat = [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]
            out.append((desc, plan, a, flat[plan.slot_a], b, flat[plan.slot_b], (nb, M, N), want))
    return out


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_depthwise_at_every_thread_count_on_several_os_threads(threads: int) -> None:
    """mobilenet_v2-like depthwise layers (stride 1 and 2) at 1-4 threads and two blockings,
    every ISA: more than one OS thread ran the items above one thread, the shared plan ran, and
    the bits are the reference's."""
    for isa in ck.available_isas():
        for desc, plan, a, a_bits, b, b_bits, shape, want in _big():
            for tile in (None, (12, 37, 64)):
                before = _counters(isa)
                run = functools.partial(ck.windowed_matmul, a, a_bits, b, b_bits, *shape, isa, threads, tile)
                got = engaged(isa, threads, run) if tile is None else run()
                assert _counters(isa)[0] > before[0], (isa, desc.label)
                got = windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1)
                assert (got == want).all(), (isa, threads, tile, desc.label)


def _chain(a: windowed.Operand, a_bits: np.ndarray, b: windowed.Operand, b_bits: np.ndarray, nb: int,
           N: int) -> np.ndarray:
    """The spec's chain of an M == 1 GEMM from the operands' gathers (fp32.fma_bits), (nb, 1, N)."""
    A = a.gather(a_bits).reshape(nb, 1, -1)
    B = b.gather(b_bits).reshape(nb, N, -1)
    with np.errstate(all="ignore"):  # infinities and NaN of the edge values
        acc = fp32.execute(Op.MUL, A[:, :, 0], B[:, :, 0])
        for k in range(1, A.shape[2]):
            acc = fp32.fma_bits(A[:, :, k], B[:, :, k], acc)
    return np.where(np.isnan(acc.view(np.float32)), np.uint32(0x7FC00000), acc).reshape(nb, 1, N)


def _first_forward(seed: int) -> tuple:  # type: ignore[type-arg]
    """The first case's forward: its GEMM plan, operands, (nb, M, N) and edge inputs' bits."""
    desc = _descs(*CASES[0])[0]
    plan = windowed.plan(desc)
    assert plan is not None
    a, b, nb, M, N = windowed.gemm_operands(desc, plan)
    ins = [edges.edge_array((m.numel,), seed + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
    return plan, a, b, nb, M, N, [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]


@pytest.mark.parametrize("isa", ck.available_isas())
def test_entries_that_differ_are_packed_per_item(isa: str) -> None:
    """Tables whose entries are not entry 0's at an offset (one entry's window parts moved by a
    row, another's address part off by one element) are not read through the shared plan: those
    entries are packed per item (row_chains) and still give the spec's chain for their own
    tables; a plan read with the wrong offset (the mutant that skips the check) would not."""
    plan, a, b, nb, M, N, flat = _first_forward(90)
    rows = b.rows.copy()
    rows[1, 2 * N:3 * N] += 1  # entry 2: every window part one row down (padding moves)
    rows[0, 4 * N + 5] += 1  # entry 4: one address one element on
    moved = dataclasses.replace(b, rows=rows)
    want = _chain(a, flat[plan.slot_a], moved, flat[plan.slot_b], nb, N)
    assert (want != _chain(a, flat[plan.slot_a], b, flat[plan.slot_b], nb, N)).any()
    for threads in (1, 2):
        before = _counters(isa)
        got = ck.windowed_matmul(a, flat[plan.slot_a], moved, flat[plan.slot_b], nb, M, N, isa, threads).numpy()
        after = _counters(isa)
        assert after[1] - before[1] == 2 and after[0] - before[0] == nb - 2, (before, after)
        assert (got.view(np.uint32) == want).all(), (isa, threads)


@pytest.mark.parametrize("isa", ck.available_isas())
def test_depthwise_written_in_the_output_order(isa: str) -> None:
    """A depthwise forward whose pixels fill whole micro-tiles, written in (image, channel,
    pixel) order directly (column_split): the M == 1 path writes each item's columns segment by
    segment, with the reference's bits."""
    be = CpuBackend(isa=isa, threads=2)
    desc = _descs((3, 8, 16, 16), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1))[0]
    plan = windowed.plan(desc)
    assert plan is not None
    split = be.column_split(desc, plan)
    assert split is not None
    ins = [edges.edge_array((m.numel,), 17 + t, 0.05, 2.0) for t, m in enumerate(desc.inputs)]
    want = reference.run(desc, ins).view(np.uint32)
    a, b, nb, M, N = windowed.gemm_operands(desc, plan)
    bits = [np.asarray(x, dtype=np.float32).view(np.uint32) for x in ins]
    for tile in (None, (12, 37, 64)):
        got = ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 2, tile, split=split)
        assert (got.numpy().view(np.uint32).reshape(want.shape) == want).all(), tile


def test_an_address_outside_the_input_is_refused() -> None:
    """A table pointing past its input is refused with a clear error, through the plan (every
    entry shifted out) as through the per-item packing."""
    plan, a, b, nb, M, N, flat = _first_forward(3)
    uniform, one = b.rows.copy(), b.rows.copy()
    uniform[0, -N:] += 10**6  # the last entry, every address: read through the plan
    one[0, -1] += 10**6  # the last entry, one address: packed per item
    for isa in ck.available_isas():
        for rows in (uniform, one):
            bad = dataclasses.replace(b, rows=rows)
            with pytest.raises(RuntimeError, match="fell outside"):
                ck.windowed_matmul(a, flat[plan.slot_a], bad, flat[plan.slot_b], nb, M, N, isa, 1)

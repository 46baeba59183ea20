"""Windowed dot chains (convolution and its gradients) as an explicit GEMM: the C++ backend's
path gives the reference's bits on every ISA and thread count, edge values included."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np
import pytest
import torch

from tests.support.threads import THREAD_COUNTS, engaged, spread_check
from verde_chain.repops import edges, library, reference, windowed
from verde_chain.repops.backends.cpu import extension as ck
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library import ConvGeometry
from verde_chain.repops.program import KernelDesc


@pytest.fixture(scope="module")
def conv_descs(script: Callable[[str], ModuleType]) -> list[KernelDesc]:
    """scripts/gpu_check.py's convolution cases (a GPU runs the same)."""
    gpu_check = script("gpu_check")
    return list(gpu_check.conv_descs(gpu_check.CONV_CASES))


@pytest.fixture(scope="module", autouse=True)
def _fp_env() -> None:
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("isa", ck.available_isas())
@pytest.mark.parametrize("threads", [1, 2])
def test_windowed_gemm_equals_the_reference(isa: str, threads: int, conv_descs: list[KernelDesc]) -> None:
    be = CpuBackend(isa=isa, threads=threads)
    for i, desc in enumerate(conv_descs):
        assert windowed.plan(desc) is not None, desc.label
        ins = [edges.edge_array((m.numel,), 100 + i + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
        got, want = be(desc, ins).view(np.uint32), reference.run(desc, ins).view(np.uint32)
        assert got.shape == want.shape and (got == want).all(), (isa, threads, desc.label)


BIG = [  # big enough for threads (>= 2^20 FMAs per GEMM); strides, dilation, groups, padding
    ((4, 16, 20, 18), (24, 16, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),
    ((3, 12, 17, 19), (12, 4, 3, 2), (2, 3), (2, 1), (2, 0, 1, 3), 3),
    ((4, 16, 24, 22), (32, 16, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),  # grad input: divisors 2
]
WIDE = [  # rows of 40 and a 1x1 map: runs of 32 columns and more (conv.cpp moves those in vector
    # lanes), padded at one end or not at all
    ((2, 8, 6, 40), (8, 8, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),
    ((2, 16, 8, 36), (16, 16, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1),
]


# 8 x 8 maps, padded on every side (resnet18's first stage): B's 32-wide panels are four rows of
# one image, their addresses following each other (conv.cpp pack_contiguous_panel on AVX-512)
EIGHT_BY_EIGHT = ((3, 8, 8, 8), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1)


@pytest.mark.parametrize("isa", ck.available_isas())
def test_panels_of_consecutive_addresses_equal_the_reference(isa: str) -> None:
    """The forward and grad input on 8 x 8 maps, at 1 and 2 threads and two blockings (K cut
    into blocks that split a channel's taps): the reference's bits; on AVX-512 the lane-mask
    packing ran."""
    _bits_and_avx512_path(isa, _big_cases((EIGHT_BY_EIGHT,))[:2], "contiguous_panels")


@pytest.mark.parametrize("isa", ck.available_isas())
def test_a_consecutive_panel_outside_the_input_is_refused(isa: str) -> None:
    """A panel of 32 consecutive addresses inside the operand (its neighbours' whole boxes of
    addresses inside the input, its lanes' windows in range) that starts before the input or
    ends past it: refused, as every address outside the input is, not read."""
    _, a, a_bits, b, b_bits, shape, _ = _big_cases((EIGHT_BY_EIGHT,))[0]
    assert b.rows.shape[1] >= 128
    for base in (-16, b_bits.size - 16):
        rows = b.rows.copy()
        rows[0, 64:96] = base + np.arange(32)
        with pytest.raises(RuntimeError, match="fell outside"):
            ck.windowed_matmul(a, a_bits, dataclasses.replace(b, rows=rows), b_bits, *shape, isa, 1)


def _bits_and_avx512_path(isa: str, cases: list[tuple], counter: str) -> None:  # type: ignore[type-arg]
    """Each case at 1 and 2 threads and two blockings (K cut into blocks of 37): the reference's
    bits, and the extension's path counter ``counter`` moved exactly on AVX-512."""
    count = getattr(ck.extension(isa), counter)
    for desc, a, a_bits, b, b_bits, shape, want in cases:
        plan = windowed.plan(desc)
        assert plan is not None
        for threads in (1, 2):
            for tile in (None, (12, 37, 64)):
                before = count()
                got = ck.windowed_matmul(a, a_bits, b, b_bits, *shape, isa, threads, tile).numpy()
                assert (count() > before) == (isa == "avx512"), (desc.label, threads, tile)
                got = windowed.to_output(desc, plan, got).view(np.uint32).reshape(-1)
                assert (got == want).all(), (desc.label, threads, tile)


# a map padded unevenly (ONNX pads: begins, then ends), so that its output rows are narrower than
# its input rows: a grad weight's k (positions) step evenly along each output row only
UNEVEN = ((2, 8, 10, 12), (8, 8, 3, 3), (1, 1), (1, 1), (0, 1, 2, 0), 1)
# resnet18's first convolution (7x7, stride 2, pad 3), smaller: a grad weight's k step by two
# floats along an output row, its rows (the taps) in runs of 7
STRIDED = ((2, 3, 20, 36), (8, 3, 7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1)


@pytest.mark.parametrize("isa", ck.available_isas())
def test_panels_packed_along_k_equal_the_reference(isa: str) -> None:
    """Grad weights, whose B panels (rows the taps, k the positions) are packed along k: on 8 x 8
    maps (k consecutive along a whole image), on an unevenly padded map (along each output row)
    and with stride 2 (every other float along each output row), at 1 and 2 threads and two
    blockings (K blocks of 37: groups of k cut short and crossing images), the reference's bits;
    on AVX-512 the transposing path ran."""
    _bits_and_avx512_path(isa, _big_cases((EIGHT_BY_EIGHT, UNEVEN, STRIDED))[2::3], "k_panels")


@pytest.mark.parametrize("isa", ck.available_isas())
def test_implicit_im2col_gemm_at_every_thread_count_and_blocking(isa: str) -> None:
    """The native windowed GEMM (kernels/cpu/conv.cpp) against the reference for 1/2/3/4/7
    threads and two blockings (K cut into several blocks, narrow column blocks)."""
    for desc, a, a_bits, b, b_bits, shape, want in _big_cases() + _big_cases(tuple(WIDE)):
        plan = windowed.plan(desc)
        assert plan is not None
        for threads in (1, 2, 3, 4, 7):
            for tile in (None, (12, 37, 64)):
                got = ck.windowed_matmul(a, a_bits, b, b_bits, *shape, isa, threads, tile).numpy()
                got = windowed.to_output(desc, plan, got).view(np.uint32).reshape(-1)
                assert (got == want).all(), (desc.label, threads, tile)


@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_implicit_im2col_gemm_runs_on_several_os_threads(threads: int) -> None:
    """The windowed GEMM's items run on the pool: more than one OS thread at threads > 1 (one at
    1), and the bits are the reference's whatever ran them: a stride-1 forward (panels packed
    as runs) and a stride-2 grad input (windows with divisor 2: runs of every other element
    where B's panels hold runs of 8, else element by element), on every ISA. A window one
    element narrower in the divisor-2 tables (a mutated table) is caught."""
    cases = [_big_cases()[0], next(c for c in _big_cases() if (c[3].wins[:, 0] == 2).all() and len(c[3].wins))]
    for isa in ck.available_isas():
        for desc, a, a_bits, b, b_bits, shape, want in cases:
            plan = windowed.plan(desc)
            assert plan is not None
            got = engaged(isa, threads, functools.partial(ck.windowed_matmul, a, a_bits, b, b_bits, *shape, isa, threads))
            got = windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1)
            assert (got == want).all(), (isa, threads, desc.label)
        desc, a, a_bits, b, b_bits, shape, want = cases[1]
        narrower = dataclasses.replace(b, wins=b.wins - np.array([0, 1, 0]))
        bad = ck.windowed_matmul(a, a_bits, narrower, b_bits, *shape, isa, threads).numpy()
        assert (windowed.to_output(desc, windowed.plan(desc), bad).view(np.uint32).reshape(-1) != want).any()


DIV_RUNS = [  # grad inputs whose dy windows have divisor 2 and rows of >= 8 (runs of 8 or more)
    ((2, 8, 16, 16), (12, 8, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
    ((3, 6, 9, 18), (8, 6, 1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 1),  # a 1x1 downsample, odd height
    ((2, 8, 11, 17), (6, 4, 3, 2), (2, 2), (2, 1), (2, 0, 1, 3), 2),  # dilation, groups, uneven pads
    ((2, 4, 10, 24), (4, 4, 3, 3), (2, 4), (1, 1), (1, 1, 1, 1), 1),  # divisor 4 along a row
    ((12, 8, 16, 16), (12, 8, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),  # the first, worth several threads
]


@pytest.mark.parametrize("isa", ck.available_isas())
def test_divisor_windows_packed_as_runs_equal_the_reference(isa: str) -> None:
    """Strided convolutions' grad inputs, whose dy operand has divisor-2 (and 4) windows and
    rows of 8 or more along a window axis: the panels are packed as runs of every other element
    (conv.cpp pack_steps_row_div; the counter proves it ran where panels hold runs of 8), with the reference's bits (edge
    values: NaN, infinities, signed zeros, subnormals) at 1/2/3/4/7 threads (more than one OS thread
    engaged at each count above 1) and two blockings. A
    window one element narrower in the divisor tables is caught."""
    ext = ck.extension(isa)
    ran = dict.fromkeys((1, 2, 3, 4, 7), 0)  # the most OS threads one call engaged, per thread count
    for xs, ws, st, dil, pads, groups in DIV_RUNS:
        g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
        desc = library.conv_grad_input(g, ws, groups)
        plan = windowed.plan(desc)
        assert plan is not None
        a, b, nb, M, N = windowed.gemm_operands(desc, plan)
        assert (b.wins[:, 0] > 1).any(), desc.label
        ins = [edges.edge_array((m.numel,), 31 + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
        want = reference.run(desc, ins).view(np.uint32).reshape(-1)
        flat = [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]
        for threads in (1, 2, 3, 4, 7):
            for tile in (None, (12, 37, 64)):
                before = ext.div_run_panels()
                with spread_check(isa):
                    ck.probe_reset(isa)
                    got = ck.windowed_matmul(a, flat[plan.slot_a], b, flat[plan.slot_b], nb, M, N, isa, threads, tile)
                    ran[threads] = max(ran[threads], len(ck.probe_threads(isa)))
                assert 1 <= ran[threads] <= threads
                # runs of 8 fit B's panels of 32 (AVX-512) and 16 (AVX2); scalar's are 4 wide
                assert (ext.div_run_panels() > before) == (ext.info()["nr"] >= 8), (xs, threads, tile)
                got = windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1)
                assert (got == want).all(), (isa, xs, threads, tile)
        narrower = dataclasses.replace(b, wins=b.wins - np.array([0, 1, 0]))
        bad = ck.windowed_matmul(a, flat[plan.slot_a], narrower, flat[plan.slot_b], nb, M, N, isa, 2).numpy()
        assert (windowed.to_output(desc, plan, bad).view(np.uint32).reshape(-1) != want).any(), xs
    # the small cases are worth one thread; the larger ones really ran on several
    assert ran[1] == 1 and all(ran[t] > 1 for t in (2, 3, 4, 7)), ran


@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_weight_gradient_gemm_of_few_items_on_several_os_threads(threads: int) -> None:
    """A weight gradient (one batch entry, one row block: fewer items than two per thread at
    the default blocking) is cut into column blocks of whole micro-tiles chosen per thread
    count: more than one OS thread runs them at threads > 1, and the bits are the reference's,
    on every ISA."""
    grads = [c for c in _big_cases() if c[0].label == "conv_grad_weight" and c[5][0] == 1]
    assert grads
    for isa in ck.available_isas():
        for desc, a, a_bits, b, b_bits, shape, want in grads:
            _, M, N = shape
            assert M <= ck.DEFAULT_TILE[0] and N <= ck.DEFAULT_TILE[2]  # one item at the default blocking
            plan = windowed.plan(desc)
            assert plan is not None
            got = engaged(isa, threads, functools.partial(ck.windowed_matmul, a, a_bits, b, b_bits, *shape, isa, threads))
            got = windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1)
            assert (got == want).all(), (isa, threads, desc.label)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_gather_worth_two_threads_runs_on_two(threads: int) -> None:
    """A gather of 2^17 elements (the digits CNN's max-pool backward: divisor-2 windows, element
    by element), which the plan runs alone on every thread as a node worth two, really uses
    more than one (it kept to one below 2^18 elements), with Operand.gather's bits."""
    g = ConvGeometry.make((32, 16, 8, 8), (2, 2), (2, 2), None, (0, 0, 0, 0))
    desc = library.max_pool_backward(g)
    m = desc.inputs[1]
    op = windowed.operand(desc, 1, tuple(d for d in range(len(desc.out_shape)) if windowed._depends(m, d)))
    assert op.rows.shape[1] * desc.K == 1 << 17 and _gather_path(op) == "any"
    bits = edges.edge_array((m.numel,), 5, 0.2, 3.0).view(np.uint32)
    for isa in ck.available_isas():
        got = engaged(isa, threads, functools.partial(ck.windowed_gather, op, bits, isa, threads))
        assert (got.numpy().view(np.uint32) == op.gather(bits)).all(), isa


# (x shape, weight shape, strides, dilations, pads, groups); per descriptor kind (forward, grad
# input, grad weight) what conv.cpp tap_class_gemm must do whenever it is exact (these shapes are
# too small to pay; test_tap_classes_run_where_they_pay has resnet18's): None = the one GEMM over
# every tap (no tap reads only the fill in any column, or a class per column);
# "taps" = class by class, zeros recomputed with every tap; "fill" = class by class, with classes
# none of whose taps reads the input (summed as signed zeros)
TAP_CLASSES = [
    # resnet18's layer 4: a 3x3 convolution on 1x1 maps reads the input at the centre tap only
    (((4, 16, 1, 1), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "fill")),
    # layer 3's 2x2 maps: four taps of nine per position
    (((3, 8, 2, 2), (12, 8, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "taps")),
    # 4x4 and 16x16 maps (69% and 88% of the FMAs)
    (((2, 8, 4, 4), (8, 8, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "taps")),
    (((2, 4, 16, 16), (8, 4, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "taps")),
    # a stride-2 layer from 2x2 to 1x1 (its grad input: phases and padding together)
    (((2, 8, 2, 2), (16, 8, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "fill")),
    # strided grad inputs: phases (stride 3 by 2: six), dilation, groups, uneven pads
    (((2, 8, 16, 16), (12, 8, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "taps")),
    (((2, 8, 11, 17), (6, 4, 3, 2), (2, 2), (2, 1), (2, 0, 1, 3), 2), ("fill", "fill", "taps")),
    (((2, 4, 10, 24), (4, 4, 3, 3), (3, 2), (1, 1), (1, 1, 1, 1), 1), ("taps", "taps", "taps")),
    (((8, 16, 16, 16), (32, 16, 5, 5), (2, 2), (1, 1), (2, 2, 2, 2), 1), ("taps", "taps", "taps")),  # worth threads
    # padding 2 around a 1x1 kernel: the border's outputs read only the fill, the forward's
    # columns written in the output's order (each image's 96 pixels a segment of C's rows)
    (((2, 4, 4, 8), (8, 4, 1, 1), (1, 1), (1, 1), (2, 2, 2, 2), 1), ("fill", None, "taps")),
    # a stride-2 1x1 downsample: its grad input's odd positions read no dy at all; no padding
    (((3, 6, 9, 18), (8, 6, 1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 1), (None, "fill", None)),
    # 1-D, dilation 2 and uneven pads on a short sequence; grouped 2-D with asymmetric pads
    (((3, 6, 3), (4, 6, 3), (1,), (2,), (2, 1), 1), ("taps", "taps", "fill")),
    (((2, 8, 3, 2), (8, 2, 3, 3), (1, 1), (1, 1), (2, 1, 0, 1), 4), ("taps", "taps", "taps")),
]


def _finite(x: np.ndarray) -> np.ndarray:
    """``x`` with its NaNs and infinities replaced by finite values (signed zeros and subnormals kept)."""
    y = np.array(x, dtype=np.float32)
    y[~np.isfinite(y)] = 1.5
    return y


def _read_by_row0(op: windowed.Operand, numel: int) -> np.ndarray:
    """The input elements row 0 of ``op`` reads inside the input (its gather of element indices)."""
    idx = op.gather(np.arange(numel, dtype=np.uint32))[0]
    inside = op.gather(np.zeros(numel, dtype=np.uint32))[0] != np.uint32(op.fill) if op.fill else None
    return np.unique(idx if inside is None else idx[inside])


@pytest.mark.parametrize("isa", ck.available_isas())
def test_taps_that_read_only_the_fill_are_skipped_exactly(isa: str) -> None:
    """A convolution (forward, grad input, grad weight) whose columns read the padding at some taps
    (small maps' edges) or fall between dy's elements (strided grad inputs) runs class by class,
    each column's chain over only the taps that read the input (tap_class_gemm), with A's elements
    finite: equal to the reference's chain over every tap, bit for bit, at 1/2/3 threads (more
    than one OS thread engaged). B has NaN, infinities, signed zeros and subnormals. The columns
    of B's row 0 read -0 wherever they read the input, so their chains over the input's taps end
    on zeros whose sign the skipped +0 products change: they are recomputed with every tap. A's
    row 0 is negative throughout, so a column none of whose taps reads the input sums to -0 in
    that row and +0 in the others. The counters prove which path ran. An infinite A element
    (0 * inf is NaN) keeps the one GEMM over every tap."""
    ext = ck.extension(isa)
    engaged_at = dict.fromkeys((2, 3), 0)
    ran = {"taps": 0, "fill": 0}
    with _tap_classes(ext, WHEN_EXACT):
        _run_tap_class_cases(isa, ext, engaged_at, ran)
    assert all(n > 1 for n in engaged_at.values()), engaged_at
    assert ran["taps"] and ran["fill"], ran


BY_COST, WHEN_EXACT, NEVER = 0, 1, 2  # conv.cpp TapClassChoice


@contextlib.contextmanager
def _tap_classes(ext: ModuleType, choice: int) -> Iterator[None]:
    before = ext.tap_class_choice(choice)
    try:
        yield
    finally:
        ext.tap_class_choice(before)


def _run_tap_class_cases(isa: str, ext: ModuleType, engaged_at: dict[int, int], ran: dict[str, int]) -> None:
    for i, ((xs, ws, st, dil, pads, groups), paths) in enumerate(TAP_CLASSES):
        g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
        kinds = (library.convolution(g, ws, groups), library.conv_grad_input(g, ws, groups),
                 library.conv_grad_weight(g, ws, groups))
        for desc, path in zip(kinds, paths, strict=True):
            plan = windowed.plan(desc)
            assert plan is not None
            a, b, nb, M, N = windowed.gemm_operands(desc, plan)
            na, nbm = desc.inputs[plan.slot_a].numel, desc.inputs[plan.slot_b].numel
            x_a = np.abs(_finite(edges.edge_array((na,), 40 + i, 0.2, 2.0)))
            x_a[_read_by_row0(a, na)] *= -1
            x_b = edges.edge_array((nbm,), 50 + i, 0.2, 2.0)
            x_b[_read_by_row0(b, nbm)] = -0.0
            ins = [np.zeros(0, np.float32)] * 2
            ins[plan.slot_a], ins[plan.slot_b] = x_a, x_b
            want = reference.run(desc, ins).view(np.uint32).reshape(-1)
            bits = [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]
            for threads in (1, 2, 3):
                before = ext.tap_class_gemms(), ext.tap_class_zero_columns(), ext.fill_only_columns()
                with spread_check(isa):
                    ck.probe_reset(isa)
                    got = ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, threads)
                    if threads > 1:
                        engaged_at[threads] = max(engaged_at[threads], len(ck.probe_threads(isa)))
                gemms, redone, fill_only = (ext.tap_class_gemms() - before[0], ext.tap_class_zero_columns() - before[1],
                                            ext.fill_only_columns() - before[2])
                label = (desc.label, xs, threads)
                got = windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1)
                assert (got == want).all(), label
                if path is None:
                    assert (gemms, redone, fill_only) == (0, 0, 0), label
                else:
                    assert gemms == 1 and (fill_only > 0) == (path == "fill"), label
                    assert redone > 0 or path == "fill", label  # a fill-only class may be all it skips
                    ran[path] += 1
            if path == "fill":  # the fill-only columns' -0 (row 0) and +0 (the others) both occur
                assert (want == 0x80000000).any() and (want == 0).any(), desc.label
            # through the backend as a node runs (its output order, column split included)
            assert (CpuBackend(isa=isa, threads=2)(desc, ins).view(np.uint32).reshape(-1) == want).all()
            if path is None:
                continue
            a_inf = x_a.copy()
            a_inf[len(a_inf) // 2] = np.inf
            ins[plan.slot_a] = a_inf
            want_inf = reference.run(desc, ins).view(np.uint32).reshape(-1)
            gemms = ext.tap_class_gemms()
            got = ck.windowed_matmul(a, a_inf.view(np.uint32), b, bits[plan.slot_b], nb, M, N, isa, 2)
            assert ext.tap_class_gemms() == gemms, ("tap classes with an infinite A element", desc.label)
            assert (windowed.to_output(desc, plan, got.numpy()).view(np.uint32).reshape(-1) == want_inf).all()


@pytest.mark.parametrize("isa", ck.available_isas())
def test_tap_classes_run_where_they_pay(isa: str) -> None:
    """By their estimated cost (the default), the tap classes run for resnet18's convolutions on
    1x1 maps (one tap of nine reads the input), its weight gradients there included (the eight
    fill-only taps of nine are written as whole rows of zeros first), and its stride-2 1x1 grad
    inputs, and not for a 3x3 layer on 16x16 maps (88% of the taps read the input). Same bits
    as the one GEMM either way."""
    ext = ck.extension(isa)
    cases = [  # (geometry, kind 0/1/2 = forward / grad input / grad weight, runs by cost)
        (((32, 512, 1, 1), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), 0, True),
        (((32, 512, 1, 1), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), 1, True),
        (((32, 64, 8, 8), (128, 64, 1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 1), 1, True),
        (((8, 64, 16, 16), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), 0, False),
        (((32, 512, 1, 1), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), 2, True),
    ]
    for (xs, ws, st, dil, pads, groups), kind, pays in cases:
        g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
        desc = (library.convolution, library.conv_grad_input, library.conv_grad_weight)[kind](g, ws, groups)
        plan = windowed.plan(desc)
        assert plan is not None
        a, b, nb, M, N = windowed.gemm_operands(desc, plan)
        ins = [np.zeros(0, np.float32)] * 2
        ins[plan.slot_a] = _finite(edges.edge_array((desc.inputs[plan.slot_a].numel,), 3, 0.2, 2.0))
        ins[plan.slot_b] = edges.edge_array((desc.inputs[plan.slot_b].numel,), 4, 0.2, 2.0)
        bits = [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]
        outs = []
        for choice in (BY_COST, NEVER):
            with _tap_classes(ext, choice):
                gemms = ext.tap_class_gemms()
                outs.append(ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 2).numpy())
                assert ext.tap_class_gemms() - gemms == (pays and choice == BY_COST), (desc.label, xs, choice)
        assert (outs[0].view(np.uint32) == outs[1].view(np.uint32)).all(), (desc.label, xs)


@contextlib.contextmanager
def _bound_audit(ext: ModuleType) -> Iterator[None]:
    before = ext.set_tap_class_bound_audit(True)
    try:
        yield
    finally:
        ext.set_tap_class_bound_audit(before)


def test_the_bound_that_skips_building_tap_classes_never_changes_the_choice() -> None:
    """Before it builds the tap classes (a pass over every column, on every call), the windowed
    GEMM bounds their cost from below by the (row, tap) pairs that read the fill, per window from
    a histogram of the rows (conv.cpp fill_pairs_at_most), and skips them where even the bound
    costs more than they may take. Under the audit the classes are built and costed anyway: over
    convolutions on maps from 1x1 (the classes pay) to 32x32 (they do not), forward and both
    gradients, strided, dilated, grouped and 1-D, no call the bound skipped would have run them;
    the bound skipped some, the classes ran on others, and the 64 -> 64 3x3 forward on 32x32 maps
    (issue #15's benchmark) is skipped without building them."""
    isa = ck.best_isa()
    ext = ck.extension(isa)
    shapes = [((32 if s <= 8 else 4, 64, s, s), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1)
              for s in (1, 2, 4, 8, 16, 32)]
    shapes += [
        ((8, 512, 1, 1), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),  # resnet18's last layers
        ((8, 64, 8, 8), (128, 64, 1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 1),  # a stride-2 downsample
        ((4, 32, 16, 16), (64, 32, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
        ((4, 16, 9, 9), (16, 16, 3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 1),  # dilated
        ((4, 32, 6, 6), (32, 8, 3, 3), (1, 1), (1, 1), (1, 0, 1, 2), 4),  # grouped, uneven pads
        ((4, 16, 40), (16, 16, 5), (1,), (1,), (2, 2), 1),  # 1-D
    ]

    def run_ones(desc: KernelDesc) -> None:  # the windowed GEMM on all-ones inputs, 1 thread
        plan = windowed.plan(desc)
        assert plan is not None
        a, b, nb, M, N = windowed.gemm_operands(desc, plan)
        bits = [np.ones(m.numel, np.float32).view(np.uint32) for m in desc.inputs]
        ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 1)

    rejects, misses, gemms = ext.tap_class_quick_rejects(), ext.tap_class_bound_misses(), ext.tap_class_gemms()
    chosen = []
    with _bound_audit(ext):
        for xs, ws, st, dil, pads, groups in shapes:
            g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
            for desc in (library.convolution(g, ws, groups), library.conv_grad_input(g, ws, groups),
                         library.conv_grad_weight(g, ws, groups)):
                before = ext.tap_class_gemms()
                run_ones(desc)
                chosen.append(ext.tap_class_gemms() > before)
    assert ext.tap_class_bound_misses() == misses, "the bound skipped classes that would have paid"
    assert ext.tap_class_quick_rejects() > rejects and any(chosen) and not all(chosen), chosen
    assert ext.tap_class_gemms() - gemms == sum(chosen)
    # the benchmark's forward: skipped by the bound (not audited: the classes are not built)
    rejects = ext.tap_class_quick_rejects()
    run_ones(library.convolution(ConvGeometry.make((32, 64, 32, 32), (3, 3), (1, 1), None, (1, 1, 1, 1)),
                                 (64, 64, 3, 3)))
    assert ext.tap_class_quick_rejects() == rejects + 1


@functools.cache
def _big_cases(shapes: tuple[tuple, ...] = tuple(BIG)) -> list[tuple]:  # type: ignore[type-arg]
    out = []
    for i, (xs, ws, st, dil, pads, groups) in enumerate(shapes):
        g = ConvGeometry.make(xs, ws[2:], st, dil, pads)
        for desc in (library.convolution(g, ws, groups), library.conv_grad_input(g, ws, groups),
                     library.conv_grad_weight(g, ws, groups)):
            plan = windowed.plan(desc)
            assert plan is not None
            ins = [edges.edge_array((m.numel,), 7 + i + t, 0.05, 2.0) for t, m in enumerate(desc.inputs)]
            want = reference.run(desc, ins).view(np.uint32).reshape(-1)
            a, b, nb, M, N = windowed.gemm_operands(desc, plan)
            flat = [np.asarray(x, dtype=np.float32).view(np.uint32).reshape(-1) for x in ins]
            out.append((desc, a, flat[plan.slot_a], b, flat[plan.slot_b], (nb, M, N), want))
    return out


@pytest.mark.parametrize("isa", ck.available_isas())
def test_gemm_written_in_the_output_order_equals_the_reference(isa: str) -> None:
    """Convolutions whose output ends with (channel, pixels) and whose pixels fill whole
    micro-tiles: the GEMM writes (image, group, channel, pixel) directly (column_split), with the
    reference's bits, groups (a batch axis) included; a split that would leave C is refused."""
    be = CpuBackend(isa=isa, threads=2)
    g = ConvGeometry.make((3, 8, 16, 16), (3, 3), pads=(1, 1, 1, 1))
    for groups in (1, 2):
        for desc in (library.convolution(g, (16, 8 // groups, 3, 3), groups),
                     library.conv_grad_input(g, (16, 8 // groups, 3, 3), groups)):
            plan = windowed.plan(desc)
            assert plan is not None
            split = be.column_split(desc, plan)
            assert split is not None and split[0] == 256, (desc.label, split)
            ins = [edges.edge_array((m.numel,), 11 + t, 0.05, 2.0) for t, m in enumerate(desc.inputs)]
            want = reference.run(desc, ins).view(np.uint32)
            assert (be(desc, ins).view(np.uint32) == want).all(), (isa, desc.label, groups)
            a, b, nb, M, N = windowed.gemm_operands(desc, plan)
            bits = [np.asarray(x, dtype=np.float32).view(np.uint32) for x in ins]
            got = ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 2, split=split)
            assert (got.numpy().view(np.uint32).reshape(want.shape) == want).all()
            with pytest.raises(RuntimeError, match="leaves the output"):
                ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 2,
                                   split=(split[0], split[1], split[2] + 1))
            with pytest.raises(RuntimeError, match="multiple of the micro-tile"):
                ck.windowed_matmul(a, bits[plan.slot_a], b, bits[plan.slot_b], nb, M, N, isa, 2, split=(3, 0, 0))


def test_plan_splits_batch_m_and_n_axes() -> None:
    g = ConvGeometry.make((2, 4, 9, 8), (3, 2), (2, 3), (1, 2), (2, 0, 1, 3))
    fwd, dx, dw = library.convolution(g, (6, 2, 3, 2), 2), library.conv_grad_input(g, (6, 2, 3, 2), 2), \
        library.conv_grad_weight(g, (6, 2, 3, 2), 2)
    # w is A, x im2col is B; the image axis joins the columns (w does not read it)
    assert windowed.plan(fwd) == windowed.WindowedGemm(1, 0, (1,), (2,), (0, 3, 4))
    assert windowed.plan(dx) == windowed.WindowedGemm(1, 0, (1,), (2,), (0, 3, 4))
    assert windowed.plan(dw) == windowed.WindowedGemm(0, 1, (0,), (1,), (2, 3, 4))


def test_what_is_not_a_windowed_gemm_runs_on_the_reference() -> None:
    g = ConvGeometry.make((1, 2, 5, 5), (3, 3), pads=(1, 1, 1, 1))
    conv = library.convolution(g, (2, 2, 3, 3), bias=True)
    # an epilogue that reads a chain register (r1) cannot start from r0 alone
    reads_r1 = dataclasses.replace(conv, epilogue=(Instr(Op.ADD, 0, 0, 1),))
    for desc in (library.max_pool(g), library.channel_sum((2, 3, 4)), reads_r1, library.matmul((3, 4), (4, 5))):
        assert windowed.plan(desc) is None, desc.label
    be = CpuBackend()
    ins = [edges.edge_array((m.numel,), 7 + t, 0.2, 3.0) for t, m in enumerate(reads_r1.inputs)]
    assert (be(reads_r1, ins).view(np.uint32) == reference.run(reads_r1, ins).view(np.uint32)).all()


def _dewindowed_descs() -> list[KernelDesc]:
    from verde_chain.repops.library import nn as lnn

    g = ConvGeometry.make((2, 3, 7, 6), (3, 2), (2, 1), (1, 2), (1, 0, 2, 1), True)
    xs = g.x_shape
    return [
        library.max_pool(g), library.max_pool_argmax(g), library.max_pool_backward(g), library.avg_pool(g, True),
        library.avg_pool(g, False), library.window_sum_backward(g), library.channel_mean(xs),
        library.channel_centered_meansq(xs), library.channel_dot_xhat(xs), library.channel_sum(xs),
        library.pad((2, 3, 4), (1, 0, -1, 0, 2, 1), 0.5), lnn.batch_norm_training(xs).nodes[-3].desc,
    ]


@pytest.mark.parametrize("isa", ck.available_isas())
def test_dewindowed_descriptors_equal_the_reference(isa: str) -> None:
    """Pooling, per-channel statistics and pad: gathered densely and run on the C++ kernels."""
    be = CpuBackend(isa=isa, threads=2)
    for i, desc in enumerate(_dewindowed_descs()):
        assert windowed.plan(desc) is None
        ins = [edges.edge_array((m.numel,), 300 + i + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
        flat = [x.view(np.uint32) for x in ins]
        dense = windowed.dewindow(desc, flat)
        assert dense is not None and not dense[0].extended, desc.label
        got, want = be(desc, ins).view(np.uint32), reference.run(desc, ins).view(np.uint32)
        assert (got == want).all(), (isa, desc.label)


def test_dewindowed_gathers_are_k_major_unless_the_plain_node_is_a_fold() -> None:
    """A fold (channel sum / mean, max pool) streams each output's row along k: row-major; an
    interpreter program (variance, dscale, argmax) reads k-major, its lanes consecutive at each k. Both give
    the reference's bits (test_dewindowed_descriptors_equal_the_reference); reading a k-major
    gather as row-major (the layout flag lost) is caught."""
    from verde_chain.repops.backends.plan import classify

    xs = (4, 8, 3, 5)
    for desc, kmajor in ((library.channel_sum(xs), False), (library.channel_mean(xs), False),
                         (library.channel_centered_meansq(xs), True), (library.channel_dot_xhat(xs), True),
                         (library.max_pool(ConvGeometry.make(xs, (2, 2))), False),
                         (library.max_pool_argmax(ConvGeometry.make(xs, (2, 2))), True)):
        dw = windowed.dewindow_plan(desc)
        assert dw is not None and dw.kmajor == kmajor, desc.label
        assert (classify(dw.plain).kind == "fold") == (not kmajor), desc.label
    desc = library.channel_centered_meansq(xs)
    dw = windowed.dewindow_plan(desc)
    assert dw is not None
    ins = [edges.edge_array((m.numel,), 9 + t, 0.0, 3.0) for t, m in enumerate(desc.inputs)]
    want = reference.run(desc, ins).view(np.uint32)
    lost = dataclasses.replace(dw, kmajor=False)  # row-major gathers under k-major maps
    plain, data = windowed.dewindow(desc, [x.view(np.uint32) for x in ins], dw=lost) or (None, [])
    assert plain is not None
    assert (reference.run(plain, [d.view(np.float32) for d in data]).view(np.uint32) != want).any()


def _k_runs(op: windowed.Operand) -> int:
    """How many runs of evenly stepping k (conv.cpp's table_run over the k table) ``op`` has."""
    ks, n, k = op.ks, 0, 0
    while k < len(ks):
        d = ks[k + 1] - ks[k] if k + 1 < len(ks) else None
        length = 1
        if d is not None and (d[1:] >= 0).all():
            while k + length < len(ks) and (ks[k + length] - ks[k] == length * d).all():
                length += 1
        n, k = n + 1, k + length
    return n


def _gather_path(op: windowed.Operand) -> str:
    """Which of windowed_gather's paths (kernels/cpu/conv.cpp, gather_block) reads ``op``."""
    divs = op.wins[:, 0].tolist()
    if len(divs) <= 3 and all(d == 1 for d in divs):
        return "k runs" if 4 * _k_runs(op) <= len(op.ks) else "row runs"
    return "any"


@functools.cache
def _gather_cases(gpu_check: ModuleType) -> list[tuple[windowed.Operand, np.ndarray, np.ndarray, str]]:
    """(operand, input bits, Operand.gather's bits, path) of every windowed input of the conv
    cases (scripts/gpu_check.py) and the dewindowed descriptors."""
    out = []
    for i, desc in enumerate(gpu_check.conv_descs(gpu_check.CONV_CASES) + _dewindowed_descs()):
        for t, m in enumerate(desc.inputs):
            if not m.windows:
                continue
            axes = tuple(d for d in range(len(desc.out_shape)) if windowed._depends(m, d))
            op = windowed.operand(desc, t, axes)
            bits = edges.edge_array((m.numel,), 40 + i + t, 0.2, 3.0).view(np.uint32)
            out.append((op, bits, op.gather(bits), _gather_path(op)))
    return out


@pytest.mark.parametrize("isa", ck.available_isas())
@pytest.mark.parametrize("threads", [1, 3])
def test_native_gather_equals_the_operand_tables(isa: str, threads: int,
                                                script: Callable[[str], ModuleType]) -> None:
    """windowed_gather (C++) reads every (row, k) of an operand as Operand.gather does, on each
    of its paths: div == 1 windows as runs along k (channel statistics) or along rows (pooling),
    div > 1 element by element (strided pool backward and grad input); fills, always-in-range
    windows dropped."""
    paths = []
    for op, bits, want, path in _gather_cases(script("gpu_check")):
        got = ck.windowed_gather(op, bits, isa, threads).numpy().view(np.uint32)
        assert (got == want).all(), (isa, path)
        kmajor = ck.windowed_gather(op, bits, isa, threads, kmajor=True).numpy().view(np.uint32)
        assert (kmajor == want.T).all(), (isa, path, "k-major")
        paths.append(path)
    assert {"k runs", "row runs", "any"} <= set(paths), paths


@functools.cache
def _big_gathers() -> list[tuple[windowed.Operand, np.ndarray, np.ndarray]]:
    """Operands big enough for windowed_gather to use several threads: max pool's input (row
    runs, stride 2), its backward's dy (divisor 2: element by element) and a channel
    statistic's input (k runs)."""
    g = ConvGeometry.make((16, 16, 32, 32), (3, 3), (2, 2), None, (1, 1, 1, 1))
    out = []
    for desc, slot in ((library.max_pool(g), 0), (library.max_pool_backward(g), 1),
                       (library.channel_sum((32, 32, 16, 16)), 0)):
        m = desc.inputs[slot]
        op = windowed.operand(desc, slot, tuple(d for d in range(len(desc.out_shape)) if windowed._depends(m, d)))
        bits = edges.edge_array((m.numel,), 77 + slot, 0.2, 3.0).view(np.uint32)
        out.append((op, bits, op.gather(bits)))
    assert [_gather_path(op) for op, _, _ in out] == ["row runs", "any", "k runs"]
    return out


@pytest.mark.parametrize("isa", ck.available_isas())
@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_native_gather_on_several_os_threads(isa: str, threads: int) -> None:
    """The gather's row blocks run on the pool (more than one OS thread at threads > 1) and give
    Operand.gather's bits whatever ran them; mutated tables (k reversed, windows one element
    narrower) are caught."""
    for op, bits, want in _big_gathers():
        got = engaged(isa, threads, functools.partial(ck.windowed_gather, op, bits, isa, threads)).numpy()
        got = got.view(np.uint32)
        assert (got == want).all(), (isa, threads)
        kmajor = engaged(isa, threads, functools.partial(ck.windowed_gather, op, bits, isa, threads, True)).numpy()
        assert (kmajor.view(np.uint32) == want.T).all(), (isa, threads, "k-major")
        mutants = [dataclasses.replace(op, ks=np.ascontiguousarray(op.ks[::-1]))]  # k in the wrong order
        if len(op.wins):
            mutants.append(dataclasses.replace(op, wins=op.wins - np.array([0, 1, 0])))  # narrower windows
        for bad in mutants:
            assert (ck.windowed_gather(bad, bits, isa, threads).numpy().view(np.uint32) != want).any()


# ----------------------------------------------------------------------------- max-pool backward

_POOL_GEOMETRIES = [  # (x shape, kernel, strides, dilations, pads, ceil_mode)
    ((2, 3, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),  # resnet's stem pool
    ((2, 2, 7, 8), (2, 3), (1, 2), (2, 1), (0, 1, 1, 0), True),  # dilated, asymmetric pads, ceil
    ((2, 2, 8, 8), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), False),  # LeNet's: no overlap
    ((3, 2, 11), (3,), (2,), (1,), (1, 0), False),  # 1-D
    ((1, 2, 5, 6, 7), (2, 2, 3), (2, 1, 2), (1, 1, 1), (0, 0, 1, 1, 0, 1), True),  # 3-D
    ((2, 2, 5, 5), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), False),  # K = 1: no ADD at all
]


def _pool_backward_inputs(desc: KernelDesc, seed: int) -> list[np.ndarray]:
    """(arg, dy): arg mostly taps (as the argmax writes them), with -0 (EQ to tap 0), a
    non-integral value, NaN, K and -1 sprinkled in (no tap); dy with edge values (-0, NaN
    payloads, subnormals, infinities)."""
    rng = np.random.default_rng(seed)
    n, K = desc.inputs[0].numel, desc.K
    arg = rng.integers(0, K, n).astype(np.float32)
    for value in (-0.0, 0.5, np.nan, float(K), -1.0):
        arg[rng.random(n) < 0.06] = value
    return [arg, edges.edge_array((desc.inputs[1].numel,), seed + 1, 0.3, 3.0)]


@pytest.mark.parametrize("isa", ck.available_isas())
def test_max_pool_backward_scatter_form_equals_the_reference(isa: str) -> None:
    """The scatter form (kernels/cpu/window_plan.cpp pool_backward_into) of every pool geometry:
    the reference's bits, with the -0, NaN and no-tap edge cases; both entry points (the backend
    call and the extension's own) run it."""
    be = CpuBackend(isa=isa, threads=2)
    for i, spec in enumerate(_POOL_GEOMETRIES):
        desc = library.max_pool_backward(ConvGeometry.make(*spec))
        form = windowed.max_pool_backward_plan(desc)
        assert form is not None and be.windowed_prepare(desc).pool_backward is not None, spec
        ins = _pool_backward_inputs(desc, 10 + i)
        want = reference.run(desc, ins).view(np.uint32)
        assert (be(desc, ins).view(np.uint32) == want).all(), (isa, spec)
        flat = [x.view(np.uint32) for x in ins]
        assert (ck.pool_backward(form, *flat, isa, 1).numpy().view(np.uint32) == want.reshape(-1)).all()


@functools.cache
def _big_pool_backward() -> tuple[KernelDesc, windowed.MaxPoolBackward, list[np.ndarray], np.ndarray]:
    desc = library.max_pool_backward(ConvGeometry.make((8, 16, 32, 32), (3, 3), (2, 2), None, (1, 1, 1, 1)))
    form = windowed.max_pool_backward_plan(desc)
    assert form is not None
    ins = _pool_backward_inputs(desc, 5)
    return desc, form, [x.view(np.uint32) for x in ins], reference.run(desc, ins).view(np.uint32).reshape(-1)


@pytest.mark.parametrize("isa", ck.available_isas())
@pytest.mark.parametrize("threads", THREAD_COUNTS)
def test_max_pool_backward_on_several_os_threads(isa: str, threads: int) -> None:
    """Whole planes are the items: more than one OS thread at threads > 1, the reference's bits
    whatever ran them; a form with the taps of the two axes swapped (the digits' strides) or the
    planes shifted is caught."""
    _, form, flat, want = _big_pool_backward()
    got = engaged(isa, threads, functools.partial(ck.pool_backward, form, *flat, isa, threads)).numpy()
    assert (got.view(np.uint32) == want).all(), (isa, threads)
    swapped = form.axes.copy()
    swapped[:, 6] = swapped[::-1, 6]
    shifted = np.ascontiguousarray(np.roll(form.plane_off, 1))
    for bad in (dataclasses.replace(form, axes=swapped), dataclasses.replace(form, plane_off=shifted)):
        assert (ck.pool_backward(bad, *flat, isa, threads).numpy().view(np.uint32) != want).any()


def test_max_pool_backward_with_another_rule_is_not_the_scatter_form() -> None:
    """Only max_pool_backward's exact program (and maps) takes the scatter form: a different
    routing rule (LT for EQ), the chain from tap 1 (t counted from 1.0) or an argmax fill that is
    a tap (the padding then routes dy's fill to tap 0) run as written, on the dewindowed path, and give other bits than the original."""
    desc, _, flat, want = _big_pool_backward()
    pro = list(desc.prologue)
    lt = [dataclasses.replace(i, op=Op.LT) if i.op == Op.EQ else i for i in pro]
    from_one = [pro[0], Instr(Op.MOV, 4, 3), *pro[1:]]  # r4 = t starts at 1.0
    mutants = [
        dataclasses.replace(desc, prologue=tuple(lt)),
        dataclasses.replace(desc, prologue=tuple(from_one)),
        dataclasses.replace(desc, inputs=(dataclasses.replace(desc.inputs[0], fill=0),  # padding routes dy's fill
                                          dataclasses.replace(desc.inputs[1], fill=0x3F800000))),
    ]
    be = CpuBackend(threads=2)
    ins = [x.view(np.float32) for x in flat]
    for bad in mutants:
        assert windowed.max_pool_backward_plan(bad) is None
        got = be(bad, ins).view(np.uint32).reshape(-1)
        assert (got == reference.run(bad, ins).view(np.uint32).reshape(-1)).all()
        assert (got != want).any()


def test_loadidx_of_a_windowed_input_is_not_dewindowed() -> None:
    from verde_chain.repops.program import InputMap, Window

    m = InputMap(4, (0,), idx_stride=1, windows=(Window(0, 1, 0, 0, -1, 1, 1, 0),))
    d = KernelDesc((3,), 1, (m,), (Instr(Op.CONST, 1, imm=0), Instr(Op.LOADIDX, 0, 1, 0, 0)))
    assert windowed.dewindow(d, [np.arange(4, dtype=np.uint32)]) is None
    ins = [np.arange(4, dtype=np.float32)]
    assert (CpuBackend()(d, ins).view(np.uint32) == reference.run(d, ins).view(np.uint32)).all()


@pytest.mark.parametrize("native", [False, True], ids=["explicit", "windowed_matmul"])
def test_cuda_backend_runs_window_descriptors_through_its_gemm_and_interpreter(  # type: ignore[no-untyped-def]
    host, monkeypatch: pytest.MonkeyPatch, conv_descs: list[KernelDesc], native: bool
) -> None:
    """The CUDA backend (here its CPU stand-in: the C++ GEMMs and the host build of the device
    interpreter) runs convolutions on the binding's windowed GEMM (tables moved to the device),
    or, with an extension without one, gathers the operands on the host for its plain GEMM;
    the plain programs run as its own; same bits as the reference, and no whole-step kernel
    for a graph with windows."""
    from tests.support.cuda_host import StandInExtension, WindowedStandInExtension
    from verde_chain.repops.backends.cuda import backend as cuda_backend
    from verde_chain.repops.backends.cuda.backend import CudaBackend

    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    ext = WindowedStandInExtension(host) if native else StandInExtension(host)
    be = CudaBackend(device="cpu", ext=ext)
    for i, desc in enumerate(conv_descs[:3] + _dewindowed_descs()):
        ins = [edges.edge_array((m.numel,), 500 + i + t, 0.2, 3.0) for t, m in enumerate(desc.inputs)]
        assert (be(desc, ins).view(np.uint32) == reference.run(desc, ins).view(np.uint32)).all(), desc.label
    assert ext.calls.get("windowed_matmul", 0) == (3 if native else 0)
    assert ext.calls["matmul3"] >= (0 if native else 3) and ext.calls["run_program"] >= len(_dewindowed_descs())
    assert be.compile_step(conv_descs[:1], [[(0, 0), (0, 0)]], [0], 1) is None

"""Windowed dot chains (convolution and its gradients) as an explicit GEMM, bit for bit.

A descriptor whose program is the spec's dot chain (``r0 = MUL(a_0, b_0)``, then
``r0 = FMA(a_k, b_k, r0)``) over two windowed inputs is a batched matrix product once each
operand is read as a matrix: output axes split into batch axes (that both inputs read), M axes
(that only input A reads) and N axes (the rest). :func:`operand` describes how
each operand's element (row, k) is read — its address split into a row part and a k part, the
windows to check, the fill where one is out of range — and any GEMM that keeps the one chain per
output element (k ascending, first product rounded, then FMA) gives the descriptor's bits. MUL
and FMA are commutative in their two factors, so which input plays A does not matter.

The C++ backend packs its GEMM panels straight from those tables (``kernels/cpu/conv.cpp``:
implicit im2col, no unfolded copy); :func:`explicit` gathers both operands first (im2col made
explicit) for a backend with a plain GEMM only (CUDA). An epilogue (conv's bias) runs on the
reference afterwards with ``r0`` preset, when it reads no register but r0 and its loads do not
depend on k.

Every other window descriptor (pooling, per-channel statistics, pad) is *dewindowed*
(:func:`dewindow`): each windowed input is gathered at every (k, output coordinate it reads),
fill included, into a dense k-major tensor that a plain map reads with the same coordinates and
k — the same program then reads the same bits from it, on any backend's interpreter. (A LOADIDX
of a windowed input adds its index to the original address, which the dense copy has lost: such
a descriptor stays on the reference.) MaxPool's backward has a scatter form besides
(:func:`max_pool_backward_plan`): each (argmax, dy) entry visited once instead of every
(position, tap) gathered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from verde_chain.repops import reference
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.shapes import c_strides
from verde_chain.repops.program import InputMap, KernelDesc, Runner, check_inputs

Gemm = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (nb, M, K) @ (nb, K, N) -> (nb, M, N)


@dataclass(frozen=True)
class WindowedGemm:
    """The GEMM shape of a windowed dot descriptor: which slot is A (M side) and B (N side),
    and the output axes of each role (each in ascending order); the GEMM's result has the axes
    batch, then m, then n (:func:`to_output` puts them back in the output's order)."""

    slot_a: int
    slot_b: int
    batch: tuple[int, ...]
    m: tuple[int, ...]
    n: tuple[int, ...]


def _depends(m: InputMap, axis: int) -> bool:
    return m.strides[axis] != 0 or any(w.out_mul and w.axis == axis for w in m.windows)


def _epilogue_ok(desc: KernelDesc) -> bool:
    """The epilogue only reads r0 from the chain, and its loads do not depend on k."""
    from verde_chain.repops.backends.plan import live_in

    if not live_in(desc.epilogue) <= {0}:
        return False
    for ins in desc.epilogue:
        if ins.op in (Op.LOAD, Op.LOADIDX):
            m = desc.inputs[ins.imm]
            if m.kstride or any(w.k_mul for w in m.windows):
                return False
    return True


def plan(desc: KernelDesc) -> WindowedGemm | None:
    """The GEMM shape of ``desc``, or None when it is not a windowed dot chain."""
    from verde_chain.repops.backends.plan import _match_dot  # the one recogniser of the dot chain

    slots = _match_dot(desc)
    if slots is None or slots[0] == slots[1] or not desc.extended or not _epilogue_ok(desc):
        return None
    rank = len(desc.out_shape)
    if rank == 0:
        return None
    s0, s1 = slots
    m0, m1 = desc.inputs[s0], desc.inputs[s1]
    # B is the input that reads the last output axis (A does not)
    if _depends(m0, rank - 1) and not _depends(m1, rank - 1):
        (sa, ma), (sb, mb) = (s1, m1), (s0, m0)
    else:
        (sa, ma), (sb, mb) = (s0, m0), (s1, m1)
    # axes both read are batch axes, axes only A reads are rows, the rest columns: the image axis
    # of a convolution (not read by the weights) joins the columns, so small feature maps still
    # give wide GEMMs
    batch = tuple(a for a in range(rank) if _depends(ma, a) and _depends(mb, a))
    rows = tuple(a for a in range(rank) if _depends(ma, a) and not _depends(mb, a))
    cols = tuple(a for a in range(rank) if not _depends(ma, a))
    return WindowedGemm(sa, sb, batch, rows, cols)


def to_output(desc: KernelDesc, g: WindowedGemm, c: np.ndarray) -> np.ndarray:
    """The GEMM's result ``(nb, M, N)`` (axes batch, m, n) in the output's C order."""
    perm = g.batch + g.m + g.n
    c = c.reshape([desc.out_shape[a] for a in perm])
    if perm == tuple(range(len(perm))):
        return c
    return np.ascontiguousarray(c.transpose(np.argsort(perm)))


def column_split(desc: KernelDesc, g: WindowedGemm, width: int) -> tuple[int, int, int] | None:
    """``(n_inner, batch stride, outer stride)`` when the GEMM can write its result in the
    output's order directly: the output ends with the m axes, then the last n axes (n_inner
    elements, a multiple of ``width``), and the batch axes and the other n axes are each
    consecutive (a convolution: image, group, channel, pixels). Element (b, i, j) of the GEMM is
    then output element ``b*batch_stride + (j // n_inner)*outer_stride + i*n_inner + j % n_inner``.
    None: only the GEMM's own (batch, m, n) order (:func:`to_output`)."""
    rank, st = len(desc.out_shape), c_strides(desc.out_shape)

    def flat_stride(axes: tuple[int, ...]) -> int | None:  # of the C-order flat index over axes
        if not axes:
            return 0
        return st[axes[-1]] if axes == tuple(range(axes[0], axes[-1] + 1)) else None

    for p in range(1, len(g.n)):
        tail = g.m + g.n[p:]
        if tail != tuple(range(rank - len(tail), rank)):
            continue
        inner = math.prod(desc.out_shape[a] for a in g.n[p:])
        sb, so = flat_stride(g.batch), flat_stride(g.n[:p])
        if inner % width or sb is None or so is None:
            return None
        return inner, sb, so
    return None


@dataclass(frozen=True)
class Operand:
    """One windowed input read as a matrix: rows are the output coordinates of the axes it reads
    (C order), columns are k. Element (r, k) is ``data[rows[0, r] + ks[k, 0]]`` unless a checked
    window is out of range (then ``fill``): window w has ``v = rows[1+w, r] + ks[k, 1+w]`` and
    ``wins[w] = (div, size, stride)``, in range iff ``v >= 0``, ``v % div == 0``, ``v/div < size``;
    a ``div > 1`` window adds ``(v/div)*stride`` to the address. A ``div == 1`` window's term
    ``v*stride`` splits into a row part and a k part, folded into ``rows[0]`` / ``ks[:, 0]`` (its
    stride entry is then 0), and it is dropped if it is in range for every (r, k)."""

    rows: np.ndarray  # int64 (1 + c, R)
    ks: np.ndarray  # int64 (K, 1 + c)
    wins: np.ndarray  # int64 (c, 3)
    fill: int

    def gather(self, flat: np.ndarray) -> np.ndarray:
        """Every element, ``(R, K)`` raw bits (im2col made explicit)."""
        addr = self.rows[0][:, None] + self.ks[None, :, 0]
        inside: np.ndarray | bool = True
        for w, (div, size, stride) in enumerate(self.wins.tolist()):
            v = self.rows[1 + w][:, None] + self.ks[None, :, 1 + w]
            q = v // div
            inside = inside & (v >= 0) & (v - q * div == 0) & (q < size)
            if div != 1:
                addr = addr + q * stride
        if inside is True:
            return flat[addr]
        return np.where(inside, flat[np.where(inside, addr, 0)], np.uint32(self.fill))


def operand(desc: KernelDesc, slot: int, axes: Sequence[int]) -> Operand:
    """Input ``slot`` of ``desc`` as an :class:`Operand` over the output axes ``axes`` (the
    others at coordinate 0: the input does not read them)."""
    m = desc.inputs[slot]
    dims = [desc.out_shape[a] for a in axes]
    coord = dict(zip(axes, np.unravel_index(np.arange(math.prod(dims), dtype=np.int64), dims)))
    R, K = math.prod(dims), desc.K
    kd = np.unravel_index(np.arange(K, dtype=np.int64), desc.digit_dims)
    row_addr = np.full(R, m.offset, dtype=np.int64)
    for a, c in coord.items():
        if m.strides[a]:
            row_addr = row_addr + c * m.strides[a]
    k_addr = np.arange(K, dtype=np.int64) * m.kstride
    rows, ks, wins = [row_addr], [k_addr], []
    for w in m.windows:
        rv = coord[w.axis] * w.out_mul if w.out_mul else np.zeros(R, dtype=np.int64)
        kv = (kd[w.digit] * w.k_mul if w.k_mul else np.zeros(K, dtype=np.int64)) + w.offset
        if w.div == 1:
            rows[0] = rows[0] + rv * w.stride
            ks[0] = ks[0] + kv * w.stride
            if int(rv.min()) + int(kv.min()) >= 0 and int(rv.max()) + int(kv.max()) < w.size:
                continue
            wins.append((1, w.size, 0))
        else:
            wins.append((w.div, w.size, w.stride))
        rows.append(rv)
        ks.append(kv)
    return Operand(np.ascontiguousarray(np.stack(rows), dtype=np.int64),
                   np.ascontiguousarray(np.stack(ks, axis=1), dtype=np.int64),
                   np.asarray(wins, dtype=np.int64).reshape(-1, 3), m.fill)


WindowedGemmFn = Callable[[Operand, np.ndarray, Operand, np.ndarray, int, int, int], np.ndarray]
"""``(a, a_bits, b, b_bits, nb, M, N) -> C (nb, M, N)``: A's rows are ``nb*M``, B's ``nb*N``."""


def explicit(gemm: Gemm) -> WindowedGemmFn:
    """A windowed GEMM from a plain one: both operands gathered (explicit im2col), then ``gemm``."""

    def run(a: Operand, a_bits: np.ndarray, b: Operand, b_bits: np.ndarray, nb: int, M: int, N: int) -> np.ndarray:
        A = a.gather(a_bits).reshape(nb, M, -1)
        B = b.gather(b_bits).reshape(nb, N, -1).transpose(0, 2, 1)
        return gemm(np.ascontiguousarray(A).view(np.float32), np.ascontiguousarray(B).view(np.float32))

    return run


Gather = Callable[[Operand, np.ndarray, bool], np.ndarray]
"""``(operand, bits, kmajor) -> (R, K)`` raw bits, ``(K, R)`` if ``kmajor``: every element
(``Operand.gather``, or a native one)."""


def gemm_operands(desc: KernelDesc, g: WindowedGemm) -> tuple[Operand, Operand, int, int, int]:
    """The two operands of ``g`` and its ``(nb, M, N)``."""
    shape = desc.out_shape
    nb = math.prod(shape[a] for a in g.batch)
    M, N = math.prod(shape[a] for a in g.m), math.prod(shape[a] for a in g.n)
    return operand(desc, g.slot_a, g.batch + g.m), operand(desc, g.slot_b, g.batch + g.n), nb, M, N


@dataclass(frozen=True)
class Dewindowed:
    """``desc`` over plain maps: ``plain`` reads, in place of each windowed input ``slot``, the
    dense ``(R, K)`` gather of ``operands[slot]`` (C order), ``(K, R)`` if ``kmajor``; every
    other input as it is."""

    plain: KernelDesc
    operands: dict[int, Operand]
    kmajor: bool = False


def dewindow_plan(desc: KernelDesc) -> Dewindowed | None:
    """The structure of :func:`dewindow` (it depends on the descriptor alone); None if a LOADIDX
    reads a windowed input. The gathers are k-major unless the plain descriptor is a fold: an
    interpreter's lanes (consecutive outputs) then read consecutive entries at each k (row-major,
    a channel statistic's rows lie K apart, a power of two that mapped every lane's load to one
    cache set), while a fold (plan.classify) streams each output's row along k."""
    from verde_chain.repops.backends.plan import classify

    programs = desc.prologue + desc.body + desc.epilogue
    if any(i.op == Op.LOADIDX and desc.inputs[i.imm].windows for i in programs):
        return None
    operands = {t: operand(desc, t, _read_axes(desc, m)) for t, m in enumerate(desc.inputs) if m.windows}
    row_major = _dense(desc, operands, False)
    if classify(row_major).kind == "fold":
        return Dewindowed(row_major, operands)
    return Dewindowed(_dense(desc, operands, True), operands, kmajor=True)


def _read_axes(desc: KernelDesc, m: InputMap) -> tuple[int, ...]:
    return tuple(d for d in range(len(desc.out_shape)) if _depends(m, d))


def _dense(desc: KernelDesc, operands: dict[int, Operand], kmajor: bool) -> KernelDesc:
    """``desc`` reading each gathered operand: ``(*dims of its axes, K)``, or ``(K, *dims)``."""
    rank = len(desc.out_shape)
    maps: list[InputMap] = []
    for t, m in enumerate(desc.inputs):
        if t not in operands:
            maps.append(m)
            continue
        axes = _read_axes(desc, m)
        dims = [desc.out_shape[a] for a in axes]
        st = c_strides((desc.K, *dims) if kmajor else (*dims, desc.K))
        ax_st, k_st = (st[1:], st[0]) if kmajor else (st[:-1], st[-1])
        strides = tuple(ax_st[axes.index(d)] if d in axes else 0 for d in range(rank))
        maps.append(InputMap(desc.K * math.prod(dims), strides, kstride=k_st if desc.K > 1 else 0))
    return KernelDesc(desc.out_shape, desc.K, tuple(maps), desc.prologue, desc.body, desc.epilogue,
                      label=f"{desc.label}/dewindowed")


@dataclass(frozen=True)
class MaxPoolBackward:
    """``max_pool_backward``'s descriptor (docs/repops-spec.md) in scatter form, for a kernel that
    visits each (arg, dy) entry once instead of gathering every (input position, tap): entry q of
    plane p (``plane_off[p] + sum q_i*stride_i`` in both inputs) whose arg is a tap t (the one
    value EQ(arg, t) holds for: an integral float in [0, K), -0 included) is the term of input
    position ``x_i = q_i*div_i - k_mul_i*kd_i(t) - offset_i`` at tap t, if x lies inside the
    plane; every other term is +0. The chain per input position (the term of tap 0, then ADD
    the others, t ascending) then runs over those terms: the spec's bits, -0 and NaN included.

    ``axes`` rows, one per windowed (last) output axis: ``S, O, div, k_mul, offset, stride,
    digit stride, digit size`` (``kd_i(t) = (t // digit stride) % digit size``); the output is
    ``planes x prod(S)`` in C order."""

    axes: np.ndarray  # int64 (r, 8)
    plane_off: np.ndarray  # int64 (planes,)
    K: int


def max_pool_backward_plan(desc: KernelDesc) -> MaxPoolBackward | None:
    """The scatter form of ``desc`` if it is ``library.max_pool_backward``'s program over two
    maps that read the same (arg, dy) entry per (position, tap), every window on its own
    trailing axis with ``out_mul == 1``, the arg's fill never a tap, and every entry of the
    (planes x O) box inside both inputs; else None."""
    from verde_chain.repops.library.conv import MAX_POOL_BACKWARD_BODY, MAX_POOL_BACKWARD_PROLOGUE

    K, rank = desc.K, len(desc.out_shape)
    if (len(desc.inputs) != 2 or desc.epilogue or desc.prologue != MAX_POOL_BACKWARD_PROLOGUE
            or desc.body != (MAX_POOL_BACKWARD_BODY if K > 1 else ())):
        return None
    arg, dy = desc.inputs
    if (arg.strides, arg.offset, arg.windows) != (dy.strides, dy.offset, dy.windows) or arg.kstride or dy.kstride:
        return None
    fill = float(np.uint32(arg.fill).view(np.float32))
    if not math.isnan(fill) and 0 <= fill < K and fill == int(fill):  # EQ(fill, t) would hold for t = fill
        return None
    r = len(arg.windows)
    if not 1 <= r <= 3 or r > rank:
        return None
    dstride = c_strides(desc.digit_dims)
    rows = []
    for i, w in enumerate(arg.windows):
        axis = rank - r + i
        if w.axis != axis or w.out_mul != 1 or arg.strides[axis] != 0 or not 0 <= w.digit < len(desc.digit_dims):
            return None
        rows.append((desc.out_shape[axis], w.size, w.div, w.k_mul, w.offset, w.stride, dstride[w.digit],
                     desc.digit_dims[w.digit]))
    outer = desc.out_shape[:rank - r]
    grid = np.indices(outer, dtype=np.int64).reshape(len(outer), -1) if outer else np.zeros((0, 1), np.int64)
    plane_off = arg.offset + np.asarray(arg.strides[:rank - r], dtype=np.int64) @ grid
    axes = np.asarray(rows, dtype=np.int64).reshape(r, 8)
    last = int(plane_off.max()) + int(((axes[:, 1] - 1) * axes[:, 5]).sum())
    if int(plane_off.min()) < 0 or int(axes[:, 5].min()) < 0 or last >= min(arg.numel, dy.numel):
        return None
    return MaxPoolBackward(axes, np.ascontiguousarray(plane_off), K)


@dataclass(frozen=True)
class Prepared:
    """What a backend keeps per descriptor: its GEMM plan and operand tables (None if it is not
    a windowed dot chain), else its dewindowed form (None if it has none) and its max-pool
    backward scatter form (None if it is not one); they depend on the descriptor alone (and a
    backend that caches its plain descriptors by identity sees the same one every call)."""

    gemm: WindowedGemm | None
    operands: tuple[Operand, Operand, int, int, int] | None
    dewindowed: Dewindowed | None = None
    pool_backward: MaxPoolBackward | None = None


def prepare(desc: KernelDesc) -> Prepared:
    g = plan(desc)
    if g is None:
        return Prepared(None, None, dewindow_plan(desc), max_pool_backward_plan(desc))
    return Prepared(g, gemm_operands(desc, g))


def dewindow(desc: KernelDesc, flat: Sequence[np.ndarray], gather: Gather | None = None,
             dw: Dewindowed | None = None) -> tuple[KernelDesc, list[np.ndarray]] | None:
    """The same program over plain maps: each windowed input gathered densely at (the output axes
    it reads, k), k-major if ``dw.kmajor``, by ``gather`` if given; None if a LOADIDX reads a windowed input. ``dw``:
    ``dewindow_plan(desc)``, if the caller keeps it."""
    dw = dewindow_plan(desc) if dw is None else dw
    if dw is None:
        return None
    data = []
    for t, x in enumerate(flat):
        op = dw.operands.get(t)
        if op is not None:
            x = gather(op, x, dw.kmajor) if gather is not None else op.gather(x).T if dw.kmajor else op.gather(x)
        data.append(np.ascontiguousarray(x).reshape(-1))
    return dw.plain, data


PoolBackwardFn = Callable[[MaxPoolBackward, np.ndarray, np.ndarray], np.ndarray]
"""``(form, arg bits, dy bits) -> dx`` (float32, any shape of ``numel`` elements): a native
max-pool backward in scatter form."""


def run(desc: KernelDesc, inputs: Sequence[np.ndarray], gemm: WindowedGemmFn, plain: Runner | None = None,
        gather: Gather | None = None, prepared: Prepared | None = None, ordered: bool = False,
        pool_backward: PoolBackwardFn | None = None) -> np.ndarray:
    """Execute ``desc``: with ``gemm`` if it is a windowed dot chain, else dewindowed (by
    ``gather``) on ``plain`` (a runner of plain descriptors), else on the reference; float32 of
    ``out_shape``, the reference's bits either way. ``prepared``: ``prepare(desc)``, if the
    caller keeps it; ``ordered``: ``gemm`` returns the output's order already (column_split);
    ``pool_backward``: runs a max-pool backward's scatter form (``Prepared.pool_backward``)."""
    prep = prepare(desc) if prepared is None else prepared
    g = prep.gemm
    flat = check_inputs(desc, inputs)
    if prep.pool_backward is not None and pool_backward is not None:
        return np.asarray(pool_backward(prep.pool_backward, flat[0], flat[1]), dtype=np.float32).reshape(desc.out_shape)
    if g is None:
        dense = dewindow(desc, flat, gather, prep.dewindowed) if plain is not None else None
        if dense is None or plain is None:
            return reference.run(desc, inputs)
        return np.asarray(plain(dense[0], dense[1])).reshape(desc.out_shape)
    a, b, nb, M, N = prep.operands or gemm_operands(desc, g)
    c = np.asarray(gemm(a, flat[g.slot_a], b, flat[g.slot_b], nb, M, N), dtype=np.float32)
    r0 = c.reshape(-1) if ordered else to_output(desc, g, c).reshape(-1)
    if not desc.epilogue:
        return r0.reshape(desc.out_shape)
    # the epilogue over r0: a map reading r0 from an extra input, then the epilogue as is
    n = len(desc.inputs)
    r0_map = InputMap(r0.size, c_strides(desc.out_shape))
    ones = (1,) * len(desc.digit_dims)  # k = 0 for every digit: the epilogue's loads ignore k
    epi = KernelDesc(desc.out_shape, 1, (*desc.inputs, r0_map), (Instr(Op.LOAD, 0, imm=n), *desc.epilogue),
                     kdims=ones, label=f"{desc.label}/epilogue")
    return reference.run(epi, [*flat, r0.view(np.uint32)])

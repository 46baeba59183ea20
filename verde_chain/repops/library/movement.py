"""Data movement: kernels that copy elements (LOAD only, raw bits) to new positions.

Most are a ``strided_copy``: the output element at coordinates c reads input address
``offset + sum_d c[d] * strides[d]``. Transpose permutes strides, expand zeroes them, slice
scales and offsets them; reshape is a plain copy (inside a graph a reshape is a free view and
needs no node at all). Concat, the slice's gradient, Trilu and ``write_row`` choose per element
(COORD, LOADIDX and SELECT).
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op, f32_bits
from verde_chain.repops.library.asm import I, const, coord, load, loadidx
from verde_chain.repops.library.shapes import as_shape, broadcast_map, broadcast_shapes, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc, Window


def strided_copy(
    out_shape: Sequence[int], in_numel: int, strides: Sequence[int], offset: int = 0, label: str = "copy"
) -> KernelDesc:
    """out[c] = in[offset + sum_d c[d] * strides[d]]: one LOAD."""
    m = InputMap(in_numel, as_shape(strides), 0, offset)
    return KernelDesc(as_shape(out_shape), 1, (m,), (load(0, 0),), label=label)


def transpose(shape: Sequence[int], perm: Sequence[int] | None = None) -> KernelDesc:
    shp = as_shape(shape)
    p = tuple(reversed(range(len(shp)))) if perm is None else tuple(a % len(shp) for a in perm) if shp else ()
    if sorted(p) != list(range(len(shp))):
        raise RepOpsError(f"transpose: {perm} is not a permutation of rank {len(shp)}")
    st = c_strides(shp)
    return strided_copy(tuple(shp[a] for a in p), numel(shp), tuple(st[a] for a in p), label="transpose")


def reshape(shape: Sequence[int], new_shape: Sequence[int]) -> KernelDesc:
    new = as_shape(new_shape)
    if numel(new) != numel(shape):
        raise RepOpsError(f"reshape: {tuple(shape)} -> {new} changes the element count")
    return strided_copy(new, numel(shape), c_strides(new), label="reshape")


def expand(shape: Sequence[int], out_shape: Sequence[int]) -> KernelDesc:
    out = broadcast_shapes("expand", shape, out_shape)
    return KernelDesc(out, 1, (broadcast_map(as_shape(shape), out),), (load(0, 0),), label="expand")


def slice_(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int], steps: Sequence[int]) -> KernelDesc:
    """x[start:end:step] per axis (already clamped/normalised python-slice semantics)."""
    shp = as_shape(shape)
    st = c_strides(shp)
    out, strides, off = [], [], 0
    for d, n in enumerate(shp):
        rng = range(*slice(starts[d], ends[d], steps[d]).indices(n))
        if len(rng) == 0:
            raise RepOpsError("slice: empty results are not supported")
        out.append(len(rng))
        strides.append(rng.step * st[d])
        off += rng.start * st[d]
    return strided_copy(out, numel(shp), strides, off, label="slice")


def concat(shapes: Sequence[Sequence[int]], axis: int) -> KernelDesc:
    """ONNX Concat: input t covers [off_t, off_t + n_t) along ``axis``. One kernel: each input is
    read with LOADIDX at ``c[axis] - off_t`` (its own strides elsewhere) and the input whose
    range holds ``c[axis]`` is chosen by SELECT, last to first. Registers: r1 = c[axis], r2 the
    index, r3/r5 constants and flags, r4 the value read; r0 the result.

    (Reads outside an input's range are discarded by the SELECT, or are NaN by the LOADIDX rule;
    a NaN passed on by SELECT is the canonical NaN, so unlike a plain copy Concat canonicalises
    NaN payloads.)"""
    shps = [as_shape(s) for s in shapes]
    if not shps:
        raise RepOpsError("concat: no inputs")
    rank = len(shps[0])
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank or any(len(s) != rank or s[:ax] + s[ax + 1 :] != shps[0][:ax] + shps[0][ax + 1 :] for s in shps):
        raise RepOpsError(f"concat: shapes {shps} do not concatenate on axis {axis}")
    offs = [0]
    for s in shps:
        offs.append(offs[-1] + s[ax])
    out = shps[0][:ax] + (offs[-1],) + shps[0][ax + 1 :]
    maps = []
    for s in shps:
        st = c_strides(s)
        maps.append(InputMap(numel(s), tuple(0 if d == ax else st[d] for d in range(rank)), 0, 0, st[ax]))
    code: list[Instr] = [coord(1, ax)]
    for t in reversed(range(len(shps))):
        if offs[t]:
            code += [const(3, float(offs[t])), I(Op.SUB, 2, 1, 3)]  # r2 = c[axis] - off_t
        else:
            code += [I(Op.MOV, 2, 1)]
        if t == len(shps) - 1:
            code += [loadidx(0, 2, t)]
        else:
            code += [
                loadidx(4, 2, t),
                const(3, float(offs[t + 1])),
                I(Op.LT, 5, 1, 3),  # r5 = c[axis] < off_{t+1}
                I(Op.SELECT, 0, 5, 4, 0),
            ]
    return KernelDesc(out, 1, tuple(maps), tuple(code), label="concat")


def slice_grad(
    in_shape: Sequence[int], starts: Sequence[int], ends: Sequence[int], steps: Sequence[int]
) -> KernelDesc:
    """Backward of ``slice_`` (one input, the slice's gradient g): out has ``in_shape``; out[c] =
    g[i] where every sliced axis d has c[d] = start_d + i_d * step_d with 0 <= i_d < count_d,
    else +0. The flat index of g is summed in binary32 by FMA (exact: integers below 2**24) and
    read with LOADIDX. Registers: r1 = flat index, r2 = in range (1.0 / 0.0), r3..r6 scratch."""
    shp = as_shape(in_shape)
    rngs = [range(*slice(starts[d], ends[d], steps[d]).indices(n)) for d, n in enumerate(shp)]
    gshape = tuple(len(r) for r in rngs)
    if any(n == 0 for n in gshape):
        raise RepOpsError("slice_grad: empty slices are not supported")
    gst = c_strides(gshape)
    code: list[Instr] = [const(1, 0.0), const(2, 1.0)]
    for d, r in enumerate(rngs):
        code.append(coord(3, d))  # r3 = c[d]
        if r.start:
            code += [const(4, float(r.start)), I(Op.SUB, 3, 3, 4)]
        if r.step != 1:
            code += [
                const(4, float(r.step)),
                I(Op.DIV, 5, 3, 4),
                I(Op.FLOOR, 5, 5),  # r5 = candidate i_d
                I(Op.MUL, 4, 5, 4),
                I(Op.EQ, 4, 4, 3),  # step divides c[d] - start
                I(Op.MIN, 2, 2, 4),
                I(Op.MOV, 3, 5),
            ]
        if r.start or r.step != 1 or len(r) != shp[d]:
            code += [
                const(4, 0.0),
                I(Op.LT, 5, 3, 4),
                I(Op.EQ, 5, 5, 4),  # 0 <= i_d
                I(Op.MIN, 2, 2, 5),
                const(4, float(len(r))),
                I(Op.LT, 5, 3, 4),  # i_d < count_d
                I(Op.MIN, 2, 2, 5),
            ]
        if gst[d]:
            code += [const(4, float(gst[d])), I(Op.FMA, 1, 3, 4, 1)]  # index += i_d * stride_d
    code += [loadidx(0, 1, 0), const(6, 0.0), I(Op.SELECT, 0, 2, 0, 6)]
    gmap = InputMap(numel(gshape), (0,) * len(shp), 0, 0, 1)
    return KernelDesc(shp, 1, (gmap,), tuple(code), label="slice_grad")


def trilu(shape: Sequence[int], k: int = 0, upper: bool = True) -> KernelDesc:
    """ONNX Trilu on the last two axes: keep x[.., i, j] where j - i >= k (upper) or j - i <= k
    (lower), else +0. Its own backward (the same mask on the gradient)."""
    shp = as_shape(shape)
    if len(shp) < 2:
        raise RepOpsError(f"trilu: needs rank >= 2, got {shp}")
    r = len(shp)
    code = (
        load(0, 0),
        coord(1, r - 1),
        coord(2, r - 2),
        I(Op.SUB, 1, 1, 2),  # r1 = j - i
        const(2, float(k)),
        I(Op.LT, 3, 1, 2) if upper else I(Op.LT, 3, 2, 1),  # r3 = outside the kept triangle
        const(4, 0.0),
        I(Op.SELECT, 0, 3, 4, 0),
    )
    full = InputMap(numel(shp), c_strides(shp))
    return KernelDesc(shp, 1, (full,), code, label="triu" if upper else "tril")


def onnx_pads(rank: int, pads: Sequence[int], axes: Sequence[int] | None = None) -> tuple[int, ...]:
    """ONNX Pad's ``pads`` for every axis (begins, then ends) from pads of ``axes`` only (opset 18;
    negative axes count from the end)."""
    if axes is None:
        return tuple(int(p) for p in pads)
    if len(pads) != 2 * len(axes):
        raise RepOpsError(f"pad: {len(pads)} pads for {len(axes)} axes")
    full = [0] * (2 * rank)
    for i, ax in enumerate(axes):
        full[ax % rank], full[rank + ax % rank] = int(pads[i]), int(pads[len(axes) + i])
    return tuple(full)


def pad(shape: Sequence[int], pads: Sequence[int], value: float = 0.0) -> KernelDesc:
    """ONNX Pad, constant mode (pads: all begins, then all ends; negative ones crop): one LOAD
    whose windows read ``fl32(value)`` outside the input — raw bits inside. Its backward is
    ``pad(out_shape, -pads)`` of the gradient."""
    shp = as_shape(shape)
    r = len(shp)
    if len(pads) != 2 * r:
        raise RepOpsError(f"pad: {len(pads)} pads for rank {r}")
    out = tuple(n + pads[d] + pads[r + d] for d, n in enumerate(shp))
    if min(out, default=1) < 1:
        raise RepOpsError(f"pad: {shp} with pads {tuple(pads)} leaves no element")
    st = c_strides(shp)
    padded = [d for d in range(r) if pads[d] or pads[r + d]]
    if not padded:
        return strided_copy(out, numel(shp), st, label="pad")
    strides = tuple(0 if d in padded else st[d] for d in range(r))
    windows = tuple(Window(d, 1, 0, 0, -pads[d], 1, shp[d], st[d]) for d in padded)
    m = InputMap(numel(shp), strides, windows=windows, fill=f32_bits(value))
    return KernelDesc(out, 1, (m,), (load(0, 0),), label="pad")


def write_row(rows: int, row_numel: int) -> KernelDesc:
    """A (rows, row_numel) buffer with one row replaced: inputs (buffer, row, r), where r is one
    binary32 integer (the row to write). out[t, j] = t == r ? row[j] : buffer[t, j]; a row
    index outside [0, rows) changes nothing. Inference jobs write each step's outputs into
    their committed outputs buffer with it (docs/training.md)."""
    if rows < 1 or row_numel < 1:
        raise RepOpsError(f"write_row: needs rows >= 1 and row_numel >= 1, got {rows}, {row_numel}")
    code = (
        coord(1, 0),  # r1 = t
        load(2, 2),  # r2 = r
        I(Op.EQ, 3, 1, 2),  # r3 = t == r
        load(4, 1),  # r4 = row[j]
        load(0, 0),  # r0 = buffer[t, j]
        I(Op.SELECT, 0, 3, 4, 0),  # r0 = r3 ? row[j] : buffer[t, j]
    )
    buf = InputMap(rows * row_numel, (row_numel, 1))
    row = InputMap(row_numel, (0, 1))
    r = InputMap(1, (0, 0))
    return KernelDesc((rows, row_numel), 1, (buf, row, r), code, label="write_row")

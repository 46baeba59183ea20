"""Data movement: kernels that copy elements (LOAD only, raw bits) to new positions.

Every one is a ``strided_copy``: the output element at coordinates c reads input address
``offset + sum_d c[d] * strides[d]``. Transpose permutes strides, expand zeroes them, slice
scales and offsets them; reshape is a plain copy (inside a graph a reshape is a free view and
needs no node at all).
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Op, f32_bits
from verde_chain.repops.library.asm import I, const, coord, load
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
    """ONNX Concat: input t read through a window on ``axis`` (offset = the sizes before it),
    then ``r0 = SELECT(LT(c, off_t), r0, r_t)`` for t = 1, 2, ... with c = COORD axis (a
    selected NaN becomes the canonical NaN, as SELECT does)."""
    shps = [as_shape(s) for s in shapes]
    if not shps or len(shps) > MAX_CONCAT:
        raise RepOpsError(f"concat: 1..{MAX_CONCAT} inputs, got {len(shps)}")
    rank = len(shps[0])
    ax = axis % rank if rank else 0
    if any(len(s) != rank or s[:ax] + s[ax + 1:] != shps[0][:ax] + shps[0][ax + 1:] for s in shps):
        raise RepOpsError(f"concat: shapes {shps} differ off axis {axis}")
    out = shps[0][:ax] + (sum(s[ax] for s in shps),) + shps[0][ax + 1:]
    maps, code, off = [], [], 0
    n = len(shps)
    for t, s in enumerate(shps):
        st = c_strides(s)
        window = Window(ax, 1, 0, 0, -off, 1, s[ax], st[ax])
        maps.append(InputMap(numel(s), st[:ax] + (0,) + st[ax + 1:], windows=(window,)))
        code.append(load(t, t))
        if t:
            code += [const(n + 1, float(off)), I(Op.LT, n + 1, n, n + 1), I(Op.SELECT, 0, n + 1, 0, t)]
        off += s[ax]
    code.insert(n, coord(n, ax))  # r_n = the coordinate along axis
    return KernelDesc(out, 1, tuple(maps), tuple(code), label="concat")


MAX_CONCAT = 14  # registers: the inputs, the coordinate and one scratch


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

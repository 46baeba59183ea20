"""Data movement: kernels that copy elements (LOAD only, raw bits) to new positions.

Every one is a ``strided_copy``: the output element at coordinates c reads input address
``offset + sum_d c[d] * strides[d]``. Transpose permutes strides, expand zeroes them, slice
scales and offsets them; reshape is a plain copy (inside a graph a reshape is a free view and
needs no node at all).
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.library.asm import load
from verde_chain.repops.library.shapes import as_shape, broadcast_map, broadcast_shapes, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc


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

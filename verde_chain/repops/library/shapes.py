"""Shape arithmetic shared by every operator: C-order strides, numpy broadcasting, axes.

Tensors are flat C-contiguous float32 buffers with a logical shape; an operator reads them
through :class:`~verde_chain.repops.program.InputMap` strides, so broadcasting, transposes and
reduced axes are all stride patterns built here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.program import InputMap

Shape = tuple[int, ...]


def as_shape(s: Sequence[int]) -> Shape:
    return tuple(int(d) for d in s)


def c_strides(shape: Sequence[int]) -> Shape:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def broadcast_shapes(op: str, *shapes: Sequence[int]) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise RepOpsError(f"{op}: shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> InputMap:
    """Map reading a C-contiguous ``in_shape`` tensor broadcast (numpy rules) to ``out_shape``."""
    st = c_strides(in_shape)
    lead = len(out_shape) - len(in_shape)
    strides = []
    for d in range(len(out_shape)):
        i = d - lead
        strides.append(0 if i < 0 or in_shape[i] == 1 else st[i])
    return InputMap(numel(in_shape), tuple(strides))


def normalize_axes(op: str, axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Sorted, de-duplicated, non-negative axes (None: every axis); out of range is refused."""
    if axes is None:
        return tuple(range(rank))
    out = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in out):
        raise RepOpsError(f"{op}: axes {tuple(axes)} out of range for rank {rank}")
    return tuple(out)


def broadcast_axes(shape: Sequence[int], target: Sequence[int]) -> list[int]:
    """The axes of ``shape`` along which a ``target``-shaped tensor was broadcast to it: the
    leading ones it lacks and those where it has 1 (the axes its gradient is summed over)."""
    lead = len(shape) - len(target)
    return [d for d in range(len(shape)) if d < lead or (target[d - lead] == 1 and shape[d] != 1)]


def reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def linear_k_stride(shape: Shape, strides: Shape, axes: tuple[int, ...]) -> int | None:
    """kstride if k (row-major over ``axes``) maps linearly to memory, else None."""
    live = [a for a in axes if shape[a] > 1]
    if not live:
        return 1
    for a, b in itertools.pairwise(live):
        if strides[a] != strides[b] * shape[b]:
            return None
    return strides[live[-1]]

"""Indexed reads and writes: Gather, GatherElements and the scatter-add of embedding backward.

Indices are float32 integral values (integer ONNX inputs are converted when a job is built),
read with LOADIDX: an index that is NaN, infinite, non-integral or out of range gives the
canonical NaN and reads nothing (the rule the on-chain prover decides from the register alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, coord, load, loadidx
from verde_chain.repops.library.shapes import as_shape, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc


def _load_at_index(dim: int) -> tuple[Instr, ...]:
    """Prologue of gather / gather_elements: r1 = the index (input 1), wrapped once if negative
    (idx + dim, as ONNX), then r0 = LOADIDX of input 0 at r1 along the gathered axis."""
    return (
        load(1, 1),  # r1 = idx
        const(2, 0.0),
        I(Op.LT, 3, 1, 2),  # r3 = idx < 0
        const(4, float(dim)),
        I(Op.ADD, 4, 1, 4),  # r4 = idx + dim
        I(Op.SELECT, 1, 3, 4, 1),  # r1 = r3 ? idx + dim : idx
        loadidx(0, 1, 0),  # r0 = data at r1
    )


def gather(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """ONNX Gather: out[i_pre, j, i_post] = data[i_pre, idx[j], i_post] via LOADIDX.

    Indices are float32 integral values; negative ones wrap once (idx + dim, as ONNX); anything
    else out of range or non-integral gives canonical NaN (the LOADIDX rule).
    """
    ds, js = as_shape(data_shape), as_shape(idx_shape)
    ax = axis + len(ds) if axis < 0 else axis
    if not 0 <= ax < len(ds):
        raise RepOpsError(f"gather: axis {axis} out of range for {ds}")
    out = ds[:ax] + js + ds[ax + 1 :]
    dst = c_strides(ds)
    data_strides = dst[:ax] + (0,) * len(js) + dst[ax + 1 :]
    idx_strides = (0,) * ax + c_strides(js) + (0,) * (len(ds) - ax - 1)
    dmap = InputMap(numel(ds), data_strides, 0, 0, dst[ax])
    imap = InputMap(max(1, numel(js)), idx_strides)
    return KernelDesc(out, 1, (dmap, imap), _load_at_index(ds[ax]), label="gather")


def gather_elements(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """ONNX GatherElements: out[c] = data[c with c[axis] replaced by idx[c]] (same wrap/NaN rule
    as ``gather``)."""
    ds, js = as_shape(data_shape), as_shape(idx_shape)
    ax = axis + len(ds) if axis < 0 else axis
    if len(js) != len(ds) or not 0 <= ax < len(ds) or any(j > d for i, (j, d) in enumerate(zip(js, ds)) if i != ax):
        raise RepOpsError(f"gather_elements: indices {js} do not fit data {ds} on axis {axis}")
    dst = c_strides(ds)
    dmap = InputMap(numel(ds), tuple(0 if d == ax else dst[d] for d in range(len(ds))), 0, 0, dst[ax])
    imap = InputMap(numel(js), c_strides(js))
    return KernelDesc(js, 1, (dmap, imap), _load_at_index(ds[ax]), label="gather_elements")


def _scatter_program(axis: int) -> tuple[tuple[Instr, ...], tuple[Instr, ...]]:
    """The sum over k = p of ``idx[p] == c[axis] ? g[p] : +0`` (ascending p; a run of misses adds
    +0). Input 0 is g, input 1 the indices.

    Registers: r2 = c[axis] (set once by the prologue and read by every body step), r5 = +0
    (likewise), r1/r3/r4/r6 the per-k index, match flag, g value and selected term."""
    pro = (
        load(1, 1),  # r1 = idx[0]
        coord(2, axis),  # r2 = v
        I(Op.EQ, 3, 1, 2),  # r3 = idx[0] == v
        load(4, 0),  # r4 = g[0, d]
        const(5, 0.0),
        I(Op.SELECT, 0, 3, 4, 5),  # acc = r3 ? g[0, d] : +0
    )
    body = (
        load(1, 1),  # r1 = idx[p]
        I(Op.EQ, 3, 1, 2),
        load(4, 0),  # r4 = g[p, d]
        I(Op.SELECT, 6, 3, 4, 5),  # r6 = r3 ? g[p, d] : +0
        I(Op.ADD, 0, 0, 6),  # acc += r6
    )
    return pro, body


def scatter_add(idx_numel: int, row_shape: Sequence[int], num_rows: int, pre_shape: Sequence[int] = ()) -> KernelDesc:
    """Gather's backward: out[pre, v, d] = sum_{p ascending} (idx[p] == v ? g[pre, p, d] : +0).

    Inputs: g of shape (*pre_shape, P, *row_shape), idx of P float32 integral values. k = p. The
    first term is the selected value itself; non-matching rows add +0, so an all-miss row is +0.
    Indices are compared as they are: callers pass non-negative ones (a batch's integer inputs
    are checked to be, static ones are wrapped when the model is imported). With no
    ``pre_shape`` this is the embedding backward (Gather on axis 0).
    """
    rs, ps = as_shape(row_shape), as_shape(pre_shape)
    P = int(idx_numel)
    row = numel(rs)
    out = ps + (int(num_rows),) + rs
    gst = c_strides(ps + (P,) + rs)
    gmap = InputMap(P * row * numel(ps), gst[: len(ps)] + (0,) + c_strides(rs), row)
    imap = InputMap(P, (0,) * len(out), 1)
    pro, body = _scatter_program(len(ps))
    return KernelDesc(out, P, (gmap, imap), pro, body if P > 1 else (), label="scatter_add")


def gather_grad(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """Backward of ``gather`` on any axis: inputs (g, indices) -> d data (``scatter_add`` with the
    axes before ``axis`` as its leading block)."""
    ds = as_shape(data_shape)
    ax = axis + len(ds) if axis < 0 else axis
    return scatter_add(numel(as_shape(idx_shape)), ds[ax + 1 :], ds[ax], ds[:ax])


def gather_elements_grad(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """Backward of ``gather_elements``: inputs (g, indices), both of the indices' shape, ->
    d data: out[c] = sum_{j ascending} (idx[c, axis=j] == c[axis] ? g[c, axis=j] : +0). The
    indices must match the data on every axis but ``axis`` (ONNX allows them shorter)."""
    ds, js = as_shape(data_shape), as_shape(idx_shape)
    ax = axis + len(ds) if axis < 0 else axis
    if len(js) != len(ds) or not 0 <= ax < len(ds) or any(j != d for i, (j, d) in enumerate(zip(js, ds)) if i != ax):
        raise RepOpsError(f"gather_elements_grad: indices {js} must match data {ds} except on axis {axis}")
    jst = c_strides(js)
    m = InputMap(numel(js), tuple(0 if d == ax else jst[d] for d in range(len(js))), jst[ax])
    pro, body = _scatter_program(ax)
    return KernelDesc(ds, js[ax], (m, m), pro, body if js[ax] > 1 else (), label="gather_elements_grad")

"""Indexed reads: ``gather`` (ONNX Gather on any axis, indices computed or constant) and
``gather_elements``; their gradients are scatter-adds into the data (``gather_grad``,
``gather_elements_grad``; for an embedding table, Gather on axis 0, the embedding backward).

Constant indices are wrapped (negative ones once, as ONNX) and checked at import; when they run
through the axis in steps of one (positions 0..n-1) the Gather is a Slice, and when they are all
one index (BERT's token types) a Slice expanded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError, UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


def _static_indices(imp: Importer, node: onnx.NodeProto, name: str, dim: int) -> np.ndarray:
    idx = np.asarray(imp.static[name]).astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= dim):
        raise UnsupportedModelError(imp.who(node), f"constant indices out of range for a dimension of {dim}")
    return idx


def _operands(imp: Importer, node: onnx.NodeProto) -> tuple[str, str, tuple[int, ...], int]:
    """(data value, indices name, data shape, axis) of a Gather or GatherElements node."""
    a = imp.check_attrs(node, {"axis": 0})
    d = imp.value(node.input[0], node)
    ds = imp.shape(d)
    return d, node.input[1], ds, a["axis"] % len(ds)


def _wrapped(imp: Importer, node: onnx.NodeProto, idx: str, dim: int) -> str:
    imp.static[f"{idx}:wrapped"] = _static_indices(imp, node, idx, dim)
    return f"{idx}:wrapped"


@onnx_op("Gather")
def _import_gather(imp: Importer, node: onnx.NodeProto) -> None:
    d, idx, ds, ax = _operands(imp, node)
    out_shape = ds[:ax] + imp.shape(idx) + ds[ax + 1 :]
    if imp.is_static(idx):
        flat = _static_indices(imp, node, idx, ds[ax]).reshape(-1)
        run = flat.size and np.array_equal(flat, flat[0] + np.arange(flat.size))  # positions 0..n-1
        same = flat.size and bool((flat == flat[0]).all())  # one row for every index (token types)
        if run or same:
            n = flat.size if run else 1
            sl = f"{node.output[0]}:slice"
            starts = [int(flat[0]) if i == ax else 0 for i in range(len(ds))]
            ends = [int(flat[0]) + n if i == ax else m for i, m in enumerate(ds)]
            sl_shape = ds[:ax] + (n,) + ds[ax + 1 :]
            imp.emit(node, "slice", [d], sl_shape, dtype=imp.dtype(d), output=sl,
                     starts=tuple(starts), ends=tuple(ends), steps=(1,) * len(ds))
            if run:
                imp.emit(node, "reshape", [sl], out_shape, dtype=imp.dtype(d), shape=out_shape)
            else:
                ones = ds[:ax] + (1,) * len(imp.shape(idx)) + ds[ax + 1 :]
                imp.emit(node, "reshape", [sl], ones, dtype=imp.dtype(d), output=f"{sl}:rows", shape=ones)
                imp.emit(node, "expand", [f"{sl}:rows"], out_shape, dtype=imp.dtype(d), shape=out_shape)
            return
        idx = _wrapped(imp, node, idx, ds[ax])
    iv = imp.value(idx, node)
    if imp.dtype(iv) != "int":
        raise UnsupportedModelError(imp.who(node), f"{imp.dtype(iv)} indices", "integer indices")
    imp.emit(node, "gather", [d, iv], out_shape, dtype=imp.dtype(d), axis=ax)


@onnx_op("GatherElements")
def _import_gather_elements(imp: Importer, node: onnx.NodeProto) -> None:
    d, idx, ds, ax = _operands(imp, node)
    if imp.is_static(idx):
        idx = _wrapped(imp, node, idx, ds[ax])
    iv = imp.value(idx, node)
    if imp.dtype(iv) != "int" or len(imp.shape(iv)) != len(ds):
        raise UnsupportedModelError(imp.who(node), f"{imp.dtype(iv)} indices of shape {imp.shape(iv)}",
                                    f"integer indices of rank {len(ds)}")
    imp.emit(node, "gather_elements", [d, iv], imp.shape(iv), dtype=imp.dtype(d), axis=ax)


@lowering("gather")
def _fw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    data, idx = ins
    return Saved(b.node(library.gather(data.shape, idx.shape, op.attrs["axis"]), data, idx, label="gather"))


@lowering("gather_elements")
def _fw_gather_elements(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    data, idx = ins
    desc = library.gather_elements(data.shape, idx.shape, op.attrs["axis"])
    return Saved(b.node(desc, data, idx, label="gather_elements"))


@vjp("gather")
def _bw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    data, idx = ins
    if need[1]:
        raise NotDifferentiableError(f"{op.name}: no gradient flows into Gather indices")
    desc = library.gather_grad(data.shape, idx.shape, op.attrs["axis"])
    return [b.node(desc, b.view(g, (g.numel,)), b.view(idx, (idx.numel,)), label="scatter_add"), None]


@vjp("gather_elements")
def _bw_gather_elements(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    data, idx = ins
    if need[1]:
        raise NotDifferentiableError(f"{op.name}: no gradient flows into GatherElements indices")
    try:
        desc = library.gather_elements_grad(data.shape, idx.shape, op.attrs["axis"])
    except Exception as exc:
        raise NotDifferentiableError(f"{op.name}: {exc}") from exc
    return [b.node(desc, g, idx, label="gather_elements_grad"), None]

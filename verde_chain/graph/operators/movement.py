"""Data movement IR ops: ``transpose`` (a strided copy), ``reshape`` (a free view: no node),
``expand``, ``slice``, ``concat``, ``trilu`` and ``pad`` (constant mode: windowed loads).

ONNX Reshape, Flatten, Squeeze, Unsqueeze, Identity and Cast (to float of a float tensor, or
between integer types) become ``reshape``; Split and SplitToSequence/SequenceAt become one
``slice`` per piece. Movement keeps the dtype: integer and boolean tensors move like floats.
(Applied to static tensors every one of them is folded by the importer instead.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from verde_chain.errors import RepOpsError
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    from verde_chain.graph.onnx_import import Importer

CAST_DTYPE: dict[int, str] = {onnx.TensorProto.FLOAT: "float", onnx.TensorProto.INT64: "int", onnx.TensorProto.INT32: "int",
              onnx.TensorProto.BOOL: "bool"}


# ----------------------------------------------------------------------- ONNX


def _same(imp: Importer, node: onnx.NodeProto, x: str, dtype: str | None = None) -> None:
    imp.emit(node, "reshape", [x], imp.shape(x), dtype=dtype or imp.dtype(x), shape=imp.shape(x))


@onnx_op("Identity")
def _import_identity(imp: Importer, node: onnx.NodeProto) -> None:
    src = node.input[0]
    if src in imp.params:  # the TorchScript exporter shares equal initializers (fresh LayerNorms)
        imp.params[node.output[0]] = imp.params[src]  # through Identity: each is its own parameter
        return
    _same(imp, node, imp.value(src, node))


def _cast(imp: Importer, node: onnx.NodeProto, to: int) -> None:
    """A cast that changes no binary32 value: float to float, integer to integer, integer or
    boolean to float (exact: integers are below 2**24), boolean to integer."""
    x = imp.value(node.input[0], node)
    want, have = CAST_DTYPE.get(to), imp.dtype(x)
    if want is None or (have == "float" and want != "float") or (want == "bool" and have != "bool"):
        raise UnsupportedModelError(imp.who(node), f"Cast of a computed {have} tensor to "
                                    f"{onnx.TensorProto.DataType.Name(to)}",
                                    "float to float; integers and booleans to float or integers")
    _same(imp, node, x, want)


@onnx_op("Cast")
def _import_cast(imp: Importer, node: onnx.NodeProto) -> None:
    to = imp.attrs(node).get("to")
    if not isinstance(to, int):
        raise UnsupportedModelError(imp.who(node), "Cast without a 'to' attribute")
    _cast(imp, node, to)


@onnx_op("CastLike")
def _import_cast_like(imp: Importer, node: onnx.NodeProto) -> None:
    like = node.input[1]
    dtype = imp.dtype(like)
    to = {"float": onnx.TensorProto.FLOAT, "int": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL}[dtype]
    if imp.is_static(node.input[0]):  # a constant cast like a computed tensor: still a constant
        imp.static[node.output[0]] = np.asarray(imp.static[node.input[0]]).astype(
            onnx.helper.tensor_dtype_to_np_dtype(to))
        return
    _cast(imp, node, to)


@onnx_op("Transpose")
def _import_transpose(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"perm": None})
    x = imp.value(node.input[0], node)
    shape = imp.shape(x)
    perm = list(a["perm"]) if a["perm"] is not None else list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):
        raise UnsupportedModelError(imp.who(node), f"perm {perm} for rank {len(shape)}")
    imp.emit(node, "transpose", [x], tuple(shape[p] for p in perm), dtype=imp.dtype(x), perm=tuple(perm))


def _reshape_to(imp: Importer, node: onnx.NodeProto, src: str, new: list[int]) -> None:
    x = imp.value(src, node)
    imp.emit(node, "reshape", [x], tuple(new), dtype=imp.dtype(x), shape=tuple(new))


@onnx_op("Reshape")
def _import_reshape(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"allowzero": 0})
    src = node.input[0]
    shape = imp.shape(src)
    req = imp.ints(node.input[1], node, "shape")
    new = [shape[i] if (d == 0 and not a["allowzero"]) else d for i, d in enumerate(req)]
    if new.count(-1) > 1:
        raise UnsupportedModelError(imp.who(node), f"shape {req} has several -1")
    if -1 in new:
        rest = math.prod(d for d in new if d != -1)
        new[new.index(-1)] = math.prod(shape) // max(rest, 1)
    if math.prod(new) != math.prod(shape):
        raise UnsupportedModelError(imp.who(node), f"cannot reshape {shape} to {req}")
    _reshape_to(imp, node, src, new)


@onnx_op("Flatten")
def _import_flatten(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": 1})
    shape = imp.shape(node.input[0])
    ax = a["axis"] % (len(shape) + 1) if a["axis"] < 0 else a["axis"]
    _reshape_to(imp, node, node.input[0], [math.prod(shape[:ax]), math.prod(shape[ax:])])


def _axes_arg(imp: Importer, node: onnx.NodeProto) -> list[int] | None:
    if imp.opset >= 13:
        return imp.ints(node.input[1], node, "axes") if len(node.input) > 1 and node.input[1] else None
    return imp.attrs(node).get("axes")


@onnx_op("Squeeze")
def _import_squeeze(imp: Importer, node: onnx.NodeProto) -> None:
    shape = imp.shape(node.input[0])
    axes = _axes_arg(imp, node)
    ax = {a % len(shape) for a in axes} if axes else {d for d, n in enumerate(shape) if n == 1}
    if any(shape[a] != 1 for a in ax):
        raise UnsupportedModelError(imp.who(node), f"squeeze of non-unit axes {sorted(ax)} of {shape}")
    _reshape_to(imp, node, node.input[0], [n for d, n in enumerate(shape) if d not in ax])


@onnx_op("Unsqueeze")
def _import_unsqueeze(imp: Importer, node: onnx.NodeProto) -> None:
    shape = list(imp.shape(node.input[0]))
    axes = _axes_arg(imp, node) or []
    rank = len(shape) + len(axes)
    for a in sorted(x % rank for x in axes):
        shape.insert(a, 1)
    _reshape_to(imp, node, node.input[0], shape)


@onnx_op("Expand")
def _import_expand(imp: Importer, node: onnx.NodeProto) -> None:
    x = imp.value(node.input[0], node)
    shape = imp.broadcast(imp.shape(x), tuple(imp.ints(node.input[1], node, "shape")), node)
    imp.emit(node, "expand", [x], shape, dtype=imp.dtype(x), shape=shape)


def _emit_slice(imp: Importer, node: onnx.NodeProto, x: str, axis_ranges: dict[int, range], out: str) -> None:
    shape = imp.shape(x)
    starts, ends, steps = [], [], []
    for d, n in enumerate(shape):
        r = axis_ranges.get(d, range(n))
        if len(r) == 0:
            raise UnsupportedModelError(imp.who(node), f"an empty slice of axis {d}", "non-empty slices")
        starts.append(r.start)
        ends.append(r.stop if r.stop >= 0 else -n - 1)  # a negative stop of a reversed range
        steps.append(r.step)
    out_shape = tuple(len(axis_ranges.get(d, range(n))) for d, n in enumerate(shape))
    if all(len(axis_ranges.get(d, range(n))) == n and axis_ranges.get(d, range(n)).step == 1
           for d, n in enumerate(shape)):
        imp.emit(node, "reshape", [x], shape, dtype=imp.dtype(x), output=out, shape=shape)
        return
    imp.emit(node, "slice", [x], out_shape, dtype=imp.dtype(x), output=out,
             starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


@onnx_op("Slice")
def _import_slice(imp: Importer, node: onnx.NodeProto) -> None:
    x = imp.value(node.input[0], node)
    shape = imp.shape(x)
    starts = imp.ints(node.input[1], node, "starts")
    ends = imp.ints(node.input[2], node, "ends")
    axes = imp.ints(node.input[3], node, "axes") if len(node.input) > 3 and node.input[3] else list(range(len(starts)))
    steps = imp.ints(node.input[4], node, "steps") if len(node.input) > 4 and node.input[4] else [1] * len(starts)
    if 0 in steps:
        raise UnsupportedModelError(imp.who(node), "a step of 0")
    ranges = {}
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        d = ax % len(shape)
        ranges[d] = range(*slice(st, en, sp).indices(shape[d]))  # ONNX clamps like Python
    _emit_slice(imp, node, x, ranges, node.output[0])


def _split_sizes(imp: Importer, node: onnx.NodeProto, n: int, pieces: int, split: str | None) -> list[int]:
    if split:
        return imp.ints(split, node, "split")
    size = -(-n // pieces)  # ONNX: equal pieces, the last one smaller
    return [min(size, n - i * size) for i in range(pieces)]


@onnx_op("Split")
def _import_split(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": 0, "num_outputs": None, "split": None})
    x = imp.value(node.input[0], node)
    shape = imp.shape(x)
    d = a["axis"] % len(shape)
    if a["split"] is not None:
        sizes = list(a["split"])
    else:
        sizes = _split_sizes(imp, node, shape[d], len(node.output), node.input[1] if len(node.input) > 1 else None)
    if sum(sizes) != shape[d] or len(sizes) != len(node.output):
        raise UnsupportedModelError(imp.who(node), f"split sizes {sizes} of axis {d} ({shape[d]})")
    start = 0
    for out, size in zip(node.output, sizes):
        if out:
            _emit_slice(imp, node, x, {d: range(start, start + size)}, out)
        start += size


@onnx_op("SplitToSequence")
def _import_split_to_sequence(imp: Importer, node: onnx.NodeProto) -> None:
    """Only as a split whose pieces SequenceAt takes out: the sequence is remembered, not built."""
    a = imp.check_attrs(node, {"axis": 0, "keepdims": 1})
    x = imp.value(node.input[0], node)
    shape = imp.shape(x)
    d = a["axis"] % len(shape)
    split = node.input[1] if len(node.input) > 1 and node.input[1] else None
    if split and np.asarray(imp.static.get(split, np.zeros(2))).ndim == 0:
        size = imp.ints(split, node, "split")[0]
        sizes = [min(size, shape[d] - i) for i in range(0, shape[d], size)]
    elif split:
        sizes = imp.ints(split, node, "split")
    else:
        if not a["keepdims"]:
            raise UnsupportedModelError(imp.who(node), "keepdims=0", "keepdims=1")
        sizes = [1] * shape[d]
    imp.sequences[node.output[0]] = (x, d, sizes)


@onnx_op("SequenceAt")
def _import_sequence_at(imp: Importer, node: onnx.NodeProto) -> None:
    seq = imp.sequences.get(node.input[0])
    if seq is None:
        raise UnsupportedModelError(imp.who(node), "a sequence not made by SplitToSequence")
    x, d, sizes = seq
    i = imp.ints(node.input[1], node, "position")[0] % len(sizes)
    start = sum(sizes[:i])
    _emit_slice(imp, node, x, {d: range(start, start + sizes[i])}, node.output[0])


@onnx_op("Concat")
def _import_concat(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": None})
    xs = [imp.value(n, node) for n in node.input if n]
    dtypes = {imp.dtype(x) for x in xs}
    if len(dtypes) != 1:
        raise UnsupportedModelError(imp.who(node), f"inputs of dtypes {sorted(dtypes)}", "one dtype")
    shapes = [imp.shape(x) for x in xs]
    d = a["axis"] % len(shapes[0])
    if any(len(s) != len(shapes[0]) or s[:d] + s[d + 1:] != shapes[0][:d] + shapes[0][d + 1:] for s in shapes):
        raise UnsupportedModelError(imp.who(node), f"shapes {shapes} do not concatenate on axis {d}")
    out = shapes[0][:d] + (sum(s[d] for s in shapes),) + shapes[0][d + 1:]
    if len(xs) == 1:
        imp.emit(node, "reshape", xs, out, dtype=dtypes.pop(), shape=out)
        return
    imp.emit(node, "concat", xs, out, dtype=dtypes.pop(), axis=d)


@onnx_op("Trilu")
def _import_trilu(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"upper": 1})
    x = imp.value(node.input[0], node)
    k = imp.ints(node.input[1], node, "k")[0] if len(node.input) > 1 and node.input[1] else 0
    if len(imp.shape(x)) < 2:
        raise UnsupportedModelError(imp.who(node), "Trilu of rank < 2")
    imp.emit(node, "trilu", [x], imp.shape(x), dtype=imp.dtype(x), k=k, upper=bool(a["upper"]))


# ----------------------------------------------------------------------- forward and backward


@lowering("transpose")
def _fw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.transpose(ins[0].shape, op.attrs["perm"]), ins[0], label="transpose"))


@vjp("transpose")
def _bw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    perm = [p % len(ins[0].shape) for p in op.attrs["perm"]]
    inv = [perm.index(i) for i in range(len(perm))]
    return [b.node(library.transpose(g.shape, inv), g, label="transpose")]


@lowering("reshape")
def _fw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.view(ins[0], op.attrs["shape"]))


@vjp("reshape")
def _bw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.view(g, ins[0].shape)]


@lowering("expand")
def _fw_expand(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.expand(ins[0].shape, op.attrs["shape"]), ins[0], label="expand"))


@vjp("expand")
def _bw_expand(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.unbroadcast(g, ins[0].shape)]


@lowering("slice")
def _fw_slice(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    return Saved(b.node(library.slice_(ins[0].shape, a["starts"], a["ends"], a["steps"]), ins[0], label="slice"))


@vjp("slice")
def _bw_slice(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    a = op.attrs
    return [b.node(library.slice_grad(ins[0].shape, a["starts"], a["ends"], a["steps"]), g, label="slice_grad")]


@lowering("concat")
def _fw_concat(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.concat([r.shape for r in ins], op.attrs["axis"]), *ins, label="concat"))


@vjp("concat")
def _bw_concat(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    d = op.attrs["axis"]
    out: Grads = []
    start = 0
    for r, nd in zip(ins, need):
        n = r.shape[d]
        if nd:
            starts = [start if i == d else 0 for i in range(len(g.shape))]
            ends = [start + n if i == d else g.shape[i] for i in range(len(g.shape))]
            out.append(b.node(library.slice_(g.shape, starts, ends, [1] * len(g.shape)), g, label="slice"))
        else:
            out.append(None)
        start += n
    return out


@lowering("trilu")
def _fw_trilu(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.trilu(ins[0].shape, op.attrs["k"], op.attrs["upper"]), ins[0], label="trilu"))


@vjp("trilu")
def _bw_trilu(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.node(library.trilu(g.shape, op.attrs["k"], op.attrs["upper"]), g, label="trilu")]


# ----------------------------------------------------------------------- pad (constant mode)


@onnx_op("Pad")
def _import_pad(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"mode": "constant"})
    mode = a["mode"].decode() if isinstance(a["mode"], bytes) else a["mode"]
    if mode != "constant":
        raise UnsupportedModelError(imp.who(node), f"mode={mode!r}", "constant")
    x = imp.float_input(node.input[0], node)
    rank = len(imp.shape(x))
    pads = imp.ints(node.input[1], node, "pads")
    value = 0.0
    if len(node.input) > 2 and node.input[2]:
        if not imp.is_static(node.input[2]):
            raise UnsupportedModelError(imp.who(node), "a constant_value that is not a constant")
        value = float(np.asarray(imp.static[node.input[2]], dtype=np.float32).reshape(()))
    axes = imp.ints(node.input[3], node, "axes") if len(node.input) > 3 and node.input[3] else None
    try:
        pads = list(library.onnx_pads(rank, pads, axes))  # opset 18: pads of these axes only
        out = library.pad(imp.shape(x), pads, value).out_shape
    except RepOpsError as exc:
        raise UnsupportedModelError(imp.who(node), str(exc)) from exc
    imp.emit(node, "pad", [x], out, pads=tuple(pads), value=value)


@lowering("pad")
def _fw_pad(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.pad(ins[0].shape, op.attrs["pads"], op.attrs["value"]), ins[0], label="pad"))


@vjp("pad")
def _bw_pad(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.node(library.pad(g.shape, [-p for p in op.attrs["pads"]]), g, label="pad_bwd")]

"""ONNX forward graph (opsets 13-21, float32, static shapes) -> :class:`verde_chain.graph.ir.Model`.

Supported ops: Gemm MatMul Add Sub Mul Div Relu Tanh Exp Log Sqrt Erf Sigmoid Neg Identity Gelu
Softmax LogSoftmax LayerNormalization ReduceSum ReduceMean ReduceMax Transpose Reshape Flatten
Squeeze Unsqueeze Gather Cast Constant (plus initializers). Anything else — ops, attributes,
dtypes, dynamic dimensions — raises :class:`UnsupportedModelError` naming the node.

Initializers and Constant nodes are *static*: integer ones only feed shape/axes arguments; float
ones with one element become CONST immediates of ``scalar`` ops; other float ones become
trainable parameters, except the names in ``frozen`` (state carried unchanged). Binary ops whose
operands are both static are folded at import with numpy binary32 arithmetic (IEEE, correctly
rounded, so the folded constant is reproducible; it is committed in C_0 anyway).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.fusion import fuse_gelu
from verde_chain.graph.ir import Model, OpNode, Value

Shape = tuple[int, ...]
MIN_OPSET, MAX_OPSET = 13, 21
FLOAT = onnx.TensorProto.FLOAT
INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
UNARY = {
    "Relu": "relu",
    "Tanh": "tanh",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Neg": "neg",
}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max"}


def broadcast(a: Shape, b: Shape, who: str) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise UnsupportedModelError(who, f"shapes {a} and {b} do not broadcast") from None


def matmul_shape(a: Shape, b: Shape, who: str) -> Shape:
    if len(a) < 2 or len(b) < 2:
        raise UnsupportedModelError(who, f"MatMul of rank {len(a)} x {len(b)}", "rank >= 2 operands")
    if a[-1] != b[-2]:
        raise UnsupportedModelError(who, f"MatMul inner dimensions differ: {a} x {b}")
    return broadcast(a[:-2], b[:-2], who) + (a[-2], b[-1])


class Importer:
    def __init__(self, model: onnx.ModelProto, frozen: Iterable[str] = (), name: str = "model") -> None:
        self.proto = model
        self.frozen = set(frozen)
        self.name = name
        self.static: dict[str, np.ndarray] = {}
        self.model = Model(values={}, ops=[], inputs=[], outputs=[])
        self.opset = 0
        self._n = 0

    # ------------------------------------------------------------------ entry
    def run(self) -> Model:
        self._check_opset()
        g = self.proto.graph
        for init in g.initializer:
            self.static[init.name] = numpy_helper.to_array(init)
        for inp in g.input:
            if inp.name in self.static:
                continue
            self._graph_input(inp)
        for node in g.node:
            self._node(node)
        for out in g.output:
            if out.name not in self.model.values:
                raise UnsupportedModelError(out.name, "graph output is not computed by a supported node")
            self.model.outputs.append(out.name)
        # drop parameters no op reads (e.g. folded away)
        used = {n for op in self.model.ops for n in op.inputs}
        for k in [k for k, v in self.model.values.items() if v.role in ("param", "const") and k not in used]:
            del self.model.values[k]
        return self.model

    def _check_opset(self) -> None:
        for imp in self.proto.opset_import:
            if imp.domain in ("", "ai.onnx"):
                self.opset = imp.version
        if not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise UnsupportedModelError(
                "model", f"default-domain opset {self.opset}", f"opsets {MIN_OPSET}..{MAX_OPSET}"
            )

    def _graph_input(self, inp: onnx.ValueInfoProto) -> None:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedModelError(inp.name, "graph input is not a tensor")
        if tt.elem_type not in (FLOAT, *INT_TYPES):
            raise UnsupportedModelError(
                inp.name, f"input dtype {onnx.TensorProto.DataType.Name(tt.elem_type)}", "float32, int32/int64 indices"
            )
        dims = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 0:
                raise UnsupportedModelError(
                    inp.name, f"dynamic dimension {d.dim_param or '?'!r}", "static shapes (export with fixed sizes)"
                )
            dims.append(int(d.dim_value))
        self.model.add_value(Value(inp.name, tuple(dims), "input"))
        self.model.inputs.append(inp.name)
        self.model.integer_inputs[inp.name] = tt.elem_type in INT_TYPES

    # ------------------------------------------------------------------ helpers
    def _who(self, node: onnx.NodeProto) -> str:
        return f"{node.op_type} node {node.name or node.output[0]!r}"

    def _attrs(self, node: onnx.NodeProto) -> dict[str, Any]:
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def _check_attrs(self, node: onnx.NodeProto, allowed: dict[str, Any]) -> dict[str, Any]:
        """Attributes with defaults; unknown attributes or unsupported values are refused."""
        got = self._attrs(node)
        for k in got:
            if k not in allowed:
                raise UnsupportedModelError(self._who(node), f"attribute {k!r}", sorted(allowed))
        return {**allowed, **got}

    def _value(self, name: str, node: onnx.NodeProto) -> str:
        """Make sure a float tensor named ``name`` exists as a model value (creating params)."""
        if name in self.model.values:
            return name
        if name in self.static:
            arr = self.static[name]
            if arr.dtype != np.float32:
                raise UnsupportedModelError(self._who(node), f"tensor {name!r} has dtype {arr.dtype}", "float32 data")
            role = "const" if name in self.frozen else "param"
            shape = tuple(int(d) for d in arr.shape)
            self.model.add_value(Value(name, shape, role, np.ascontiguousarray(arr, dtype=np.float32)))
            return name
        raise UnsupportedModelError(self._who(node), f"input {name!r} is not produced by any supported node")

    def _float_input(self, name: str, node: onnx.NodeProto) -> str:
        v = self.model.values.get(name)
        if v is not None and v.role == "input" and self.model.integer_inputs.get(name):
            raise UnsupportedModelError(self._who(node), f"integer input {name!r} used as data", "indices only (Gather)")
        return self._value(name, node)

    def _ints(self, name: str, node: onnx.NodeProto, what: str) -> list[int]:
        arr = self.static.get(name)
        if arr is None:
            raise UnsupportedModelError(self._who(node), f"{what} {name!r} must be a constant")
        return [int(x) for x in np.asarray(arr).reshape(-1)]

    def _emit(self, node: onnx.NodeProto, ir_op: str, inputs: list[str], out_shape: Shape, **attrs: Any) -> None:
        out = node.output[0]
        self.model.add_value(Value(out, tuple(int(d) for d in out_shape), "tmp"))
        self.model.ops.append(OpNode(ir_op, tuple(inputs), out, attrs, self._who(node)))

    def _shape(self, name: str) -> Shape:
        if name in self.model.values:
            return self.model.values[name].shape
        return tuple(int(d) for d in self.static[name].shape)

    def _is_static(self, name: str) -> bool:
        return name in self.static and name not in self.model.values

    # ------------------------------------------------------------------ nodes
    def _node(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedModelError(self._who(node), f"domain {node.domain!r}", "the default ONNX domain")
        handler: Callable[[onnx.NodeProto], None] | None = getattr(self, f"_op_{node.op_type}", None)
        if handler is None:
            if node.op_type in UNARY:
                self._check_attrs(node, {})
                x = self._float_input(node.input[0], node)
                self._emit(node, "unary", [x], self._shape(x), fn=UNARY[node.op_type])
                return
            if node.op_type in BINARY:
                return self._binary(node)
            if node.op_type in REDUCE:
                return self._reduce(node)
            raise UnsupportedModelError(self._who(node), f"op {node.op_type!r} is not supported", SUPPORTED_OPS)
        handler(node)

    def _op_Constant(self, node: onnx.NodeProto) -> None:
        a = self._attrs(node)
        if "value" in a:
            arr = numpy_helper.to_array(a["value"])
        elif "value_float" in a:
            arr = np.array(a["value_float"], dtype=np.float32)
        elif "value_int" in a:
            arr = np.array(a["value_int"], dtype=np.int64)
        elif "value_ints" in a:
            arr = np.array(a["value_ints"], dtype=np.int64)
        elif "value_floats" in a:
            arr = np.array(a["value_floats"], dtype=np.float32)
        else:
            raise UnsupportedModelError(self._who(node), f"Constant with {sorted(a)}", "value, value_float(s), value_int(s)")
        self.static[node.output[0]] = arr

    def _op_Identity(self, node: onnx.NodeProto) -> None:
        src = node.input[0]
        if self._is_static(src):
            self.static[node.output[0]] = self.static[src]
            return
        x = self._value(src, node)
        self._emit(node, "reshape", [x], self._shape(x), shape=self._shape(x))

    def _op_Cast(self, node: onnx.NodeProto) -> None:
        to = self._attrs(node).get("to")
        src = node.input[0]
        if not isinstance(to, int):
            raise UnsupportedModelError(self._who(node), "Cast without a 'to' attribute")
        if self._is_static(src):
            np_type = onnx.helper.tensor_dtype_to_np_dtype(to)
            self.static[node.output[0]] = self.static[src].astype(np_type)
            return
        v = self.model.values.get(src)
        if to == FLOAT and v is not None and not self.model.integer_inputs.get(src):
            self._emit(node, "reshape", [src], v.shape, shape=v.shape)
            return
        raise UnsupportedModelError(self._who(node), f"Cast to {to} of a computed tensor", "Cast to float of float tensors")

    def _op_Gemm(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
        A = self._float_input(node.input[0], node)
        B = self._float_input(node.input[1], node)
        sa, sb = self._shape(A), self._shape(B)
        if len(sa) != 2 or len(sb) != 2:
            raise UnsupportedModelError(self._who(node), f"Gemm of {sa} x {sb}", "2-D A and B")
        M, K = (sa[1], sa[0]) if a["transA"] else sa
        K2, N = (sb[1], sb[0]) if a["transB"] else sb
        if K != K2:
            raise UnsupportedModelError(self._who(node), f"Gemm inner dimensions differ: {sa} x {sb}")
        ins = [A, B]
        if len(node.input) > 2 and node.input[2]:
            C = self._float_input(node.input[2], node)
            broadcast(self._shape(C), (M, N), self._who(node))
            ins.append(C)
        self._emit(
            node, "gemm", ins, (M, N),
            alpha=float(a["alpha"]), beta=float(a["beta"]), trans_a=bool(a["transA"]), trans_b=bool(a["transB"]),
        )

    def _op_MatMul(self, node: onnx.NodeProto) -> None:
        A = self._float_input(node.input[0], node)
        B = self._float_input(node.input[1], node)
        self._emit(node, "matmul", [A, B], matmul_shape(self._shape(A), self._shape(B), self._who(node)))

    def _binary(self, node: onnx.NodeProto) -> None:
        self._check_attrs(node, {})
        kind = BINARY[node.op_type]
        a, b = node.input[0], node.input[1]
        sa, sb = self._is_static(a), self._is_static(b)
        if sa and sb:
            xa, ya = self.static[a], self.static[b]
            ints = xa.dtype != np.float32 or ya.dtype != np.float32
            fold: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
                "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.floor_divide if ints else np.divide,
            }
            self.static[node.output[0]] = fold[kind](xa, ya)
            return
        for side, (name, other, stat) in enumerate(((b, a, sb), (a, b, sa))):
            if stat and self.static[name].size == 1 and self.static[name].dtype == np.float32:
                xs = self._float_input(other, node)
                value = float(self.static[name].reshape(()))
                shape = broadcast(self._shape(xs), tuple(self.static[name].shape), self._who(node))
                if shape != self._shape(xs):
                    raise UnsupportedModelError(self._who(node), "a scalar constant that changes the rank")
                self._emit(node, "scalar", [xs], shape, op=kind, value=value, reverse=bool(side))
                return
        xn, yn = self._float_input(a, node), self._float_input(b, node)
        self._emit(node, "binary", [xn, yn], broadcast(self._shape(xn), self._shape(yn), self._who(node)), op=kind)

    def _op_Gelu(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"approximate": "none"})
        approx = a["approximate"].decode() if isinstance(a["approximate"], bytes) else a["approximate"]
        if approx not in ("none", "tanh"):
            raise UnsupportedModelError(self._who(node), f"approximate={approx!r}", "none, tanh")
        x = self._float_input(node.input[0], node)
        self._emit(node, "unary", [x], self._shape(x), fn="gelu_tanh" if approx == "tanh" else "gelu_erf")

    def _softmax(self, node: onnx.NodeProto, op: str) -> None:
        a = self._check_attrs(node, {"axis": -1})
        x = self._float_input(node.input[0], node)
        shape = self._shape(x)
        axis = a["axis"] % len(shape)
        self._emit(node, op, [x], shape, axis=axis)

    def _op_Softmax(self, node: onnx.NodeProto) -> None:
        self._softmax(node, "softmax")

    def _op_LogSoftmax(self, node: onnx.NodeProto) -> None:
        self._softmax(node, "log_softmax")

    def _op_LayerNormalization(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"axis": -1, "epsilon": 1e-5, "stash_type": 1})
        if a["stash_type"] != 1:
            raise UnsupportedModelError(self._who(node), f"stash_type={a['stash_type']}", "stash_type=1 (float32)")
        if len(node.input) < 3 or not node.input[2]:
            raise UnsupportedModelError(self._who(node), "LayerNormalization without bias", "scale and bias")
        for extra in node.output[1:]:
            if extra and any(extra in n.input for n in self.proto.graph.node):
                raise UnsupportedModelError(self._who(node), "Mean/InvStdDev outputs are consumed", "output Y only")
        x, s, b = (self._float_input(n, node) for n in node.input[:3])
        shape = self._shape(x)
        axis = a["axis"] % len(shape)
        if self._shape(s) != shape[axis:] or self._shape(b) != shape[axis:]:
            raise UnsupportedModelError(self._who(node), f"scale/bias shapes {self._shape(s)}, {self._shape(b)} vs {shape[axis:]}")
        self._emit(node, "layer_norm", [x, s, b], shape, axis=axis, eps=float(a["epsilon"]))

    def _reduce(self, node: onnx.NodeProto) -> None:
        axes_as_input = self.opset >= 18 or node.op_type == "ReduceSum"
        allowed: dict[str, Any] = {"keepdims": 1, "noop_with_empty_axes": 0}
        if not axes_as_input:
            allowed["axes"] = None
        a = self._check_attrs(node, allowed)
        x = self._float_input(node.input[0], node)
        shape = self._shape(x)
        if axes_as_input:
            axes = self._ints(node.input[1], node, "axes") if len(node.input) > 1 and node.input[1] else None
        else:
            axes = a["axes"]
        if not axes:
            if a["noop_with_empty_axes"]:
                self._emit(node, "reshape", [x], shape, shape=shape)
                return
            axes = list(range(len(shape)))
        axes = sorted({ax % len(shape) for ax in axes})
        keep = bool(a["keepdims"])
        out = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keep else tuple(
            n for d, n in enumerate(shape) if d not in axes
        )
        self._emit(node, "reduce", [x], out, kind=REDUCE[node.op_type], axes=tuple(axes), keepdims=keep)

    def _op_Transpose(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"perm": None})
        src = node.input[0]
        if self._is_static(src):
            self.static[node.output[0]] = np.transpose(self.static[src], a["perm"])
            return
        x = self._value(src, node)
        shape = self._shape(x)
        perm = list(a["perm"]) if a["perm"] is not None else list(reversed(range(len(shape))))
        if sorted(perm) != list(range(len(shape))):
            raise UnsupportedModelError(self._who(node), f"perm {perm} for rank {len(shape)}")
        self._emit(node, "transpose", [x], tuple(shape[p] for p in perm), perm=tuple(perm))

    def _reshape_to(self, node: onnx.NodeProto, src: str, new: list[int]) -> None:
        if self._is_static(src):
            self.static[node.output[0]] = self.static[src].reshape(new)
            return
        x = self._value(src, node)
        self._emit(node, "reshape", [x], tuple(new), shape=tuple(new))

    def _op_Reshape(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"allowzero": 0})
        src = node.input[0]
        shape = self._shape(src) if not self._is_static(src) else tuple(self.static[src].shape)
        req = self._ints(node.input[1], node, "shape")
        new = [shape[i] if (d == 0 and not a["allowzero"]) else d for i, d in enumerate(req)]
        if new.count(-1) > 1:
            raise UnsupportedModelError(self._who(node), f"shape {req} has several -1")
        if -1 in new:
            rest = math.prod(d for d in new if d != -1)
            new[new.index(-1)] = math.prod(shape) // max(rest, 1)
        if math.prod(new) != math.prod(shape):
            raise UnsupportedModelError(self._who(node), f"cannot reshape {shape} to {req}")
        self._reshape_to(node, src, new)

    def _op_Flatten(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"axis": 1})
        shape = self._shape(node.input[0])
        ax = a["axis"] % (len(shape) + 1) if a["axis"] < 0 else a["axis"]
        self._reshape_to(node, node.input[0], [math.prod(shape[:ax]), math.prod(shape[ax:])])

    def _axes_arg(self, node: onnx.NodeProto) -> list[int] | None:
        if self.opset >= 13:
            return self._ints(node.input[1], node, "axes") if len(node.input) > 1 and node.input[1] else None
        return self._attrs(node).get("axes")

    def _op_Squeeze(self, node: onnx.NodeProto) -> None:
        shape = self._shape(node.input[0])
        axes = self._axes_arg(node)
        ax = {a % len(shape) for a in axes} if axes else {d for d, n in enumerate(shape) if n == 1}
        if any(shape[a] != 1 for a in ax):
            raise UnsupportedModelError(self._who(node), f"squeeze of non-unit axes {sorted(ax)} of {shape}")
        self._reshape_to(node, node.input[0], [n for d, n in enumerate(shape) if d not in ax])

    def _op_Unsqueeze(self, node: onnx.NodeProto) -> None:
        shape = list(self._shape(node.input[0]))
        axes = self._axes_arg(node) or []
        rank = len(shape) + len(axes)
        for a in sorted(x % rank for x in axes):
            shape.insert(a, 1)
        self._reshape_to(node, node.input[0], shape)

    def _op_Gather(self, node: onnx.NodeProto) -> None:
        a = self._check_attrs(node, {"axis": 0})
        data, idx = node.input[0], node.input[1]
        if self._is_static(data) and self._is_static(idx):
            self.static[node.output[0]] = np.take(self.static[data], self.static[idx], axis=a["axis"])
            return
        iv = self.model.values.get(idx)
        if a["axis"] != 0 or iv is None or iv.role != "input" or not self.model.integer_inputs.get(idx):
            raise UnsupportedModelError(
                self._who(node), "Gather other than an embedding lookup", "axis 0, indices = an integer graph input"
            )
        d = self._float_input(data, node)
        self._emit(node, "gather", [d, idx], iv.shape + self._shape(d)[1:])


SUPPORTED_OPS = sorted(
    {"Gemm", "MatMul", "Gelu", "Softmax", "LogSoftmax", "LayerNormalization", "Transpose", "Reshape", "Flatten",
     "Squeeze", "Unsqueeze", "Gather", "Cast", "Constant", "Identity"} | set(UNARY) | set(BINARY) | set(REDUCE)
)


def load_onnx(source: str | Path | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse and check an ONNX model (path, bytes or proto); malformed files raise UnsupportedModelError."""
    try:
        if isinstance(source, onnx.ModelProto):
            proto = source
        elif isinstance(source, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(source))
        else:
            proto = onnx.load(str(source))
        onnx.checker.check_model(proto)
    except UnsupportedModelError:
        raise
    except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError ...
        raise UnsupportedModelError("model", f"not a valid ONNX model: {type(exc).__name__}: {exc}") from exc
    return proto


def import_onnx(source: str | Path | bytes | onnx.ModelProto, frozen: Iterable[str] = (), fuse: bool = True) -> Model:
    """Import a model; ``fuse`` applies the pattern rewrites of ``graph/fusion.py`` (erf-form GELU)."""
    model = Importer(load_onnx(source), frozen).run()
    if fuse:
        fuse_gelu(model)
    return model


def export_torch(module: Any, example_inputs: Any, input_names: list[str] | None = None, opset: int = 17) -> bytes:
    """torch.onnx.export (TorchScript exporter, offline) with fixed shapes; returns the ONNX bytes."""
    import warnings

    import torch

    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    buf = io.BytesIO()
    target: Any = buf  # a BytesIO is accepted at run time although the stub says path
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, target, opset_version=opset, dynamo=False, input_names=input_names,
            output_names=["output"], do_constant_folding=True,
        )
    return buf.getvalue()


def import_torch(
    module: Any, example_inputs: Any, input_names: list[str] | None = None, opset: int = 17, fuse: bool = True
) -> tuple[Model, bytes]:
    """Export ``module`` to ONNX and import it. Buffers are frozen; returns (model, onnx bytes)."""
    data = export_torch(module, example_inputs, input_names, opset)
    frozen = {name for name, _ in module.named_buffers()}
    return import_onnx(data, frozen, fuse), data

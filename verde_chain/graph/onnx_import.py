"""ONNX forward graph (opsets 13-21, float32, static shapes) -> :class:`verde_chain.graph.ir.Model`.

This module is the importer's core (static values, attribute checks, graph inputs, the entry
points); each op's handler lives with its IR operator in ``graph/operators`` and is looked up in
``operators.ONNX_IMPORTERS``.

Supported ops: ``supported_ops()`` (Constant and the registered importers; docs/training.md
lists them), plus initializers. Anything else — ops, attributes, dtypes, dynamic dimensions —
raises :class:`UnsupportedModelError` naming the node.

Initializers and Constant nodes are *static*: integer ones only feed shape/axes arguments; float
ones with one element become CONST immediates of ``scalar`` ops; other float ones become
trainable parameters, except the names in ``frozen`` (state carried unchanged). Binary ops whose
operands are both static are folded at import with numpy binary32 arithmetic (IEEE, correctly
rounded, so the folded constant is reproducible; it is committed in C_0 anyway).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.fusion import fuse_gelu
from verde_chain.graph.ir import Model, OpNode, Value
from verde_chain.graph.operators import ONNX_IMPORTERS
from verde_chain.repops.library.shapes import Shape

MIN_OPSET, MAX_OPSET = 13, 21
FLOAT = onnx.TensorProto.FLOAT
INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


class Importer:
    """One model's import. The op handlers read ``proto``, ``opset``, ``static`` (name -> constant
    array) and ``model``, and use the public helpers below; everything else is the core's."""

    def __init__(self, model: onnx.ModelProto, frozen: Iterable[str] = (), name: str = "model") -> None:
        self.proto = model
        self.frozen = set(frozen)
        self.name = name
        self.static: dict[str, np.ndarray] = {}
        self.model = Model(values={}, ops=[], inputs=[], outputs=[])
        self.opset = 0

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

    # ------------------------------------------------------------------ helpers for the op handlers
    def who(self, node: onnx.NodeProto) -> str:
        return f"{node.op_type} node {node.name or node.output[0]!r}"

    def attrs(self, node: onnx.NodeProto) -> dict[str, Any]:
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def check_attrs(self, node: onnx.NodeProto, allowed: dict[str, Any]) -> dict[str, Any]:
        """Attributes with defaults; unknown attributes or unsupported values are refused."""
        got = self.attrs(node)
        for k in got:
            if k not in allowed:
                raise UnsupportedModelError(self.who(node), f"attribute {k!r}", sorted(allowed))
        return {**allowed, **got}

    def value(self, name: str, node: onnx.NodeProto) -> str:
        """Make sure a float tensor named ``name`` exists as a model value (creating params)."""
        if name in self.model.values:
            return name
        if name in self.static:
            arr = self.static[name]
            if arr.dtype != np.float32:
                raise UnsupportedModelError(self.who(node), f"tensor {name!r} has dtype {arr.dtype}", "float32 data")
            role = "const" if name in self.frozen else "param"
            shape = tuple(int(d) for d in arr.shape)
            self.model.add_value(Value(name, shape, role, np.ascontiguousarray(arr, dtype=np.float32)))
            return name
        raise UnsupportedModelError(self.who(node), f"input {name!r} is not produced by any supported node")

    def float_input(self, name: str, node: onnx.NodeProto) -> str:
        v = self.model.values.get(name)
        if v is not None and v.role == "input" and self.model.integer_inputs.get(name):
            raise UnsupportedModelError(self.who(node), f"integer input {name!r} used as data", "indices only (Gather)")
        return self.value(name, node)

    def ints(self, name: str, node: onnx.NodeProto, what: str) -> list[int]:
        arr = self.static.get(name)
        if arr is None:
            raise UnsupportedModelError(self.who(node), f"{what} {name!r} must be a constant")
        return [int(x) for x in np.asarray(arr).reshape(-1)]

    def emit(self, node: onnx.NodeProto, ir_op: str, inputs: list[str], out_shape: Shape, **attrs: Any) -> None:
        out = node.output[0]
        self.model.add_value(Value(out, tuple(int(d) for d in out_shape), "tmp"))
        self.model.ops.append(OpNode(ir_op, tuple(inputs), out, attrs, self.who(node)))

    def shape(self, name: str) -> Shape:
        if name in self.model.values:
            return self.model.values[name].shape
        return tuple(int(d) for d in self.static[name].shape)

    def is_static(self, name: str) -> bool:
        return name in self.static and name not in self.model.values

    def broadcast(self, a: Shape, b: Shape, node: onnx.NodeProto) -> Shape:
        """The numpy broadcast of two shapes, or the node's error."""
        try:
            return tuple(int(d) for d in np.broadcast_shapes(a, b))
        except ValueError:
            raise UnsupportedModelError(self.who(node), f"shapes {a} and {b} do not broadcast") from None

    # ------------------------------------------------------------------ nodes
    def _node(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedModelError(self.who(node), f"domain {node.domain!r}", "the default ONNX domain")
        if node.op_type == "Constant":
            self._constant(node)
            return
        handler = ONNX_IMPORTERS.get(node.op_type)
        if handler is None:
            raise UnsupportedModelError(self.who(node), f"op {node.op_type!r} is not supported", supported_ops())
        handler(self, node)

    def _constant(self, node: onnx.NodeProto) -> None:
        a = self.attrs(node)
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
            raise UnsupportedModelError(self.who(node), f"Constant with {sorted(a)}", "value, value_float(s), value_int(s)")
        self.static[node.output[0]] = arr


def supported_ops() -> list[str]:
    """Every ONNX op type the importer accepts."""
    return sorted({"Constant", *ONNX_IMPORTERS})


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

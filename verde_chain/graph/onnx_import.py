"""ONNX forward graph (opsets 13-21, float32, static shapes) -> :class:`verde_chain.graph.ir.Model`.

This module is the importer's core (static values, folding, attribute checks, graph inputs, the
entry points); each op's handler lives with its IR operator in ``graph/operators`` and is looked
up in ``operators.ONNX_IMPORTERS``.

Supported ops: ``supported_ops()`` (Constant and the registered importers; docs/training.md
lists them), plus initializers and static folding. Anything else — ops, attributes, dtypes,
dynamic dimensions — raises :class:`UnsupportedModelError` naming the node.

Float initializers are trainable parameters, except the names in ``frozen`` (``import_torch``
freezes the module's buffers); one with a single element read as the scalar operand of an
arithmetic op is a CONST immediate instead. Every other initializer, every Constant and every
node whose inputs are all static is *static*: a node of static inputs is evaluated at
import (``graph/folding.py``), and so are Shape and Size. A static float with one element used
by an arithmetic op becomes a CONST immediate (a ``scalar`` op); any other static tensor that
reaches the data path becomes a ``const`` value (state carried unchanged, committed in C_0).

Values have a dtype: ``float``, or ``int`` / ``bool`` held as binary32 (integers below 2**24,
booleans 0.0 / 1.0; docs/repops-spec.md). Integer and boolean tensors may be moved, compared,
selected and used as indices; arithmetic on them is refused (it is folded when static).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from verde_chain.graph.errors import ModelExportError, UnsupportedModelError
from verde_chain.graph.folding import SHAPE_OPS, fold
from verde_chain.graph.fusion import fold_transposes, fuse_batch_norm, fuse_gelu, fuse_gelu_tanh
from verde_chain.graph.ir import EXACT_INT, Model, OpNode, Value
from verde_chain.graph.operators import ONNX_IMPORTERS
from verde_chain.repops.library.shapes import Shape

MIN_OPSET, MAX_OPSET = 13, 21
FLOAT = onnx.TensorProto.FLOAT
INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


def dtype_of(arr: np.ndarray) -> str:
    """The IR dtype of a numpy array: float, int or bool."""
    if arr.dtype == np.bool_:
        return "bool"
    if np.issubdtype(arr.dtype, np.integer):
        return "int"
    return "float"


def as_f32(arr: np.ndarray, who: str) -> np.ndarray:
    """A static tensor as binary32: floats rounded once (float32 already), integers exact below
    2**24 (refused beyond), booleans 0.0 / 1.0."""
    a = np.asarray(arr)
    if np.issubdtype(a.dtype, np.integer):
        if a.size and int(np.abs(a).max()) >= EXACT_INT:
            raise UnsupportedModelError(who, f"integer tensor with values up to {int(np.abs(a).max())}",
                                        "integers below 2**24 (exact in binary32)")
        return a.astype(np.float32)
    if a.dtype not in (np.float32, np.bool_):
        raise UnsupportedModelError(who, f"tensor of dtype {a.dtype}", "float32, integers, booleans")
    return np.ascontiguousarray(a, dtype=np.float32)


class Importer:
    """One model's import. The op handlers read ``proto``, ``opset``, ``static`` (name -> constant
    array) and ``model``, and use the public helpers below; everything else is the core's."""

    def __init__(self, model: onnx.ModelProto, frozen: Iterable[str] = (), name: str = "model") -> None:
        self.proto = model
        self.frozen = set(frozen)
        self.name = name
        self.static: dict[str, Any] = {}  # name -> array (or list of arrays: an ONNX sequence)
        self.params: dict[str, np.ndarray] = {}  # trainable initializers, made values on first use
        self.sequences: dict[str, tuple[str, int, list[int]]] = {}  # SplitToSequence: (input, axis, sizes)
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}  # const values by content
        self.model = Model(values={}, ops=[], inputs=[], outputs=[])
        self.opset = 0

    # ------------------------------------------------------------------ entry
    def run(self) -> Model:
        self._check_opset()
        g = self.proto.graph
        for init in g.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype == np.float32 and init.name not in self.frozen:
                self.params[init.name] = arr
            else:
                self.static[init.name] = arr
        problems = self._import_graph()
        if problems:
            raise UnsupportedModelError.of(problems)
        # drop parameters no op reads (e.g. folded away)
        used = {n for op in self.model.ops for n in op.inputs}
        for k in [k for k, v in self.model.values.items() if v.role in ("param", "const") and k not in used]:
            del self.model.values[k]
        return self.model

    def _import_graph(self) -> list[UnsupportedModelError]:
        """Import the graph inputs, nodes and outputs; every problem is collected, not only the
        first. The outputs of a refused node (or graph input) are unknown; a node reading an
        unknown value is refused only if its own op has no handler, and shape arithmetic on
        unknown values (which would have been folded) is never refused."""
        problems: list[UnsupportedModelError] = []
        g = self.proto.graph
        unknown: set[str] = set()
        unknown_static: set[str] = set()  # would have been static (Shape of an unknown value, ...)
        for inp in g.input:
            if inp.name in self.static or inp.name in self.params:
                continue
            try:
                self._graph_input(inp)
            except UnsupportedModelError as exc:
                problems.append(exc)
                unknown.add(inp.name)
        for node in g.node:
            ins = [n for n in node.input if n]
            outs = [o for o in node.output if o]
            try:
                if not any(n in unknown or n in unknown_static for n in ins):
                    self._node(node)
                elif node.op_type in SHAPE_OPS or all(n in self.static or n in unknown_static for n in ins):
                    unknown_static.update(outs)
                else:
                    self._check_known_op(node)
                    unknown.update(outs)
            except UnsupportedModelError as exc:
                problems.append(exc)
                unknown.update(outs)
        for out in g.output:
            if out.name in unknown or out.name in unknown_static:
                continue
            if out.name not in self.model.values:
                problems.append(UnsupportedModelError(out.name, "graph output is not computed by a supported node"))
            else:
                self.model.outputs.append(out.name)
        return problems

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
        self.model.add_value(Value(inp.name, tuple(dims), "input", dtype="int" if tt.elem_type in INT_TYPES else "float"))
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
        """Make sure a tensor named ``name`` exists as a model value: a parameter on its first
        use, or a static tensor that reaches the data path as a ``const`` value."""
        if name in self.model.values:
            return name
        if name in self.params:
            arr = self.params[name]
            if arr.dtype != np.float32:
                raise UnsupportedModelError(self.who(node), f"parameter {name!r} has dtype {arr.dtype}", "float32")
            self.model.add_value(Value(name, tuple(int(d) for d in arr.shape), "param", np.ascontiguousarray(arr)))
            return name
        if name in self.static and isinstance(self.static[name], np.ndarray):
            arr = self.static[name]
            data = as_f32(arr, self.who(node))
            # equal constants (each layer's copy of the mask or the rotary tables) share one value
            key = (dtype_of(arr), data.shape, data.tobytes())
            if key in self._consts:
                return self._consts[key]
            self._consts[key] = name
            self.model.add_value(Value(name, tuple(int(d) for d in arr.shape), "const", data, dtype_of(arr)))
            return name
        raise UnsupportedModelError(self.who(node), f"input {name!r} is not produced by any supported node")

    def float_input(self, name: str, node: onnx.NodeProto) -> str:
        """A value that arithmetic may read: float, not an integer or boolean tensor."""
        v = self.value(name, node)
        if self.model.values[v].dtype != "float":
            raise UnsupportedModelError(self.who(node), f"{self.model.values[v].dtype} tensor {name!r} used as "
                                        "float data", "integers as indices; booleans in Where and logic")
        return v

    def scalar_const(self, name: str) -> float | None:
        """The value of a one-element float constant (a static tensor, or an initializer not
        yet used as a tensor), which an arithmetic op takes as a CONST immediate; else None."""
        arr = self.static.get(name)
        if arr is None and name in self.params and name not in self.model.values:
            arr = self.params[name]
        if isinstance(arr, np.ndarray) and arr.size == 1 and arr.dtype == np.float32:
            return float(arr.reshape(()))
        return None

    def dtype(self, name: str) -> str:
        if name in self.model.values:
            return self.model.values[name].dtype
        if name in self.params:
            return "float"
        return dtype_of(np.asarray(self.static[name]))

    def ints(self, name: str, node: onnx.NodeProto, what: str) -> list[int]:
        arr = self.static.get(name)
        if arr is None:
            raise UnsupportedModelError(self.who(node), f"{what} {name!r} must be a constant")
        return [int(x) for x in np.asarray(arr).reshape(-1)]

    def emit(self, node: onnx.NodeProto, ir_op: str, inputs: list[str], out_shape: Shape, dtype: str = "float",
             output: str | None = None, **attrs: Any) -> None:
        out = output or node.output[0]
        self.model.add_value(Value(out, tuple(int(d) for d in out_shape), "tmp", dtype=dtype))
        self.model.ops.append(OpNode(ir_op, tuple(inputs), out, attrs, self.who(node)))

    def shape(self, name: str) -> Shape:
        if name in self.model.values:
            return self.model.values[name].shape
        if name in self.params:
            return tuple(int(d) for d in self.params[name].shape)
        return tuple(int(d) for d in np.shape(self.static[name]))

    def is_read(self, name: str) -> bool:
        """Whether a node or the graph's outputs read the value ``name`` (optional outputs an
        exporter emits but nothing reads, like Dropout's mask, are accepted)."""
        g = self.proto.graph
        return bool(name) and (any(name in n.input for n in g.node) or any(name == o.name for o in g.output))

    def state_value(self, name: str, node: onnx.NodeProto) -> str:
        """A float initializer as carried state that no optimizer trains and no two nodes share
        (batch norm's running statistics: the node updates them each step), even where an equal
        constant exists elsewhere."""
        if name in self.model.values:
            return name
        arr = self.params.pop(name, None)
        if arr is None:
            arr = self.static.get(name)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
            raise UnsupportedModelError(self.who(node), f"{name!r} is not a float32 initializer")
        self.model.add_value(Value(name, tuple(int(d) for d in arr.shape), "const", np.ascontiguousarray(arr)))
        return name

    def is_static(self, name: str) -> bool:
        return name in self.static

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
        if self._fold(node):
            return
        self._check_known_op(node)
        ONNX_IMPORTERS[node.op_type](self, node)

    def _check_known_op(self, node: onnx.NodeProto) -> None:
        """Refuse a node whose domain or op type has no handler (checked without its inputs)."""
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedModelError(self.who(node), f"domain {node.domain!r}", "the default ONNX domain")
        if node.op_type != "Constant" and node.op_type not in ONNX_IMPORTERS:
            raise UnsupportedModelError(self.who(node), f"op {node.op_type!r} is not supported", supported_ops())

    def _fold(self, node: onnx.NodeProto) -> bool:
        """Evaluate the node now if everything it reads is static (graph/folding.py)."""
        if node.op_type in SHAPE_OPS and node.input[0] not in self.static:
            known = node.input[0] in self.model.values or node.input[0] in self.params
            if not known:
                return False
            ins: list[Any] = [np.broadcast_to(np.float32(0), self.shape(node.input[0]))]
        elif node.input and all(not n or n in self.static for n in node.input):
            ins = [self.static[n] if n else None for n in node.input]
        else:
            return False
        try:
            outs = fold(node, ins, self.opset)
        except UnsupportedModelError:
            raise
        except Exception as exc:  # onnx.reference raises whatever numpy raises
            raise UnsupportedModelError(self.who(node), f"cannot fold on its constant inputs: {exc}") from exc
        for name, arr in zip(node.output, outs):
            if name:
                self.static[name] = arr if isinstance(arr, list) else np.asarray(arr)
        return True

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
    """Import a model; ``fuse`` applies the pattern rewrites of ``graph/fusion.py`` (erf- and
    tanh-form GELU, transposes folded into matmul operands, batch norm + residual Add + Relu / Clip)."""
    model = Importer(load_onnx(source), frozen).run()
    if fuse:
        fuse_gelu(model)
        fuse_gelu_tanh(model)
        fold_transposes(model)
        fuse_batch_norm(model)
    return model


def export_torch(
    module: Any, example_inputs: Any, input_names: list[str] | None = None, opset: int = 17, training: bool = False
) -> bytes:
    """torch.onnx.export (TorchScript exporter, offline) with fixed shapes; returns the ONNX bytes.

    ``training``: export the module in train() mode (BatchNormalization with batch statistics
    and running-statistics updates, Dropout active), without constant folding, so that those
    nodes keep their training semantics. Tracing runs the module once, which in train() mode
    moves its running statistics: the export traces a copy, and the exported buffers are the
    module's own. The module is left in eval() mode either way.

    Any failure of torch's exporter (an unsupported torch op, data-dependent control flow, a
    wrong example input) is :class:`ModelExportError` naming the module and torch's reason."""
    import copy
    import warnings

    import torch

    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    buf = io.BytesIO()
    target: Any = buf  # a BytesIO is accepted at run time although the stub says path
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    traced = copy.deepcopy(module) if training else module
    traced.train(training)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                traced, args, target, opset_version=opset, dynamo=False, input_names=input_names,
                output_names=["output"], do_constant_folding=not training, training=mode,
            )
    except Exception as exc:  # torch raises RuntimeError, TypeError, its own export errors ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelExportError(
            f"torch.onnx.export could not export {type(module).__name__}: {type(exc).__name__}: {reason} "
            "(check the example input's shape and dtype; a module whose control flow depends on tensor values "
            "cannot be exported with fixed shapes)", module=type(module).__name__) from exc
    finally:
        module.eval()
    if not training:
        return buf.getvalue()
    proto = onnx.load_from_string(buf.getvalue())
    buffers = {name: b.detach().cpu().numpy() for name, b in module.named_buffers()}
    for init in proto.graph.initializer:
        if init.name in buffers:
            init.CopyFrom(numpy_helper.from_array(buffers[init.name], init.name))
    return proto.SerializeToString()


def import_torch(
    module: Any, example_inputs: Any, input_names: list[str] | None = None, opset: int = 17, fuse: bool = True
) -> tuple[Model, bytes]:
    """Export ``module`` to ONNX and import it. Buffers are frozen; returns (model, onnx bytes)."""
    data = export_torch(module, example_inputs, input_names, opset)
    frozen = {name for name, _ in module.named_buffers()}
    return import_onnx(data, frozen, fuse), data

"""ONNX backend node-test conformance of the RepOps compositions.

Each official node test case (``onnx.backend.test.loader.load_model_tests(kind="node")``: a
single-node model and its input/output tensors) is translated into a RepOps composition
(``verde_chain.repops.library``), executed with the numpy reference, and compared at the case's own
tolerances (rtol=1e-3, atol=1e-7 by default, like ONNX's backend runner). Shape-like inputs
(Reshape shape, Reduce axes, Slice starts, optimizer R/T) are read from the case data: in RepOps
they are graph-build-time constants. Cases outside the supported set are skipped with the reason.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

import numpy as np
import pytest
from onnx import helper

from verde_chain.errors import RepOpsError
from verde_chain.repops import library
from verde_chain.repops.isa import Op
from verde_chain.repops.program import KernelDesc

F32 = np.float32


class Unsupported(Exception):
    """The case uses a dtype, attribute or op RepOps does not support (pytest skip reason)."""


@functools.lru_cache(maxsize=1)
def _cases() -> dict[str, Any]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {t.name: t for t in load_model_tests(kind="node")}


OPS = frozenset(
    [
        "Add", "Sub", "Mul", "Div", "Max", "Min", "Abs", "Neg", "Floor", "Ceil", "Sqrt", "Exp", "Log", "Tanh",
        "Erf", "Sigmoid", "Reciprocal", "Relu", "Round", "Identity", "LeakyRelu", "Clip", "Equal", "Less",
        "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "Gelu", "MatMul", "Gemm", "Softmax", "LogSoftmax",
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "Transpose", "Reshape", "Flatten", "Squeeze",
        "Unsqueeze", "Expand", "Slice", "Gather", "GatherElements", "LayerNormalization",
        "SoftmaxCrossEntropyLoss", "Adam", "Momentum", "Cast", "CastLike", "Sum", "Pow",
        "NegativeLogLikelihoodLoss", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization",
        "Pad", "HardSigmoid", "HardSwish", "Softplus", "Dropout", "Concat",
    ]
)
NAME_RE = re.compile(
    r"^test_(add|sub|mul|div|max|min|abs|neg|floor|ceil|sqrt|exp|log|tanh|erf|sigmoid|reciprocal|relu|round|"
    r"identity|leakyrelu|clip|equal|less|greater|where|gelu|matmul|gemm|softmax|logsoftmax|reduce_|transpose|"
    r"reshape|flatten|squeeze|unsqueeze|expand|slice|gather|layer_normalization|sce|adam|momentum|nesterov|"
    r"conv|maxpool|averagepool|globalaveragepool|batchnorm|constant_pad|pad|hardsigmoid|hardswish|softplus|"
    r"dropout|training_dropout|concat|reflect_pad|edge_pad|wrap_pad|basic_conv)"
)


def _attrs(node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _f32(x: np.ndarray, what: str) -> np.ndarray:
    if x.dtype != np.float32:
        raise Unsupported(f"{what} has dtype {x.dtype}; RepOps computes float32 only")
    if x.size == 0:
        raise Unsupported(f"{what} is empty; zero-size tensors are not supported")
    return x


def _intlike(x: np.ndarray, what: str) -> np.ndarray:
    """int64 indices/labels as exact float32 integral values."""
    if x.dtype not in (np.int64, np.int32):
        raise Unsupported(f"{what} has dtype {x.dtype}")
    if x.size and np.abs(x).max() >= 2**24:
        raise Unsupported(f"{what} has values beyond 2**24")
    return x.astype(F32)


def _single(desc: KernelDesc, ins: list[np.ndarray]) -> tuple[library.Composite, list[np.ndarray]]:
    return library.single(desc, [x.shape for x in ins]), ins


def _reshape_target(shape: tuple[int, ...], target: np.ndarray, allowzero: int) -> tuple[int, ...]:
    t = [int(v) for v in target]
    out = [shape[i] if v == 0 and not allowzero else v for i, v in enumerate(t)]
    if -1 in out:
        known = int(np.prod([v for v in out if v != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // known
    return tuple(out)


def _reduce_axes(node_attrs: dict[str, Any], ins: list[np.ndarray], opset: int, op: str) -> tuple[int, ...] | None | str:
    axes_input_opset = 13 if op == "ReduceSum" else 18
    if opset >= axes_input_opset:
        axes = [int(a) for a in ins[1]] if len(ins) > 1 and ins[1].size else []
    else:
        axes = list(node_attrs.get("axes", []))
    if not axes:
        return "noop" if node_attrs.get("noop_with_empty_axes", 0) else None
    return tuple(axes)


def translate(node: Any, opset: int, raw: list[np.ndarray]) -> tuple[library.Composite, list[np.ndarray]]:
    op, at = node.op_type, _attrs(node)
    # data sets hold only the inputs whose name is non-empty; align them with node.input
    it = iter(raw)
    args: list[np.ndarray | None] = [next(it) if name else None for name in node.input]
    present = [x for x in args if x is not None]

    def opt(i: int) -> np.ndarray | None:
        return args[i] if len(args) > i else None

    if op in ("Add", "Sub", "Mul", "Div"):
        a, b = (_f32(x, op) for x in present)
        return _single(library.binary(op.lower(), a.shape, b.shape), [a, b])
    if op in ("Cast", "CastLike"):
        x = _f32(present[0], op)
        to = at.get("to") if op == "Cast" else helper.np_dtype_to_tensor_dtype(present[1].dtype)
        if to != 1:  # TensorProto.FLOAT
            raise Unsupported(f"{op} from float32 to type {to}")
        return _single(library.map_unary("identity", x.shape), [x])
    if op == "Pow":
        x, e = _f32(present[0], op), _f32(present[1], op)
        p = float(e.reshape(-1)[0]) if e.size == 1 else None
        if p not in (1.0, 2.0, 3.0, 4.0):
            raise Unsupported("Pow with an exponent other than a constant integer 1..4")
        # x**n as the left-to-right product chain MUL(MUL(x, x), x) ... (RepOps has no pow)
        code = [library.I(Op.MUL, 1, 1, 0) for _ in range(int(p) - 1)]
        return _single(library.elementwise("pow", [x.shape], [library.I(Op.MOV, 1, 0), *code, library.I(Op.MOV, 0, 1)]), [x])
    if op in ("Max", "Min", "Sum"):
        xs = [_f32(x, op) for x in present]
        bld = library.Builder(op, *[x.shape for x in xs])
        acc = bld.unary("identity", 0) if len(xs) == 1 else 0
        for i in range(1, len(xs)):  # variadic: left to right
            acc = bld.binary({"Sum": "add"}.get(op, op.lower()), acc, i)
        return bld.build(acc), xs
    unary = {"Abs": "abs", "Neg": "neg", "Floor": "floor", "Ceil": "ceil", "Sqrt": "sqrt", "Exp": "exp",
             "Log": "log", "Tanh": "tanh", "Erf": "erf", "Sigmoid": "sigmoid", "Reciprocal": "reciprocal",
             "Relu": "relu", "Round": "round", "Identity": "identity"}
    if op in unary:
        (x,) = present
        x = _f32(x, op)
        return _single(library.map_unary(unary[op], x.shape), [x])
    if op == "Gelu":
        x = _f32(present[0], op)
        return _single(library.gelu(x.shape, at.get("approximate", "none")), [x])
    if op == "LeakyRelu":
        x = _f32(present[0], op)
        return _single(library.leaky_relu(x.shape, at.get("alpha", 0.01)), [x])
    if op == "Clip":
        x = _f32(present[0], op)
        bounds = [opt(1), opt(2)]
        if any(v is not None and v.dtype != np.float32 for v in bounds):
            raise Unsupported("non-float32 clip bounds")
        lo = float(bounds[0]) if bounds[0] is not None else at.get("min")
        hi = float(bounds[1]) if bounds[1] is not None else at.get("max")
        return _single(library.clip(x.shape, lo, hi), [x])
    cmp = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}
    if op in cmp:
        a, b = (_f32(x, op) for x in present)
        return _single(library.binary(cmp[op], a.shape, b.shape), [a, b])
    if op == "Where":
        c, x, y = present
        if c.dtype != np.bool_:
            raise Unsupported("Where condition must be bool")
        x, y = _f32(x, op), _f32(y, op)
        return _single(library.where(c.shape, x.shape, y.shape), [c.astype(F32), x, y])
    if op == "MatMul":
        a, b = (_f32(x, op) for x in present)
        return _single(library.matmul(a.shape, b.shape), [a, b])
    if op == "Gemm":
        a, b = _f32(raw[0], op), _f32(raw[1], op)
        c = _f32(opt(2), op) if opt(2) is not None else None  # type: ignore[arg-type]
        alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
        desc = library.gemm(a.shape, b.shape, None if c is None else c.shape, alpha, beta,
                         bool(at.get("transA", 0)), bool(at.get("transB", 0)))
        ins = [a, b] + ([c] if c is not None and beta != 0.0 else [])
        return _single(desc, ins)
    if op in ("Softmax", "LogSoftmax"):
        x = _f32(present[0], op)
        axis = at.get("axis", -1 if opset >= 13 else 1)
        axis = axis + x.ndim if axis < 0 else axis
        axes = (axis,) if opset >= 13 else tuple(range(axis, x.ndim))  # pre-13: coerced to 2-D
        f = library.softmax if op == "Softmax" else library.log_softmax
        return f(x.shape, axes), [x]
    if op.startswith("Reduce"):
        x = _f32(present[0], op)
        axes = _reduce_axes(at, present, opset, op)
        keep = bool(at.get("keepdims", 1))
        if axes == "noop":
            return _single(library.map_unary("identity", x.shape), [x])
        kind = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sumsq",
                "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp"}[op]
        return library.reduce_composite(kind, x.shape, axes, keep), [x]  # type: ignore[arg-type]
    if op == "Transpose":
        x = _f32(present[0], op)
        return _single(library.transpose(x.shape, at.get("perm")), [x])
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        x = _f32(present[0], op)
        if op == "Reshape":
            new = _reshape_target(x.shape, present[1], at.get("allowzero", 0))
        elif op == "Flatten":
            ax = at.get("axis", 1)
            ax = ax + x.ndim if ax < 0 else ax
            new = (int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:])))
        elif op == "Squeeze":
            axes = [int(a) for a in present[1]] if len(present) > 1 else at.get("axes")
            axes = [i for i, d in enumerate(x.shape) if d == 1] if axes is None else [a % x.ndim for a in axes]
            new = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        else:
            axes = [int(a) for a in present[1]] if len(present) > 1 else list(at["axes"])
            rank = x.ndim + len(axes)
            axes = sorted(a % rank for a in axes)
            it = iter(x.shape)
            new = tuple(1 if i in axes else next(it) for i in range(rank))
        return _single(library.reshape(x.shape, new), [x])
    if op == "Expand":
        x = _f32(present[0], op)
        return _single(library.expand(x.shape, tuple(int(v) for v in present[1])), [x])
    if op == "Slice":
        x = _f32(present[0], op)
        starts, ends = [int(v) for v in present[1]], [int(v) for v in present[2]]
        axes = [int(v) for v in present[3]] if len(present) > 3 else list(range(len(starts)))
        steps = [int(v) for v in present[4]] if len(present) > 4 else [1] * len(starts)
        s0, e0, st0 = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for a, s, e, k in zip(axes, starts, ends, steps):
            a %= x.ndim
            s0[a], e0[a], st0[a] = s, max(min(e, 2**62), -(2**62)), k
        # python slice semantics == ONNX clamping; an end at -inf-ish means "through the start"
        e0 = [None if (k < 0 and e < -x.shape[a]) else e for a, (e, k) in enumerate(zip(e0, st0))]  # type: ignore[misc]
        return _single(library.slice_(x.shape, s0, e0, st0), [x])  # type: ignore[arg-type]
    if op == "Gather":
        data, idx = _f32(present[0], op), _intlike(present[1], "Gather indices")
        return _single(library.gather(data.shape, idx.shape, at.get("axis", 0)), [data, idx])
    if op == "GatherElements":
        data, idx = _f32(present[0], op), _intlike(present[1], "GatherElements indices")
        return _single(library.gather_elements(data.shape, idx.shape, at.get("axis", 0)), [data, idx])
    if op == "LayerNormalization":
        x = _f32(present[0], op)
        if at.get("stash_type", 1) != 1:
            raise Unsupported("stash_type != float32")
        axis = at.get("axis", -1)
        axis = axis + x.ndim if axis < 0 else axis
        w = _f32(present[1], op)
        b = _f32(present[2], op) if len(present) > 2 else None
        if w.shape != x.shape[axis:] or (b is not None and b.shape != x.shape[axis:]):
            raise Unsupported("scale/bias broadcast other than the normalized shape")
        comp = library.layer_norm(x.shape, axis, at.get("epsilon", 1e-5), True, b is not None)
        return comp, [x, w] + ([b] if b is not None else [])
    if op == "SoftmaxCrossEntropyLoss":
        x = _f32(raw[0], op)
        lab = _intlike(raw[1], "labels")
        w = _f32(opt(2), op) if opt(2) is not None else None  # type: ignore[arg-type]
        comp = library.softmax_cross_entropy(x.shape, at.get("reduction", "mean"), w is not None, at.get("ignore_index"))
        return comp, [x, lab] + ([w] if w is not None else [])
    if op == "NegativeLogLikelihoodLoss":
        x = _f32(present[0], op)
        lab = _intlike(present[1], "target")
        w = _f32(opt(2), op) if opt(2) is not None else None  # type: ignore[arg-type]
        comp = library.nll_loss(x.shape, at.get("reduction", "mean"), w is not None, at.get("ignore_index"))
        return comp, [x, lab] + ([w] if w is not None else [])
    if op in ("Adam", "Momentum"):
        r, t = float(_f32(raw[0], "R")), int(raw[1])
        groups = 4 if op == "Adam" else 3
        n = (len(raw) - 2) // groups
        tensors = [_f32(x, op) for x in raw[2:]]
        comps, ins = [], []
        for i in range(n):
            xs = [tensors[i + j * n] for j in range(groups)]
            if op == "Adam":
                c = library.onnx_adam(xs[0].shape, r, t, at.get("alpha", 0.9), at.get("beta", 0.999), at.get("epsilon", 0.0),
                                   at.get("norm_coefficient", 0.0), at.get("norm_coefficient_post", 0.0))
            else:
                c = library.onnx_momentum(xs[0].shape, r, t, at["alpha"], at["beta"], at["norm_coefficient"], at["mode"])
            comps.append(c)
            ins.append(xs)
        return _multi(comps, ins, n)
    vision = _vision(op, at, present, opt, [o for o in node.output if o])
    if vision is not None:
        return vision
    raise Unsupported(f"op {op} is not in the RepOps ONNX set")


def _viewed(desc: KernelDesc, ins: list[np.ndarray], shape: tuple[int, ...]) -> tuple[library.Composite, list[np.ndarray]]:
    """One node whose output is read as ``shape`` (a free view, as the graph does)."""
    b = library.Builder(desc.label, *[x.shape for x in ins])
    return b.build(b.view(b.node(desc, *b.inputs()), shape)), ins


def _vision(op: str, at: dict[str, Any], present: list[np.ndarray], opt: Any, outputs: list[str]) -> Any:
    """The vision operators (repops/library/conv.py, nn.py, maps.py, movement.py), or None."""
    if op in ("MaxPool", "Dropout") and len(outputs) > 1:
        raise Unsupported(f"{op}'s second output ({'Indices' if op == 'MaxPool' else 'mask'}): the importer "
                          "refuses a model that reads it")
    if op == "Concat":
        xs = [_f32(x, op) for x in present]
        return _single(library.concat([x.shape for x in xs], at["axis"]), xs)
    if op in ("Conv", "MaxPool", "AveragePool"):
        x = _f32(present[0], op)
        if op == "MaxPool" and at.get("storage_order", 0):
            raise Unsupported("MaxPool storage_order (only its Indices output, which is not supported)")
        if op == "Conv":
            w = _f32(present[1], "weight")
            geo = library.ConvGeometry.from_onnx(x.shape, w.shape[2:], at)
            ins = [x, w] + ([_f32(present[2], "bias")] if len(present) > 2 else [])
            desc = library.convolution(geo, w.shape, at.get("group", 1), len(ins) == 3)
            return _viewed(desc, ins, (x.shape[0], w.shape[0], *geo.out_spatial))
        geo = library.ConvGeometry.from_onnx(x.shape, at["kernel_shape"], at)
        desc = library.max_pool(geo) if op == "MaxPool" else library.avg_pool(geo, bool(at.get("count_include_pad", 0)))
        return _single(desc, [x])
    if op == "GlobalAveragePool":
        x = _f32(present[0], op)
        return library.reduce_composite("mean", x.shape, tuple(range(2, x.ndim)), True), [x]
    if op == "BatchNormalization":
        x, sc, bi, mean, var = (_f32(v, op) for v in present[:5])
        if at.get("training_mode", 0):
            comp = library.batch_norm_training(x.shape, at.get("epsilon", 1e-5), at.get("momentum", 0.9))
            return _multi_out(comp, [0, 3, 4]), [x, sc, bi, mean, var]
        return _multi_out(library.batch_norm_inference(x.shape, at.get("epsilon", 1e-5)), [0]), [x, sc, bi, mean, var]
    if op == "Pad":
        x = _f32(present[0], op)
        if at.get("mode", "constant") != "constant":
            raise Unsupported(f"Pad mode={at.get('mode')!r}: only constant padding is supported")
        axes = [int(a) for a in opt(3)] if opt(3) is not None else None
        value = float(opt(2).reshape(())) if opt(2) is not None else 0.0
        return _single(library.pad(x.shape, library.onnx_pads(x.ndim, present[1], axes), value), [x])
    if op in ("HardSigmoid", "HardSwish"):
        x = _f32(present[0], op)
        if op == "HardSwish":
            return _single(library.hard_swish(x.shape), [x])
        return _single(library.hard_sigmoid(x.shape, at.get("alpha", 0.2), at.get("beta", 0.5)), [x])
    if op == "Softplus":
        x = _f32(present[0], op)
        b = library.Builder("softplus", x.shape)
        t = b.unary("exp", 0)
        lg = b.node(library.log1p_exp_log(x.shape), t)
        return b.build(b.node(library.softplus_tail(x.shape), 0, t, lg)), [x]
    if op == "Dropout":
        x = _f32(present[0], op)
        training = opt(2) is not None and bool(opt(2))
        ratio = float(opt(1)) if opt(1) is not None else 0.5
        if training and ratio > 0:
            raise Unsupported("Dropout in training mode: the mask comes from the job's counter-based RNG "
                              "(rng.dropout_keep), not from numpy's generator the reference outputs used")
        return _single(library.map_unary("identity", x.shape), [x])
    return None


def _multi_out(comp: library.Composite, keep: list[int]) -> library.Composite:
    """``comp`` with only the outputs ``keep`` (ONNX's optional outputs in order)."""
    return library.Composite(comp.label, comp.in_shapes, comp.nodes, tuple(comp.outputs[i] for i in keep))


def _multi(comps: list[library.Composite], ins: list[list[np.ndarray]], n: int) -> tuple[library.Composite, list[np.ndarray]]:
    """Run n independent optimizer composites; outputs regrouped as ONNX orders them (by kind)."""

    outs_per = len(comps[0].outputs)

    def run(inputs: list[np.ndarray], runner: Any = None) -> list[np.ndarray]:
        res, off = [], 0
        for c, x in zip(comps, ins):
            res.append(c.run(inputs[off : off + len(x)], runner))
            off += len(x)
        return [res[i][k] for k in range(outs_per) for i in range(n)]

    flat = [x for group in ins for x in group]
    proxy = library.Composite("multi", tuple(x.shape for x in flat), (), ())
    object.__setattr__(proxy, "run", run)
    return proxy, flat


COMPARE = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
# Nodes that only read shapes / integer or bool data: folded with ONNX's reference evaluator,
# exactly like build-time constants of a RepOps graph (no float32 arithmetic happens there).
SHAPE_ONLY = frozenset({"Shape", "Size"})


def run_graph(model: Any, inputs: list[np.ndarray], opset: int) -> list[np.ndarray]:
    """Run a (multi-node) ONNX graph: float32 nodes as RepOps compositions, integer/shape nodes
    and constants folded by onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    env: dict[str, np.ndarray] = {vi.name: x for vi, x in zip(graph.input, inputs)}
    for node in graph.node:
        ins = [env[n] for n in node.input if n]
        if node.op_type not in SHAPE_ONLY and any(x.dtype == np.float32 for x in ins):
            if node.op_type not in OPS:
                raise Unsupported(f"op {node.op_type} (in the expanded graph) is not supported by RepOps")
            comp, args = translate(node, opset, ins)
            outs = comp.run(args)
            if node.op_type in COMPARE:
                outs = [o != 0 for o in outs]
        else:
            if any(x.dtype in (np.float16, np.float64) for x in ins):
                raise Unsupported(f"{node.op_type} on a non-float32 float dtype")
            feeds = {n: env[n] for n in node.input if n}
            outs = [np.asarray(o) for o in ReferenceEvaluator(node).run(None, feeds)]
            if any(o.dtype in (np.float16, np.float64) for o in outs):
                raise Unsupported(f"{node.op_type} produces a non-float32 float dtype")
        for name, o in zip(node.output, outs):
            if name:
                env[name] = o
    return [env[o.name] for o in graph.output]


def _params() -> list[Any]:
    names = sorted(n for n in _cases() if NAME_RE.match(n))
    return names


@pytest.mark.parametrize("name", _params())
def test_onnx_node(name: str) -> None:
    case = _cases()[name]
    graph = case.model.graph
    node = graph.node[0]
    if len(graph.node) == 1 and node.op_type not in OPS:
        pytest.skip(f"op {node.op_type} not supported by RepOps")
    opset = max((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    for inputs, expected in case.data_sets:
        try:
            if len(graph.node) == 1:
                comp, ins = translate(node, opset, [np.asarray(x) for x in inputs])
                got = comp.run(ins)
            else:  # an "_expanded" function body: every float32 node through RepOps
                got = run_graph(case.model, [np.asarray(x) for x in inputs], opset)
        except Unsupported as why:
            pytest.skip(str(why))
        except RepOpsError as why:
            pytest.skip(f"RepOps refuses: {why}")
        names = [o.name for o in graph.output]
        assert len(got) >= len(names)
        for g, exp, oname in zip(got, expected, names):
            e = np.asarray(exp)
            if e.dtype == np.bool_:
                assert g.shape == e.shape and ((g != 0) == e).all(), oname
                continue
            if e.dtype != np.float32:
                pytest.skip(f"output {oname} dtype {e.dtype}")
            assert g.shape == e.shape, (oname, g.shape, e.shape)
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol, err_msg=f"{name}:{oname}")

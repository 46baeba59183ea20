"""Forward model IR: what the ONNX importer produces and the training-graph builder consumes.

A :class:`Model` is a static-shape, float32 dataflow graph of high-level ops (the closed set in
``OPS``). Values are named; every value has one role:

    input   fed per step from the batch (float32; integer ONNX inputs become float32 integral
            values, e.g. token ids and class labels, because RepOps indexes with LOADIDX on floats;
            a batch refuses integers that are negative or not below 2**24)
    mask    a dropout keep-mask (1.0 / +0.0), also fed per step from the batch: made from the
            job's seed by the counter-based RNG (graph/training.py, ``TrainingProgram.batch``)
    param   trainable initializer (part of the state, updated by the optimizer)
    const   non-trainable tensor: a frozen initializer or a folded constant (mask, positions)
            that reaches the data path (part of the state, carried unchanged)
    tmp     produced by an op

Scalar float constants never become tensors: binary ops with one are ``scalar`` ops whose
constant is a CONST immediate of the kernel program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verde_chain.graph.errors import GraphError
from verde_chain.repops.library.shapes import Shape

EXACT_INT = 2**24  # binary32 holds every integer of smaller magnitude exactly

# op name -> attributes it takes (documentation and a guard against typos)
OPS: dict[str, tuple[str, ...]] = {
    "matmul": ("trans_a", "trans_b"),  # an operand read transposed (last two axes): graph/fusion.py
    "gemm": ("alpha", "beta", "trans_a", "trans_b"),
    "binary": ("op",),  # add sub mul div max min pow, comparisons, logic; numpy broadcasting
    "scalar": ("op", "value", "reverse"),  # x op c (reverse: c op x)
    "unary": ("fn",),  # relu tanh exp log sqrt erf sigmoid neg gelu_* sin cos reciprocal isnan not ...
    "pow_const": ("exponent",),  # x ** c for a constant c
    "where": ("consts",),  # where(c, x, y); consts: {operand index: float} for constant branches
    "softmax": ("axis",),
    "log_softmax": ("axis",),
    "layer_norm": ("axis", "eps"),
    "rms_norm": ("axis", "eps"),
    "reduce": ("kind", "axes", "keepdims"),  # sum mean max
    "transpose": ("perm",),
    "reshape": ("shape",),  # a free view
    "expand": ("shape",),
    "slice": ("starts", "ends", "steps"),  # one (start, end, step) per axis, python-slice semantics
    "concat": ("axis",),
    "trilu": ("k", "upper"),
    "gather": ("axis",),  # ONNX Gather: data, indices (integers as binary32)
    "gather_elements": ("axis",),
    "conv": ("kernel", "strides", "dilations", "pads", "groups"),  # x, w[, b]
    "max_pool": ("kernel", "strides", "dilations", "pads", "ceil_mode"),
    "avg_pool": ("kernel", "strides", "dilations", "pads", "ceil_mode", "count_include_pad"),
    # x, scale, bias, running mean, running var[, residual]; residual / act / lo / hi only when
    # graph/fusion.py fused an Add and / or a Relu or Clip into it
    "batch_norm": ("eps", "momentum", "training", "residual", "act", "lo", "hi"),
    "dropout": ("ratio",),  # x, mask (a value of role mask, carried in the batch)
    "clip": ("lo", "hi"),  # None = unbounded
    "activation": ("fn", "alpha", "beta"),  # hard_sigmoid hard_swish softplus
    "pad": ("pads", "value"),  # constant mode; ONNX pads (begins, then ends; negative crops)
}


@dataclass
class Value:
    name: str
    shape: Shape
    role: str  # input | param | const | tmp | mask
    data: np.ndarray | None = None  # float32, for param / const
    dtype: str = "float"  # float | int | bool, all held as binary32 (integers exact below 2**24)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class OpNode:
    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # the source (ONNX) node name, for error messages


@dataclass
class Model:
    values: dict[str, Value]
    ops: list[OpNode]
    inputs: list[str]
    outputs: list[str]
    # ONNX input name -> True when it held integers (token ids): documented in the job spec
    integer_inputs: dict[str, bool] = field(default_factory=dict)

    def add_value(self, v: Value) -> Value:
        if v.name in self.values:
            raise GraphError(f"value {v.name!r} defined twice", value=v.name)
        self.values[v.name] = v
        return v

    def params(self) -> list[Value]:
        return [v for v in self.values.values() if v.role == "param"]

    def consts(self) -> list[Value]:
        return [v for v in self.values.values() if v.role == "const"]

    def masks(self) -> list[tuple[Value, float]]:
        """Dropout masks and their drop ratios, in op order (the RNG stream is the position)."""
        return [(self.values[op.inputs[1]], float(op.attrs["ratio"])) for op in self.ops if op.op == "dropout"]

    def shape(self, name: str) -> Shape:
        return self.values[name].shape

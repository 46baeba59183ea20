"""ONNX import: supported graphs become the IR; anything else fails with a named, clear error."""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from tests.support.graph import build, grad_of, one_step
from verde_chain.errors import VerdeError
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.ir import Model
from verde_chain.graph.onnx_import import export_torch, import_onnx, import_torch
from verde_chain.graph.training import OUTPUT_ROW_FIELD, build_inference_graph


def make(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
         inits: list[onnx.TensorProto] = (), opset: int = 17) -> bytes:  # type: ignore[assignment]
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return m.SerializeToString()


def vi(name: str, shape: list, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:  # type: ignore[type-arg]
    return helper.make_tensor_value_info(name, dtype, shape)


W = numpy_helper.from_array(np.ones((3, 4), dtype=np.float32), "W")


def test_torch_mlp_imports_with_static_shapes() -> None:
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2), nn.LogSoftmax(-1))
    model, data = import_torch(m, torch.zeros(3, 4), ["x"])
    assert [op.op for op in model.ops] == ["gemm", "unary", "gemm", "log_softmax"]
    assert model.inputs == ["x"] and model.shape("x") == (3, 4)
    assert model.shape(model.outputs[0]) == (3, 2)
    assert {v.name for v in model.params()} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert np.array_equal(model.values["0.weight"].data, m[0].weight.detach().numpy())
    assert onnx.load_from_string(data).opset_import[0].version == 17


def test_shared_initializers_become_separate_parameters() -> None:
    # torch deduplicates identical initializers (fresh LayerNorms) through Identity nodes
    m = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4), nn.LayerNorm(4))
    model, _ = import_torch(m, torch.zeros(2, 4), ["x"])
    lns = [op for op in model.ops if op.op == "layer_norm"]
    assert len(lns) == 2 and lns[0].inputs[1] != lns[1].inputs[1]
    assert all(model.values[op.inputs[1]].role == "param" for op in lns)


def test_gelu_and_reduce_opset20() -> None:
    nodes = [helper.make_node("Gelu", ["x"], ["g"], approximate="tanh"),
             helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([1], dtype=np.int64))),
             helper.make_node("ReduceMean", ["g", "ax"], ["y"], keepdims=0)]
    model = import_onnx(make(nodes, [vi("x", [2, 3])], [vi("y", [2])], opset=20))
    assert model.ops[0].attrs["fn"] == "gelu_tanh"
    assert model.ops[1].attrs == {"kind": "mean", "axes": (1,), "keepdims": False}
    assert model.shape("y") == (2,)


def test_unknown_op_names_the_node_and_the_supported_set() -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["y"], name="my_hardmax")]
    with pytest.raises(UnsupportedModelError, match="my_hardmax") as e:
        import_onnx(make(nodes, [vi("x", [2])], [vi("y", [2])]))
    assert "Gemm" in str(e.value) and isinstance(e.value, VerdeError)


def test_every_unsupported_node_is_named_in_one_error() -> None:
    """Hardmax and Det are refused; the Relu after Hardmax is not (its op is supported, it only
    lacks its input), nor is the shape arithmetic on Det's output (it would have been folded);
    Round after Relu is refused too: one message names all three nodes."""
    nodes = [
        helper.make_node("Hardmax", ["x"], ["h"], name="first_bad"),
        helper.make_node("Relu", ["h"], ["r"], name="fine_after_bad"),
        helper.make_node("Round", ["r"], ["y"], name="third_bad"),
        helper.make_node("Det", ["m"], ["d"], name="second_bad"),
        helper.make_node("Shape", ["d"], ["ds"], name="shape_of_bad"),
        helper.make_node("ConstantOfShape", ["ds"], ["z"], name="folded_on_bad"),
    ]
    with pytest.raises(UnsupportedModelError) as e:
        import_onnx(make(nodes, [vi("x", [2, 3]), vi("m", [2, 2])], [vi("y", [2, 3]), vi("z", [0])]))
    assert [p.node for p in e.value.problems] == [
        "Hardmax node 'first_bad'", "Round node 'third_bad'", "Det node 'second_bad'"]
    text = str(e.value)
    assert "3 unsupported nodes" in text and all(n in text for n in ("first_bad", "second_bad", "third_bad"))
    assert "fine_after_bad" not in text and "folded_on_bad" not in text
    assert text.count("Gemm") == 1  # the supported list is said once


def test_dynamic_dimension_is_refused() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(UnsupportedModelError, match="dynamic dimension 'batch'"):
        import_onnx(make(nodes, [vi("x", ["batch", 3])], [vi("y", ["batch", 3])]))


def test_one_element_initializer_is_a_scalar_immediate() -> None:
    # a 0-d float initializer read by Mul: a CONST of a scalar op, like a Constant node's value
    c = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "c")
    model = import_onnx(make([helper.make_node("Mul", ["x", "c"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])], [c]))
    assert [(op.op, op.attrs["op"], op.attrs["value"]) for op in model.ops] == [("scalar", "mul", 0.5)]


def test_unsupported_dtype_and_attribute() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(UnsupportedModelError, match="DOUBLE"):
        import_onnx(make(nodes, [vi("x", [2], TensorProto.DOUBLE)], [vi("y", [2], TensorProto.DOUBLE)]))
    s = numpy_helper.from_array(np.ones(3, dtype=np.float32), "s")
    b = numpy_helper.from_array(np.zeros(3, dtype=np.float32), "b")
    ln = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], stash_type=0, name="ln0")]
    with pytest.raises(UnsupportedModelError, match="ln0.*stash_type"):
        import_onnx(make(ln, [vi("x", [2, 3])], [vi("y", [2, 3])], [s, b]))


def test_mismatched_shapes_are_refused() -> None:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    with pytest.raises(UnsupportedModelError, match="mm.*inner dimensions"):
        import_onnx(make(nodes, [vi("x", [2, 5])], [vi("y", [2, 4])], [W]))
    nodes = [helper.make_node("Add", ["x", "z"], ["y"], name="add")]
    with pytest.raises(UnsupportedModelError, match="do not broadcast"):
        import_onnx(make(nodes, [vi("x", [2, 5]), vi("z", [3])], [vi("y", [2, 5])]))


def test_malformed_and_out_of_range_models() -> None:
    with pytest.raises(UnsupportedModelError, match="not a valid ONNX model"):
        import_onnx(b"\x08\x07garbage-not-a-protobuf")
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(UnsupportedModelError, match="opset 11"):
        import_onnx(make(nodes, [vi("x", [2])], [vi("y", [2])], opset=11))
    bad = [helper.make_node("Relu", ["nothere"], ["y"])]
    with pytest.raises(UnsupportedModelError):
        import_onnx(make(bad, [vi("x", [2])], [vi("y", [2])]))


def test_gather_on_any_axis_and_integers_only_as_indices() -> None:
    emb = numpy_helper.from_array(np.ones((5, 2), dtype=np.float32), "E")
    ok = [helper.make_node("Gather", ["E", "t"], ["y"])]
    model = import_onnx(make(ok, [vi("t", [3], TensorProto.INT64)], [vi("y", [3, 2])], [emb]))
    assert model.ops[0].op == "gather" and model.integer_inputs["t"]
    axis1 = [helper.make_node("Gather", ["x", "t"], ["y"], axis=1, name="g1")]
    model = import_onnx(make(axis1, [vi("x", [3, 5]), vi("t", [2], TensorProto.INT64)], [vi("y", [3, 2])]))
    assert model.ops[0].op == "gather" and model.ops[0].attrs["axis"] == 1 and model.shape("y") == (3, 2)
    floats = [helper.make_node("Gather", ["x", "u"], ["y"], name="gf")]
    with pytest.raises(UnsupportedModelError, match="gf.*float indices"):
        import_onnx(make(floats, [vi("x", [3, 5]), vi("u", [2])], [vi("y", [2, 5])]))
    relu_int = [helper.make_node("Relu", ["t"], ["y"], name="r")]
    with pytest.raises(UnsupportedModelError, match="r.*int tensor 't' used as float data"):
        import_onnx(make(relu_int, [vi("t", [3], TensorProto.INT64)], [vi("y", [3], TensorProto.INT64)]))


def test_erf_gelu_pattern_is_fused_only_when_safe() -> None:
    m = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    fused, _ = import_torch(m, torch.zeros(2, 3), ["x"])
    plain, _ = import_torch(m, torch.zeros(2, 3), ["x"], fuse=False)
    assert [op.attrs.get("fn") for op in fused.ops if op.op == "unary"] == ["gelu_erf"]
    assert len(plain.ops) == len(fused.ops) + 4 and any(op.attrs.get("fn") == "erf" for op in plain.ops)
    assert all(op.output in fused.values for op in fused.ops)

    class Leaky(nn.Module):  # the erf output is used twice: no fusion
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e = torch.erf(x / 1.4142135623730951)
            return x * (e + 1.0) * 0.5 + e

    model, _ = import_torch(Leaky(), torch.zeros(2, 3), ["x"])
    assert any(op.attrs.get("fn") == "erf" for op in model.ops)
    assert not any(op.attrs.get("fn") == "gelu_erf" for op in model.ops)


class TanhGelu(nn.Module):
    """The formula of transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``), written as it
    writes it, with knobs that break the pattern."""

    def __init__(self, cubic: float = 0.044715, scale: float = math.sqrt(2.0 / math.pi), half: float = 0.5,
                 power: float = 3.0, leak: bool = False, other: bool = False) -> None:
        super().__init__()
        self.cubic, self.scale, self.half, self.power, self.leak, self.other = cubic, scale, half, power, leak, other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = x.flip(-1) if self.other else x  # x^3 of another tensor than the GELU's input
        t = torch.tanh(self.scale * (x + self.cubic * torch.pow(base, self.power)))
        out = self.half * x * (1.0 + t)
        return out + t if self.leak else out


def _export(module: nn.Module, x: torch.Tensor, dynamo: bool, opset: int) -> bytes:
    if not dynamo:
        return export_torch(module, x, ["x"], opset)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, (x,), dynamo=True, optimize=False, opset_version=opset, verbose=False,
                                 input_names=["x"], output_names=["output"])
    assert prog is not None
    return prog.model_proto.SerializeToString()


def _forward(model: Model, x: np.ndarray) -> np.ndarray:
    g = build_inference_graph(model, steps=1)
    init = {v.name: v.data for v in model.params() + model.consts()}
    init["outputs:output"] = np.zeros((1, model.values[model.outputs[0]].numel), dtype=np.float32)
    ex = StepExecutor(g)
    res = ex.run_step(ex.initial_state(init), g.pack_batch({"x": x, OUTPUT_ROW_FIELD: np.zeros(1)}))
    return res.output(g, "output")


def _fns(model: Model) -> list[str]:
    return [op.attrs["fn"] for op in model.ops if op.op == "unary"]


@pytest.mark.parametrize("act", ["nn.GELU(tanh)", "NewGELU"])
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 17), (True, 18), (False, 20), (True, 20)],
                         ids=["torchscript-17", "dynamo-18", "torchscript-20", "dynamo-20"])
def test_tanh_gelu_is_one_op_in_every_form_torch_exports(act: str, dynamo: bool, opset: int) -> None:
    """Three groupings below opset 20 (``(x*A)*0.5``, ``x*(0.5*A)``, ``(0.5*x)*A``) and x^3 as Pow
    or two Muls all become ``gelu_tanh``; at opset 20 nn.GELU exports a Gelu op, NewGELU still
    decomposes. Outputs stay within ONNX's tolerances of the decomposition's."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.GELU("tanh") if act == "nn.GELU(tanh)" else TanhGelu())
    x = (np.random.default_rng(1).standard_normal((6, 5)) * 3).astype(np.float32)
    data = _export(m, torch.tensor(x), dynamo, opset)
    fused, plain = import_onnx(data), import_onnx(data, fuse=False)
    assert _fns(fused) == ["gelu_tanh"] and [op.op for op in fused.ops] == ["gemm", "unary"]
    assert all(op.output in fused.values for op in fused.ops) and len(fused.values) == len(fused.ops) + 3
    if "tanh" in _fns(plain):  # a decomposition was exported: 8 or 9 ops became one
        assert len(plain.ops) - len(fused.ops) in (7, 8)
    else:
        assert act == "nn.GELU(tanh)" and opset == 20
    got, want = _forward(fused, x), _forward(plain, x)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(got, m(torch.tensor(x)).detach().numpy(), rtol=1e-3, atol=1e-7)


def test_tanh_gelu_fused_gradients_match_the_decomposition() -> None:
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(5, 7), TanhGelu(), nn.Linear(7, 3))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 5)) * 3).astype(np.float32)
    y = rng.standard_normal((6, 3)).astype(np.float32)
    fused, plain = build(m, torch.tensor(x), "mse"), build(m, torch.tensor(x), "mse", fuse=False)
    assert "gelu_tanh" in _fns(fused.model) and "tanh" in _fns(plain.model)
    rf, rp = one_step(fused, x, y), one_step(plain, x, y)
    assert len(fused.graph.nodes) < len(plain.graph.nodes) - 10  # forward and backward both shrank
    np.testing.assert_allclose(rf.output(fused.graph, "loss"), rp.output(plain.graph, "loss"), rtol=1e-5)
    for name in ("0.weight", "0.bias", "2.weight"):
        np.testing.assert_allclose(grad_of(fused, rf, m, name), grad_of(plain, rp, m, name), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("variant", [
    {"leak": True}, {"other": True}, {"cubic": 0.045}, {"scale": 0.8}, {"half": 0.25}, {"power": 2.0},
], ids=lambda v: next(iter(v)))
def test_tanh_gelu_is_left_alone_when_shared_or_with_other_constants(variant: dict[str, Any]) -> None:
    m = TanhGelu(**variant)
    model, _ = import_torch(m, torch.zeros(2, 3), ["x"])
    assert "gelu_tanh" not in _fns(model) and "tanh" in _fns(model)


def test_every_ir_op_has_its_rules_and_every_onnx_op_its_importer() -> None:
    """The operator tables are filled by registration (graph/operators): a family module that is
    not imported, or an op added to ir.OPS without its rules, shows up here."""
    from verde_chain.graph import ir
    from verde_chain.graph.onnx_import import supported_ops
    from verde_chain.graph.operators import LOWERINGS, VJPS

    assert set(LOWERINGS) == set(ir.OPS)
    assert set(VJPS) == set(ir.OPS)
    assert supported_ops() == sorted(
        ["Add", "And", "Cast", "CastLike", "Concat", "Constant", "Cos", "Div", "Equal", "Erf", "Exp", "Expand",
         "Flatten", "Gather", "GatherElements", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "Identity", "IsNaN",
         "LayerNormalization", "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul", "Max", "Min", "Mul", "Neg",
         "Not", "Or", "Pow", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceSum", "Relu", "Reshape", "SequenceAt",
         "Sigmoid", "Sin", "Slice", "Softmax", "Split", "SplitToSequence", "Sqrt", "Squeeze", "Sub", "Tanh",
         "Transpose", "Trilu", "Unsqueeze", "Where", "Xor",
         "AveragePool", "BatchNormalization", "Clip", "Conv", "Dropout", "GlobalAveragePool", "HardSigmoid",
         "HardSwish", "MaxPool", "Pad", "Softplus"]
    )  # fmt: skip

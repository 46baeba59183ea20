"""ONNX import: supported graphs become the IR; anything else fails with a named, clear error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from verde_chain.errors import VerdeError
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.onnx_import import import_onnx, import_torch


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

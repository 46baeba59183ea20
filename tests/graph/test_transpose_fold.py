"""graph/fusion.py's ``fold_transposes``: a last-two-axes transpose read by one matmul/gemm
operand becomes that operand's trans flag. The rewrite must change no value: a few AdamW steps
with and without it end on bit-identical losses, parameters and optimizer state (for the
language models of examples/lm.py and for small hand-made graphs), and the transposes it may
not fold (another consumer, another perm, a batched transposed A times a 2-D B) stay."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from verde_chain.examples.lm import ARCHS, LMConfig, export_hf, frozen_names, hf_model, lm_dataset, lm_loss
from verde_chain.graph.backend import make_runner
from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.fusion import fold_transposes
from verde_chain.graph.ir import Model
from verde_chain.graph.onnx_import import import_onnx
from verde_chain.graph.training import LossSpec, OptimizerSpec, build_training_graph

ADAMW = OptimizerSpec("adamw", lr=1e-2, weight_decay=0.01)


def _train(model: Model, loss: LossSpec, batches: list[tuple[dict[str, np.ndarray], np.ndarray]]
           ) -> tuple[list[bytes], dict[str, bytes]]:
    """Loss bits of every step and the final state's bits by slot name (params, Adam m and v)."""
    prog = build_training_graph(model, loss, ADAMW)
    ex = StepExecutor(prog.graph, make_runner("cpu"))
    st = ex.initial_state(prog.initial_state())
    losses = []
    for s, (inputs, target) in enumerate(batches, 1):
        res = ex.run_plain(st, prog.batch(s, inputs, target))
        losses.append(res.outputs[prog.graph.named["loss"]].tobytes())
        st = res.state
    return losses, {slot.name: st.tensors[slot.producer].tobytes() for slot in prog.graph.states}


def _folded(plain: Model) -> tuple[Model, int]:
    model = copy.deepcopy(plain)
    return model, fold_transposes(model)


def _ops(model: Model, op: str) -> list[dict]:  # type: ignore[type-arg]
    return [o.attrs for o in model.ops if o.op == op]


@pytest.mark.parametrize("arch", ARCHS)
def test_language_models_train_bit_identically_with_transposes_folded(arch: str) -> None:
    cfg = LMConfig(arch)
    hf = hf_model(cfg, seed=2)
    plain = import_onnx(export_hf(hf, cfg.batch, cfg.seq), frozen_names(hf), fuse=False)
    folded, n = _folded(plain)
    assert n > 0 and len(folded.ops) == len(plain.ops) - n
    assert any(a["trans_b"] for a in _ops(folded, "matmul"))
    data = lm_dataset(cfg)
    batches = [({"input_ids": data.X[s * cfg.batch:(s + 1) * cfg.batch]}, data.Y[s * cfg.batch:(s + 1) * cfg.batch])
               for s in range(3)]
    losses, state = _train(plain, lm_loss(cfg), batches)
    losses_f, state_f = _train(folded, lm_loss(cfg), batches)
    assert losses_f == losses and state_f == state
    assert len(set(losses)) == 3  # the steps really trained: the parameters moved


def _model(nodes: list, x_shape: list[int], y_shape: list[int], params: dict[str, np.ndarray],  # type: ignore[type-arg]
           ints: dict[str, list[int]] | None = None) -> Model:
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    inits += [numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in (ints or {}).items()]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return import_onnx(proto.SerializeToString(), fuse=False)


def _w(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


N = helper.make_node


def test_every_operand_position_is_folded_bit_identically() -> None:
    # transposed B and A of matmuls, a transposed B of a Gemm whose A is already transposed,
    # and a 3-D K^T read through a batch-regrouping reshape and a scale (attention's scores)
    nodes = [
        N("Transpose", ["W1"], ["W1t"], perm=[1, 0]), N("MatMul", ["x", "W1t"], ["h1"]),  # (6,5) x (5,8)
        N("Transpose", ["h1"], ["h1t"], perm=[1, 0]), N("MatMul", ["h1t", "W2"], ["h2"]),  # (8,6) x (6,4)
        N("Transpose", ["W3"], ["W3t"], perm=[1, 0]), N("Gemm", ["h2", "W3t", "b3"], ["h3"], transA=1),  # (4,8) x (8,6)
        N("Reshape", ["h3", "s4"], ["q"]),  # (1, 2, 2, 6)
        N("Reshape", ["q", "s3"], ["k"]),  # (2, 2, 6)
        N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),  # (2, 6, 2)
        N("Reshape", ["kt", "s4t"], ["ktv"]),  # (1, 2, 6, 2)
        N("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, dtype=np.float32))),
        N("Mul", ["ktv", "half"], ["kts"]),
        N("MatMul", ["q", "kts"], ["y"]),  # (1, 2, 2, 2)
    ]
    plain = _model(nodes, [6, 5], [1, 2, 2, 2], {"W1": _w(8, 5), "W2": _w(6, 4), "W3": _w(6, 8), "b3": _w(6)},
                   {"s4": [1, 2, 2, 6], "s3": [2, 2, 6], "s4t": [1, 2, 6, 2]})
    assert len(_ops(plain, "transpose")) == 4
    folded, n = _folded(plain)
    assert n == 4 and _ops(folded, "transpose") == []
    assert [(a["trans_a"], a["trans_b"]) for a in _ops(folded, "matmul")] == [(False, True), (True, False), (False, True)]
    assert [(a["trans_a"], a["trans_b"]) for a in _ops(folded, "gemm")] == [(True, True)]
    rng = np.random.default_rng(3)
    batches = [({"x": rng.standard_normal((6, 5)).astype(np.float32)}, rng.standard_normal((1, 2, 2, 2)).astype(np.float32))
               for _ in range(3)]
    losses, state = _train(plain, LossSpec("mse"), batches)
    assert _train(folded, LossSpec("mse"), batches) == (losses, state) and len(set(losses)) == 3


@pytest.mark.parametrize("case", ["second consumer", "other perm", "batched A times 2-D B", "use in between"])
def test_transposes_that_would_change_a_value_or_have_no_strided_read_stay(case: str) -> None:
    x, y, nodes = {
        # the transposed tensor is also added to the product
        "second consumer": ([5, 5], [5, 5], [N("Transpose", ["W"], ["Wt"], perm=[1, 0]), N("MatMul", ["x", "Wt"], ["p"]),
                                             N("Add", ["p", "Wt"], ["y"])]),
        # a 3-D perm that is not a swap of the last two axes
        "other perm": ([2, 3, 5], [2, 3, 4], [N("Transpose", ["V"], ["Vt"], perm=[2, 1, 0]), N("MatMul", ["x", "Vt"], ["y"])]),
        # its weight gradient folds the batch into A's rows: no strided view of a transposed A
        "batched A times 2-D B": ([2, 5, 3], [2, 3, 5], [N("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
                                                         N("MatMul", ["xt", "W"], ["y"])]),
        # W's gradient contributions would be summed in another order
        "use in between": ([5, 5], [5, 5], [N("Transpose", ["W"], ["Wt"], perm=[1, 0]), N("Mul", ["W", "W"], ["w2"]),
                                            N("MatMul", ["x", "Wt"], ["p"]), N("Add", ["p", "w2"], ["y"])]),
    }[case]
    plain = _model(nodes, x, y, {"W": _w(5, 5), "V": _w(4, 5, 2)})
    folded, n = _folded(plain)
    assert n == 0 and [(o.op, o.inputs, o.attrs) for o in folded.ops] == [(o.op, o.inputs, o.attrs) for o in plain.ops]

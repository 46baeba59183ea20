"""Hugging Face language models (examples/lm.py) as RepOps jobs: the first training step's loss
equals torch's (and the second, after one AdamW step), inference logits equal onnxruntime's, the
commitments are the same bits on every CPU ISA and thread count, and what depends only on
constants and shapes is folded away at import."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from verde_chain.examples.lm import ARCHS, LMConfig, hf_model, lm_job
from verde_chain.graph.backend import make_runner
from verde_chain.graph.data import batch_indices
from verde_chain.graph.errors import IntegerRangeError
from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.onnx_import import import_onnx
from verde_chain.job import Job
from verde_chain.repops import library, reference
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend

LR = 1e-3


def _job(arch: str, kind: str = "train", hidden: int = 64, steps: int = 2) -> tuple[Job, Any]:
    cfg = LMConfig(arch, hidden=hidden)
    model = hf_model(cfg, seed=1)
    return lm_job(cfg, kind, steps=steps, lr=LR, model=model), model


@pytest.fixture(scope="module", params=ARCHS)
def trained(request: pytest.FixtureRequest) -> tuple[Job, Any]:
    return _job(request.param)


def _torch_batch(job: Job, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = batch_indices(job.spec.seed, step, job.spec.batch_size, len(job.dataset))
    return (torch.tensor(job.dataset.X[idx].astype(np.int64)), torch.tensor(job.dataset.Y[idx].astype(np.int64)))


def _losses(job: Job, steps: int) -> list[float]:
    ex = StepExecutor(job.program.graph, make_runner("cpu"))
    st = ex.initial_state(job.init_state)
    out = []
    for s in range(1, steps + 1):
        res = ex.run_plain(st, job.batch(s))
        out.append(float(res.outputs[job.program.graph.named["loss"]].reshape(())))
        st = res.state
    return out


def _torch_losses(job: Job, model: Any, steps: int) -> list[float]:
    """transformers' own loss (shifted next-token CE for causal LMs, class CE for BERT) under
    torch.optim.AdamW with the job's hyper-parameters."""
    o = job.spec.optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    model.train()
    out = []
    for s in range(1, steps + 1):
        x, y = _torch_batch(job, s)
        loss = model(input_ids=x, labels=x if job.spec.loss.ignore_index is not None else y).loss
        out.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out


def test_first_step_loss_equals_torch_and_adamw_trains_alike(trained: tuple[Job, Any]) -> None:
    job, model = trained
    ours, theirs = _losses(job, 2), _torch_losses(job, model, 2)
    assert abs(ours[0] - theirs[0]) <= 1e-5 * abs(theirs[0]), (ours, theirs)
    # after one AdamW step on every parameter (gradients summed in another order than torch's)
    assert abs(ours[1] - theirs[1]) <= 1e-4 * abs(theirs[1]), (ours, theirs)
    assert ours[1] != ours[0]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_256_first_step_loss_equals_torch(arch: str) -> None:
    job, model = _job(arch, hidden=256, steps=1)
    ours, theirs = _losses(job, 1), _torch_losses(job, model, 1)
    assert abs(ours[0] - theirs[0]) <= 1e-5 * abs(theirs[0]), (ours, theirs)


@pytest.mark.parametrize("arch", ARCHS)
def test_inference_logits_equal_onnxruntime(arch: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    job, _ = _job(arch, "inference", steps=1)
    ex = StepExecutor(job.program.graph, make_runner("cpu"))
    res = ex.run_plain(ex.initial_state(job.init_state), job.batch(1))
    ours = res.outputs[job.program.graph.named["output"]].reshape(job.program.graph.shapes["output"])
    ids = job.dataset.X[: job.spec.batch_size].astype(np.int64)  # inference batch 1: samples 0..B-1
    sess = ort.InferenceSession(job.onnx_bytes, providers=["CPUExecutionProvider"])
    (theirs,) = sess.run(None, {"input_ids": ids})
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= 1e-5, np.abs(ours - theirs).max()


def test_gpt2_tanh_gelu_is_one_op_per_layer() -> None:
    """GPT-2's ``gelu_new`` as the dynamo exporter writes it (8 ops) is one ``gelu_tanh`` per layer."""
    job, _ = _job("gpt2", "inference", steps=1)
    fused, plain = job.program.model, import_onnx(job.onnx_bytes, fuse=False)
    layers = LMConfig("gpt2").layers
    fns = [op.attrs["fn"] for op in fused.ops if op.op == "unary"]
    assert fns.count("gelu_tanh") == layers and "tanh" not in fns
    assert [op.attrs["fn"] for op in plain.ops if op.op == "unary"].count("tanh") == layers
    # the other rewrites remove whole ops too: only transposes fold in this model
    folded = sum(op.op == "transpose" for op in plain.ops) - sum(op.op == "transpose" for op in fused.ops)
    assert folded > 0 and len(plain.ops) - len(fused.ops) == 7 * layers + folded


def _commitments(job: Job, runner: Any, steps: int) -> list[bytes]:
    ex = StepExecutor(job.program.graph, runner)
    st = ex.initial_state(job.init_state)
    out = []
    for s in range(1, steps + 1):
        res = ex.run_step(st, job.batch(s))
        out.append(res.commitment)
        st = res.state
    return out


@pytest.mark.parametrize("arch", ["llama", pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("bert", marks=pytest.mark.slow)])
def test_commitments_identical_across_isas_and_thread_counts(arch: str) -> None:
    job, _ = _job(arch, steps=2)
    base = _commitments(job, make_runner("reference"), 2)
    runs = [(isa, threads) for isa in cpu_ext.available_isas() for threads in (1, 2)]
    for isa, threads in runs:  # a CpuBackend's own count is its threads, whatever torch's is
        assert _commitments(job, CpuBackend(isa=isa, threads=threads), 2) == base, (isa, threads)
    assert len(set(base)) == 2  # the two steps differ: the state really changed


def test_integer_inputs_outside_binary32_are_refused(trained: tuple[Job, Any]) -> None:
    job, _ = trained
    prog = job.program
    x = job.dataset.X[: job.spec.batch_size].copy()
    y = job.dataset.Y[: job.spec.batch_size]
    for bad in (-1.0, 2.0**24, 0.5, np.nan):
        x[0, 0] = bad
        with pytest.raises(IntegerRangeError, match="token ids must be integers"):
            prog.batch(1, {"input_ids": x}, y)


def test_constants_and_shapes_are_folded_before_the_graph() -> None:
    """A hand-written mask-building graph: Shape, Range, ConstantOfShape, Trilu, Equal, Where,
    Cos (folded by its RepOps program), Concat and Expand on constants never become IR ops."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4])
    freq = numpy_helper.from_array(np.array([0.5, 1.5, 2.5, 3.5], np.float32), "freq")
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),  # [4]
        helper.make_node("ConstantOfShape", ["shp2"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Concat", ["shp", "shp"], ["shp2"], axis=0),  # [4, 4]
        helper.make_node("Trilu", ["ones"], ["tri"], upper=0),
        helper.make_node("Equal", ["tri", "zero"], ["masked"]),
        helper.make_node("Where", ["masked", "neg", "zero"], ["bias"]),
        helper.make_node("Cos", ["freq"], ["cosf"]),
        helper.make_node("Add", ["bias", "cosf"], ["table"]),
        helper.make_node("Add", ["x", "table"], ["y"]),
    ]
    nodes.insert(1, nodes.pop(2))  # Concat before ConstantOfShape (topological order)
    nodes[:0] = [helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
                 helper.make_node("Constant", [], ["neg"], value=numpy_helper.from_array(np.array(-1e9, np.float32)))]
    g = helper.make_graph(nodes, "mask", [x], [y], [freq])
    model = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), frozen={"freq"})
    assert [op.op for op in model.ops] == ["binary"]  # only the data-path Add is left
    (table,) = model.consts()
    cos = reference.run(library.map_unary("cos", (4,)), [np.array([0.5, 1.5, 2.5, 3.5], np.float32)])
    want = np.where(np.tril(np.ones((4, 4))) == 0, np.float32(-1e9), np.float32(0)).astype(np.float32) + cos
    assert np.array_equal(table.data.view(np.uint32), want.astype(np.float32).view(np.uint32))
    onnx.checker.check_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))

"""``graph/fusion.py``'s batch-norm rewrite: batch norm + residual Add + Relu / Clip become one
op whose training graph has fewer nodes and the same values, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.ir import Model
from verde_chain.graph.onnx_import import export_torch, import_onnx
from verde_chain.graph.training import LossSpec, OptimizerSpec, TrainingProgram, build_training_graph
from verde_chain.repops import library, reference
from verde_chain.repops.backends.registry import make_runner


class _ResNetish(nn.Module):
    """Every pattern the rewrite takes: conv-bn-relu, bn + identity (bn on the left) then relu,
    identity + bn (bn on the right) then ReLU6, and bn + identity with no activation."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b0 = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c1, self.b1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c3, self.b3 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.b0(self.stem(x)))
        h = torch.relu(self.b1(self.c1(h)) + h)
        h = nn.functional.relu6(h + self.b2(self.c2(h)))
        h = self.b3(self.c3(h)) + h
        return self.fc(torch.flatten(h, 1))


class _Shared(nn.Module):
    """A batch norm whose output is also read by another op, and a Relu after a Conv: neither is
    fused (the normalised value must stay a node output; there is no batch norm to fold into)."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.b, self.c2 = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.c(x))
        h = torch.relu(y) + y * 0.5
        return self.fc(torch.flatten(torch.relu(self.c2(h)), 1))


def _model(cls: type[nn.Module], fuse: bool) -> Model:
    torch.manual_seed(0)
    return import_onnx(export_torch(cls(), torch.zeros(4, 2, 5, 5), ["x"], training=True), fuse=fuse)


def _program(model: Model) -> TrainingProgram:
    return build_training_graph(model, LossSpec("cross_entropy"), OptimizerSpec("sgd", lr=0.1, momentum=0.9))


def _train(prog: TrainingProgram, steps: int, backend: str) -> tuple[list[int], dict[str, bytes]]:
    """Loss bits per step and the final state's bits by name."""
    r = np.random.default_rng(1)
    ex = StepExecutor(prog.graph, make_runner(backend))
    st = ex.initial_state(prog.initial_state())
    losses = []
    for s in range(1, steps + 1):
        x = r.standard_normal((4, 2, 5, 5)).astype(np.float32)
        res = ex.run_step(st, prog.batch(s, {"x": x}, r.integers(0, 3, 4).astype(np.float32)))
        losses.append(int(res.output(prog.graph, "loss").view(np.uint32).reshape(())))
        st = res.state
    return losses, {sl.name: st.tensors[sl.producer].tobytes() for sl in prog.graph.states}


@pytest.mark.parametrize("runner", ["cpu", "reference"])
def test_fused_batch_norm_trains_to_the_same_bits(runner: str) -> None:
    fused, plain = _model(_ResNetish, True), _model(_ResNetish, False)
    tails = [(op.attrs.get("residual"), op.attrs.get("act")) for op in fused.ops if op.op == "batch_norm"]
    assert tails == [(None, "relu"), (0, "relu"), (1, "clip"), (0, None)]
    assert not any(op.op in ("clip", "binary") or op.attrs.get("fn") == "relu" for op in fused.ops)
    pf, pp = _program(fused), _program(plain)
    assert len(pf.graph.nodes) < len(pp.graph.nodes)
    lf, sf = _train(pf, 3, runner)
    lp, sp = _train(pp, 3, runner)
    assert lf == lp
    assert sf.keys() == sp.keys() and len(sf) > 10
    assert [k for k in sf if sf[k] != sp[k]] == []


def test_batch_norm_with_another_reader_is_left_alone() -> None:
    fused, plain = _model(_Shared, True), _model(_Shared, False)
    assert [(op.op, op.attrs.get("act")) for op in fused.ops] == [(op.op, None) for op in plain.ops]


@pytest.mark.parametrize("lo, hi", [(0.0, None), (0.0, 6.0), (None, 1.5), (-1.0, -2.0)])
def test_activation_gradient_from_the_output_equals_from_the_input(lo: float | None, hi: float | None) -> None:
    """The fused op's backward reads relu(y) / clip(y) where the unfused one read y: the same
    bits on the edges (signed zeros, the bounds, infinities, NaN, subnormals)."""
    y = np.array([-0.0, 0.0, 1e-45, -1e-45, 1.5, 6.0, 5.999999, -1.0, -2.0, np.inf, -np.inf, np.nan, 3.0, -7.0],
                 np.float32)
    g = np.linspace(-3, 3, y.size).astype(np.float32)
    if lo == 0.0 and hi is None:
        out = reference.run(library.map_unary("relu", y.shape), [y])
        grad = library.unary_grad("relu_grad", y.shape)
    else:
        out = reference.run(library.clip(y.shape, lo, hi), [y])
        grad = library.clip_grad(y.shape, lo, hi)
    want = reference.run(grad, [y, g]).view(np.uint32)
    assert (reference.run(grad, [out, g]).view(np.uint32) == want).all()
    assert (want == 0).any() and (want != 0).any() == (lo is None or hi is None or lo < hi)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("side, act", [(None, "relu"), (0, "relu"), (1, "clip"), (1, None)])
def test_batch_norm_tail_equals_the_separate_maps(training: bool, side: int | None, act: str | None) -> None:
    """Both composites (training and from running statistics) with a tail give the bits of the
    untailed composite's y, then the Add (on the given side) and the activation as their own nodes."""
    r = np.random.default_rng(3)
    shape = (3, 4, 2, 5)
    x, res = (r.standard_normal(shape).astype(np.float32) * 4 for _ in range(2))
    x.flat[::7] = [np.nan, -0.0, np.inf, 1e-45, 0.0, -np.inf][: len(x.flat[::7])] * 3
    sc, b, m = (r.standard_normal(4).astype(np.float32) for _ in range(3))
    v = r.random(4).astype(np.float32) + 0.5
    code = () if act is None else library.unary_code("relu") if act == "relu" else library.clip_code(0.0, 6.0)
    tail = library.BnTail(side, code, act or "")
    make = library.batch_norm_training if training else library.batch_norm_inference
    got = make(shape, tail=tail).run([x, sc, b, m, v, *([res] if side is not None else [])])
    plain = make(shape).run([x, sc, b, m, v])
    want = plain[0]
    if side is not None:
        want = reference.run(library.binary("add", shape, shape), [want, res] if side == 0 else [res, want])
    if act is not None:
        want = reference.run(library.map_unary("relu", shape) if act == "relu" else library.clip(shape, 0.0, 6.0), [want])
    assert got[0].view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    assert all(a.tobytes() == p.tobytes() for a, p in zip(got[1:], plain[1:]))
    assert np.isnan(want).any() and (want.view(np.uint32) != plain[0].view(np.uint32)).any()  # the tail did something

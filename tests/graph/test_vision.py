"""Vision operators through the whole graph layer (ONNX import in training mode, lowering,
autodiff, state updates, dropout masks) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.graph import close, torch_grads
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.executor import StepExecutor, TrainingRun
from verde_chain.graph.onnx_import import export_torch, import_onnx
from verde_chain.graph.training import LossSpec, OptimizerSpec, TrainingProgram, build_training_graph
from verde_chain.repops import rng


def _program(module: nn.Module, x: torch.Tensor, opt: OptimizerSpec | None = None, fuse: bool = True,
             peephole: bool = True) -> TrainingProgram:
    """``peephole=False`` keeps every weight gradient a tensor of the step, to compare with
    torch's (the peephole runs a convolution's in its update: tests/graph/test_peephole.py)."""
    model = import_onnx(export_torch(module, x, ["x"], training=True), fuse=fuse)
    return build_training_graph(model, LossSpec("cross_entropy"), opt or OptimizerSpec("sgd", lr=0.1), peephole=peephole)


def _grads_by_state(prog: TrainingProgram, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    ex = StepExecutor(prog.graph)
    res = ex.run_step(ex.initial_state(prog.initial_state()), prog.batch(1, {"x": x}, y))
    grads = {k[5:]: res.output(prog.graph, k) for k in prog.graph.named if k.startswith("grad:")}
    return float(res.output(prog.graph, "loss")), grads


class _Net(nn.Module):
    """Every vision op with a gradient: grouped / strided / dilated conv, batch norm, both
    pools (ceil mode, padding), ReLU6, hard swish / sigmoid, softplus, concat, pad."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=1, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(8, 4, 3, stride=2, padding=(1, 2), dilation=(1, 2), groups=2)
        self.c3 = nn.Conv2d(4, 3, 1, bias=False)
        self.fc = nn.Linear(27, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.relu6(self.bn(self.c1(x)))
        a = nn.functional.max_pool2d(h, 3, 2, 1, ceil_mode=True)
        b = nn.functional.avg_pool2d(nn.functional.hardswish(h), 2, 2, ceil_mode=True, count_include_pad=False)
        h = torch.cat([a, b], 1)
        h = nn.functional.softplus(self.c2(h)) + nn.functional.hardsigmoid(self.c2(h))
        h = nn.functional.pad(self.c3(h), (1, 0, 0, 1))
        return self.fc(torch.flatten(h, 1))


@pytest.mark.parametrize("fuse", [True, False], ids=["bn-relu6-fused", "unfused"])
def test_vision_ops_gradients_match_torch(fuse: bool) -> None:
    torch.manual_seed(0)
    m = _Net()
    x = np.random.default_rng(0).standard_normal((4, 2, 7, 7)).astype(np.float32)
    y = np.array([0, 3, 1, 4], np.float32)
    prog = _program(m, torch.tensor(x), fuse=fuse, peephole=False)
    ops = {op.op for op in prog.model.ops}
    assert {"conv", "batch_norm", "max_pool", "avg_pool", "activation", "concat", "pad"} <= ops
    # ReLU6 after the batch norm: a ``clip`` op, or folded into the batch norm (graph/fusion.py)
    assert ("clip" in ops) != fuse
    assert [op.attrs.get("act") for op in prog.model.ops if op.op == "batch_norm"] == ["clip" if fuse else None]
    loss, grads = _grads_by_state(prog, x, y)
    m.train()
    tl, tg = torch_grads(m, x, y, "cross_entropy")
    assert abs(loss - tl) <= 1e-5 * tl
    assert set(grads) == set(tg)
    for name, g in tg.items():
        assert close(grads[name], g, rel=1e-4), name


def test_batch_norm_running_statistics_are_carried_and_updated() -> None:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3, momentum=0.2), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    X = np.random.default_rng(2).standard_normal((3, 4, 1, 6, 6)).astype(np.float32)
    Y = np.random.default_rng(3).integers(0, 2, (3, 4)).astype(np.float32)
    prog = _program(m, torch.tensor(X[0]))
    roles = {v.name: v.role for v in prog.model.values.values()}
    assert roles["1.running_mean"] == roles["1.running_var"] == "const"
    run = TrainingRun(prog.graph, prog.initial_state(), lambda s: prog.batch(s, {"x": X[s - 1]}, Y[s - 1]), 3)
    run.run()
    state = {sl.name: run.state.tensors[sl.producer] for sl in prog.graph.states}
    producers = {sl.name: prog.graph.nodes[sl.producer].label for sl in prog.graph.states}
    assert "bn_running" in producers["1.running_mean"] and "carry" not in producers["1.running_var"]
    # torch with the same steps: the mean follows torch's; the variance is ONNX's (population)
    mean, var = np.zeros(3, np.float32), np.ones(3, np.float32)
    t = m
    opt = torch.optim.SGD(t.parameters(), lr=0.1)
    for s in range(3):
        t.train()
        h = t[0](torch.tensor(X[s])).detach().numpy()
        bm, bv = h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))
        mean = mean * np.float32(0.8) + bm * np.float32(0.2)
        var = var * np.float32(0.8) + bv * np.float32(0.2)
        opt.zero_grad()
        nn.functional.cross_entropy(t(torch.tensor(X[s])), torch.tensor(Y[s]).long()).backward()
        opt.step()
    np.testing.assert_allclose(state["1.running_mean"], t[1].running_mean.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["1.running_mean"], mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["1.running_var"], var, rtol=1e-4, atol=1e-6)


def test_dropout_mask_comes_from_the_seeded_batch() -> None:
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))
    x = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    y = np.array([0, 1, 2, 1, 0], np.float32)
    prog = _program(m, torch.tensor(x))
    ((mask_value, ratio),) = prog.model.masks()
    assert ratio == pytest.approx(0.25) and mask_value.role == "mask"
    b1, b1_again, b2 = prog.batch(1, {"x": x}, y, seed=9), prog.batch(1, {"x": x}, y, seed=9), prog.batch(2, {"x": x}, y, 9)
    assert (b1 == b1_again).all() and not (b1 == b2).all()
    mask = rng.dropout_keep(9, 0, (5, 16), 0.25)
    field = next(f for f in prog.graph.batch_fields if f.name == mask_value.name)
    assert (b1[field.offset:field.offset + field.numel] == mask.reshape(-1)).all()
    ex = StepExecutor(prog.graph)
    res = ex.run_step(ex.initial_state(prog.initial_state()), b1)
    grads = {k[5:]: res.output(prog.graph, k) for k in prog.graph.named if k.startswith("grad:")}
    # torch with the same mask
    m.zero_grad()
    h = torch.relu(m[0](torch.tensor(x))) * torch.tensor(mask) * (1 / (1 - np.float32(0.25)))
    loss = nn.functional.cross_entropy(m[3](h), torch.tensor(y).long())
    loss.backward()
    assert abs(float(res.output(prog.graph, "loss")) - loss.item()) <= 1e-5 * loss.item()
    for name, p in m.named_parameters():
        assert close(grads[name], p.grad.numpy()), name


def test_vision_import_refusals_name_the_node() -> None:
    m = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(1, 1, 3))
    with pytest.raises(UnsupportedModelError, match="Pad.*mode='reflect'"):
        import_onnx(export_torch(m, torch.zeros(1, 1, 4, 4), ["x"], training=True))
    pool = nn.MaxPool2d(2, return_indices=True)

    class WithIndices(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, i = pool(x)
            return y + i.float()

    with pytest.raises(UnsupportedModelError, match="MaxPool.*Indices"):
        import_onnx(export_torch(WithIndices(), torch.zeros(1, 1, 4, 4), ["x"]))

"""Helpers of the graph tests: torch model -> one RepOps training step, torch gradients, two small models."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from verde_chain.graph.executor import StepExecutor, StepResult
from verde_chain.graph.onnx_import import import_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec, TrainingProgram, build_training_graph


def build(module: torch.nn.Module, x: torch.Tensor, loss: str = "cross_entropy",
          opt: OptimizerSpec | None = None, fuse: bool = True) -> TrainingProgram:
    model, _ = import_torch(module, x, ["x"], fuse=fuse)
    return build_training_graph(model, LossSpec(loss), opt or OptimizerSpec("sgd", lr=0.1))


def one_step(prog: TrainingProgram, x: np.ndarray, target: np.ndarray) -> StepResult:
    ex = StepExecutor(prog.graph)
    st = ex.initial_state(prog.initial_state())
    return ex.run_step(st, prog.batch(1, {"x": x}, target))


def torch_grads(module: torch.nn.Module, x: np.ndarray, target: np.ndarray, loss: str) -> tuple[float, dict[str, np.ndarray]]:
    module.zero_grad()
    out = module(torch.tensor(x) if x.dtype == np.float32 else torch.tensor(x).long())
    if loss == "cross_entropy":
        l = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), torch.tensor(target).long().reshape(-1))
    else:
        l = torch.nn.functional.mse_loss(out, torch.tensor(target))
    l.backward()
    return float(l.detach()), {n: p.grad.detach().numpy().copy() for n, p in module.named_parameters()}


def close(a: np.ndarray, b: np.ndarray, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    """|a - b| <= rel * max|b| + abs_ elementwise (float32 sums in a different order than torch)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    return bool(np.all(np.abs(a - b) <= rel * np.max(np.abs(b)) + abs_))


def grad_of(prog: TrainingProgram, res: StepResult, module: torch.nn.Module, name: str) -> np.ndarray:
    """RepOps gradient of torch parameter ``name``, also when the exporter stored it transposed
    (Linear on 3-D inputs exports MatMul with an initializer holding W^T under a new name)."""
    p = dict(module.named_parameters())[name].detach().numpy()
    if f"grad:{name}" in prog.graph.named:
        return res.output(prog.graph, f"grad:{name}")
    for v in prog.model.params():
        if v.data is not None and v.data.shape == p.T.shape and np.array_equal(v.data, p.T):
            return res.output(prog.graph, f"grad:{v.name}").T
    raise KeyError(name)


class Mixed(nn.Module):
    """Covers Gemm, Tanh, Sigmoid, Sub/Mul/Div by tensors and scalars, ReduceMean, LayerNorm, GELU (erf form)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.ln = nn.LayerNorm(8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 4)
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = self.ln(h) * self.scale - h.mean(-1, keepdim=True)
        g = torch.sigmoid(self.b(h))
        h = nn.functional.gelu(h) / (g + 1.0) + 0.5 * g
        return self.c(h)


class Attention(nn.Module):
    """Batched MatMul with transposes, Softmax inside the model, Exp/Log via LogSoftmax output."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) * 0.5, dim=-1)
        return torch.log_softmax(self.out(att @ self.v(x)), dim=-1)

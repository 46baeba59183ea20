"""Shared helpers of the graph tests (torch model -> one RepOps training step, torch gradients), and their own check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verde_chain.chain.anvil import increase_time
from verde_chain.chain.game import DisputeGameClient, GameParams, GameView
from verde_chain.chain.tx import call
from verde_chain.game import players as pl
from verde_chain.game import runner
from verde_chain.graph.data import batch_root_list
from verde_chain.graph.executor import StepExecutor, StepResult
from verde_chain.graph.onnx_import import import_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec, TrainingProgram, build_training_graph
from verde_chain.graph.world import TrainingWorld


@dataclass
class Played:
    out: runner.Outcome
    final: GameView
    events: list[str]
    defender: str
    challenger: str


def play_real(w3: Any, deploy: Any, artifacts: Any, dworld: TrainingWorld, cworld: TrainingWorld, *,
              steps: int, arity: int, clock: int, dstrat: str = "consistent", cstrat: str = "consistent") -> Played:
    """Play one game over a real training job with the real DisputeGame and ScalarVM, through a
    ResolverMock; checks that the resolver heard the result exactly once, with the right parties."""
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    resolver = deploy("ResolverMock")
    client = DisputeGameClient(w3, game, artifacts)
    defender, challenger = w3.eth.accounts[1], w3.eth.accounts[2]
    g = dworld.graph
    params = GameParams(
        defender, challenger, dworld.step_commitment(0), dworld.step_commitment(steps), steps, g.root(),
        batch_root_list(dworld.batch_roots), arity, clock, len(g.nodes),
    )
    gid = client.create_game_via(resolver, params)
    out = runner.play(client, gid, pl.Defender(dworld, dstrat, seed=1), pl.Challenger(cworld, cstrat, seed=1),
                      lambda s: increase_time(w3, s))
    loser = challenger if out.winner == defender else defender
    assert [tuple(c) for c in call(resolver.functions.callbacks(gid), artifacts)] == [(game.address, out.winner, loser)]
    assert out.final is not None
    return Played(out, out.final, [n for n, _ in client.history(gid)], defender, challenger)


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


def test_close_is_relative_to_the_largest_reference_element() -> None:
    assert close(np.array([1.0, 0.00005]), np.array([1.0, 0.0]))
    assert not close(np.array([1.0, 0.001]), np.array([1.0, 0.0]))

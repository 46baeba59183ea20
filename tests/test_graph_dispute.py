"""End to end: a real RepOps training job disputed on chain with the real ScalarVM one-step prover.

Two trainers run the same tiny job (2-layer MLP, cross-entropy, SGD momentum, T = 3). One is
honest; the other flips one bit of one output element of one node at one step and continues from
there. The dispute game (DisputeGame + ScalarVM on Anvil), driven by the game's players over
``TrainingWorld``, must end with the honest party winning, whichever role it plays; the
divergence reaches the one-step proof or an earlier check.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_graph_helpers import build, play_real
from torch import nn

from verde_chain.chain.game import Resolution
from verde_chain.game import runner
from verde_chain.graph.training import OptimizerSpec, TrainingProgram
from verde_chain.graph.world import OutputFault, TrainingWorld

pytestmark = pytest.mark.chain
T = 3
CLOCK = 3600


@pytest.fixture(scope="module")
def prog() -> TrainingProgram:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return build(m, torch.zeros(2, 3), opt=OptimizerSpec("sgd", lr=0.1, momentum=0.9))


def world(p: TrainingProgram, fault: OutputFault | None = None) -> TrainingWorld:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((T, 2, 3)).astype(np.float32)
    Y = rng.integers(0, 2, (T, 2)).astype(np.float32)
    return TrainingWorld(p.graph, p.initial_state(), lambda s: p.batch(s, {"x": X[s - 1]}, Y[s - 1]), T, fault)


def _play(w3: Any, deploy: Any, artifacts: Any, dworld: TrainingWorld, cworld: TrainingWorld) -> tuple[runner.Outcome, str, str]:
    g = play_real(w3, deploy, artifacts, dworld, cworld, steps=T, arity=4, clock=CLOCK)
    return g.out, g.defender, g.challenger


def _fault(p: TrainingProgram, label: str = "matmul") -> OutputFault:
    """A one-bit lie at step 2 in the last node with ``label`` (default: a backward matmul, so the
    lie changes a gradient, then the weights and every later step)."""
    d = [n.index for n in p.graph.nodes if n.label == label][-1]
    return OutputFault(step=2, node=d, element=1 if p.graph.nodes[d].desc.numel > 1 else 0, bit=3)


def test_worlds_agree_until_the_fault(prog: TrainingProgram) -> None:
    honest, liar = world(prog), world(prog, _fault(prog))
    assert honest.step_commitment(0) == liar.step_commitment(0)
    assert honest.step_commitment(1) == liar.step_commitment(1)
    assert all(honest.step_commitment(s) != liar.step_commitment(s) for s in (2, 3))
    d = _fault(prog).node
    assert honest.micro_state(2, d, 1, 5) == liar.micro_state(2, d, 1, 5)
    n = honest.micro_steps(2, d)
    assert honest.micro_state(2, d, 1, n) != liar.micro_state(2, d, 1, n)


# FMA chain with memory proofs; LOADIDX (the label lookup); a transcendental program (exp)
@pytest.mark.parametrize("label", ["matmul", "ce/nll", "ce/exp"])
def test_lying_trainer_loses_to_honest_challenger(w3, deploy, artifacts, prog: TrainingProgram, label: str) -> None:  # type: ignore[no-untyped-def]
    f = _fault(prog, label)
    out, _, challenger = _play(w3, deploy, artifacts, world(prog, f), world(prog))
    assert out.winner == challenger, (out.resolution, out.reverts)
    assert out.resolution == Resolution.STEP
    # the bisection narrowed to step 2 and the faulty node: one instruction decided it
    assert out.final is not None
    assert (out.final.step, out.final.node_index, out.final.element) == (f.step, f.node, f.element)


def test_honest_trainer_beats_lying_challenger(w3, deploy, artifacts, prog: TrainingProgram) -> None:  # type: ignore[no-untyped-def]
    out, defender, _ = _play(w3, deploy, artifacts, world(prog), world(prog, _fault(prog)))
    assert out.winner == defender, (out.resolution, out.reverts)
    assert out.resolution == Resolution.STEP

"""A full dispute for a cheat at each level, with a real training job and the real ScalarVM (issue #6)
(the cheats are verde_chain/dispute/cheats.py; the training job's World is graph/world.py).

The job: a tiny MLP (3 -> 48 -> ReLU -> 2, cross-entropy, SGD momentum, batch 2, T = 4 steps),
run by the RepOps executor; the games are played on Anvil by ``DisputeGame`` refereed by
``ScalarVM``, between the game's players driving ``TrainingWorld``s (``verde_chain/graph/world.py``)
and the cheating worlds of ``verde_chain/dispute/cheats.py``. 48 hidden units make the dW1 and W1
tensors 144 elements long, i.e. two 128-element leaves, so L3 really descends a tensor tree.

Every cheat is honest up to step 2 and lies from there. Where its lie first shows:

  L1  the checkpoint list: a lazy trainer re-posts C_{s-1} as C_s (and still trains the rest),
      a defender posting garbage or copied checkpoint claims;
  L2  the node: another op, other wiring, a stale parameter, another step's batch;
  L3  the element: a tensor whose element is not what the trainer's own trace computes, or a
      trainer that shows the honest chunk / subtree instead of the one it committed;
  L4  the micro-steps: one wrong instruction result mid-trace, or a wrong last state (in an FMA
      chain with memory proofs, in a LOADIDX label lookup, and in a transcendental program).

The protocol stops L1/L2/L3 lies before the one-step proof (docs/protocol.md, "Binding between
levels"): the lying defender cannot make its next move (the referee reverts it by name) and loses
on time. L4 lies reach the one-step proof and lose there. In the other role, each cheating world
as challenger loses to the honest trainer at the one-step proof. After every game the resolver
was called back exactly once with the right (winner, loser).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.dispute import Played, play_real
from tests.support.graph import build
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.dispute import cheats, runner
from verde_chain.dispute import players as pl
from verde_chain.dispute.types import Resolution
from verde_chain.graph.data import batch_root_list
from verde_chain.graph.structure import Source, SourceKind, TrainingGraph
from verde_chain.graph.training import OptimizerSpec, TrainingProgram
from verde_chain.graph.world import OutputFault, TrainingWorld
from verde_chain.job import job_from_torch
from verde_chain.market.marketparams import FAST, split_forfeit
from verde_chain.market.types import ETH, ZERO32, JobTerms, SlotStatus
from verde_chain.repops import library

pytestmark = pytest.mark.chain
T = 4
CLOCK = 3600
ARITY = 4
STEP = 2  # the step every cheat lies at
HIDDEN = 48


@pytest.fixture(scope="module")
def prog() -> TrainingProgram:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))
    return build(m, torch.zeros(2, 3), opt=OptimizerSpec("sgd", lr=0.1, momentum=0.9))


def _node(p: TrainingProgram, label: str, nth: int = 0) -> int:
    return [n.index for n in p.graph.nodes if n.label == label][nth]


def _element(p: TrainingProgram, d: int) -> int:
    return 1 if p.graph.nodes[d].desc.numel > 1 else 0


def _args(p: TrainingProgram) -> tuple[TrainingGraph, dict[str, np.ndarray], Callable[[int], np.ndarray], int]:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((T, 2, 3)).astype(np.float32)
    Y = rng.integers(0, 2, (T, 2)).astype(np.float32)
    return p.graph, p.initial_state(), lambda s: p.batch(s, {"x": X[s - 1]}, Y[s - 1]), T


@dataclass(frozen=True)
class Cheat:
    """A lie, where the honest challenger's search must end (node, element) and how it loses."""

    name: str
    level: int
    node: int  # -1: junk checkpoints, the search may end anywhere
    error: str | None  # the referee's revert that leaves the lying defender without a move
    resolution: Resolution
    element: int | None = None
    micro: int | None = None  # the faulty micro-step (the one-step proof executes micro - 1)
    strategy: str = "consistent"
    propagates: bool = True  # False: a lie in a value no later step reads (C_{s+1} .. C_T stay honest)


def _cheats(p: TrainingProgram) -> list[tuple[Cheat, Any]]:
    """(expectation, world factory) for every cheat."""
    a = _args(p)
    dw1 = _node(p, "matmul", 2)  # dW1 = dH^T x, (48, 3): 144 elements, two leaves
    w1 = p.graph.state_by_name()["0.weight"].producer  # sgd_param of W1, (48, 3)
    relu = _node(p, "relu")
    dw2 = _node(p, "matmul", 1)  # dW2 = dY^T relu(h): reads relu's output
    gemm1 = _node(p, "gemm")  # the first reader of W1
    nll, log = _node(p, "ce/nll", -1), _node(p, "ce/log", -1)  # a LOADIDX program, a transcendental one
    bad = OutputFault(step=STEP, node=dw1, element=130, bit=3)
    dw1_n = p.graph.nodes[dw1].desc.num_steps
    wiring = tuple(Source(SourceKind.NODE_OUTPUT, _node(p, "gemm")) if s == Source(SourceKind.NODE_OUTPUT, relu) else s
                   for s in p.graph.nodes[dw2].inputs)
    assert wiring != p.graph.nodes[dw2].inputs
    return [
        (Cheat("L1-lazy", 1, 0, "InvalidProof", Resolution.TIMEOUT),
         lambda: cheats.SkippedStepWorld(*a, skip=STEP)),
        (Cheat("L1-lazy-last-step", 1, 0, "InvalidProof", Resolution.TIMEOUT),
         lambda: cheats.SkippedStepWorld(*a, skip=T)),
        (Cheat("L1-garbage-checkpoints", 1, -1, "SubtreeMismatch", Resolution.TIMEOUT, strategy="garbage"),
         lambda: cheats.SkippedStepWorld(*a, skip=STEP)),
        (Cheat("L1-copied-checkpoints", 1, -1, "SubtreeMismatch", Resolution.TIMEOUT, strategy="copy"),
         lambda: cheats.SkippedStepWorld(*a, skip=STEP)),
        (Cheat("L2-wrong-op", 2, relu, "InvalidProof", Resolution.TIMEOUT),
         lambda: cheats.DeviantNodeWorld(*a, step=STEP, node=relu, desc=library.leaky_relu((2, HIDDEN), 0.01))),
        (Cheat("L2-wrong-op-claims-graph-op", 2, relu, "NodeMismatch", Resolution.TIMEOUT),
         lambda: cheats.DeviantNodeWorld(*a, step=STEP, node=relu, desc=library.leaky_relu((2, HIDDEN), 0.01),
                                         claim_graph_node=True)),
        (Cheat("L2-wrong-wiring", 2, dw2, "InputNotJustified", Resolution.TIMEOUT),
         lambda: cheats.DeviantNodeWorld(*a, step=STEP, node=dw2, inputs=wiring)),
        (Cheat("L2-stale-parameter", 2, gemm1, "InputNotJustified", Resolution.TIMEOUT),
         lambda: cheats.StaleInputWorld(*a, step=STEP, producer=w1)),
        (Cheat("L2-wrong-batch", 2, 0, "InputNotJustified", Resolution.TIMEOUT),
         lambda: cheats.WrongBatchWorld(*a, step=STEP, batch_of=STEP - 1)),
        (Cheat("L3-element-not-backed-by-trace", 3, dw1, "FinalValueMismatch", Resolution.TIMEOUT, element=130),
         lambda: cheats.UnbackedElementWorld(*a, fault=bad)),
        (Cheat("L3-dodges-chunk", 3, w1, "ChunkMismatch", Resolution.TIMEOUT, element=5),
         lambda: cheats.DodgingWorld(*a, fault=OutputFault(STEP, w1, 5, 7), dodge="chunk")),
        (Cheat("L3-dodges-subtree", 3, dw1, "SubtreeMismatch", Resolution.TIMEOUT, element=130),
         lambda: cheats.DodgingWorld(*a, fault=bad, dodge="subtree")),
        # dW1's program for one element: LOAD, LOAD, MUL, LOAD, LOAD, FMA. Micro-step 2 is the
        # second LOAD (the one-step proof opens the operand against the input root), 3 the MUL.
        (Cheat("L4-wrong-loaded-operand", 4, dw1, None, Resolution.STEP, element=130, micro=2),
         lambda: cheats.MicroStepWorld(*a, micro_fault=cheats.MicroFault(STEP, dw1, 130, 2))),
        (Cheat("L4-wrong-product", 4, dw1, None, Resolution.STEP, element=130, micro=3),
         lambda: cheats.MicroStepWorld(*a, micro_fault=cheats.MicroFault(STEP, dw1, 130, 3))),
        (Cheat("L4-wrong-final-state", 4, dw1, None, Resolution.STEP, element=130, micro=dw1_n),
         lambda: TrainingWorld(*a, fault=bad)),
        # the forward loss (ce/nll, ce/log) feeds only the reported loss, not the gradients: a lie there
        # leaves the later steps honest, and the challenger still finds it at its step (ce/sub_exp,
        # the softmax's terms, feeds the backward too: the one node both read)
        (Cheat("L4-wrong-final-state-loadidx", 4, nll, None, Resolution.STEP, element=_element(p, nll),
               micro=p.graph.nodes[nll].desc.num_steps, propagates=False),
         lambda: TrainingWorld(*a, fault=OutputFault(STEP, nll, _element(p, nll), bit=3))),
        (Cheat("L4-wrong-final-state-log", 4, log, None, Resolution.STEP, element=_element(p, log),
               micro=p.graph.nodes[log].desc.num_steps, propagates=False),
         lambda: TrainingWorld(*a, fault=OutputFault(STEP, log, _element(p, log), bit=3))),
    ]


CHEAT_NAMES = [
    "L1-lazy", "L1-lazy-last-step", "L1-garbage-checkpoints", "L1-copied-checkpoints",
    "L2-wrong-op", "L2-wrong-op-claims-graph-op", "L2-wrong-wiring", "L2-stale-parameter", "L2-wrong-batch",
    "L3-element-not-backed-by-trace", "L3-dodges-chunk", "L3-dodges-subtree",
    "L4-wrong-loaded-operand", "L4-wrong-product", "L4-wrong-final-state", "L4-wrong-final-state-loadidx",
    "L4-wrong-final-state-log",
]


def _cheat(p: TrainingProgram, name: str) -> tuple[Cheat, Any]:
    ((c, make),) = [(c, m) for c, m in _cheats(p) if c.name == name]
    return c, make


def _play(w3: Any, deploy: Any, artifacts: Any, dworld: TrainingWorld, cworld: TrainingWorld,
          dstrat: str = "consistent", cstrat: str = "consistent") -> Played:
    return play_real(w3, deploy, artifacts, dworld, cworld, steps=T, arity=ARITY, clock=CLOCK,
                     dstrat=dstrat, cstrat=cstrat)


# -- the cheating worlds lie where they should (no chain) ------------------------------------------


def test_each_cheat_first_differs_at_step_2_and_its_node(prog: TrainingProgram) -> None:
    assert [c.name for c, _ in _cheats(prog)] == CHEAT_NAMES  # the parametrized list is complete
    honest = TrainingWorld(*_args(prog))
    for c, make in _cheats(prog):
        if c.strategy != "consistent":
            continue
        w = make()
        skip = getattr(w, "skip", STEP)
        assert [w.step_commitment(s) == honest.step_commitment(s) for s in range(T + 1)] == \
            [s < skip or (s > skip and not c.propagates) for s in range(T + 1)], c.name
        mine, theirs = w.node_levels(skip)[0], honest.node_levels(skip)[0]
        first = next(d for d in range(len(mine)) if mine[d] != theirs[d])
        assert first == c.node, (c.name, first)
        if c.element is not None:  # L3/L4: same inputs, one output element differs
            assert w.input_roots(STEP, c.node) == honest.input_roots(STEP, c.node)
            a, b = w._output(STEP, c.node).view(np.uint32), honest._output(STEP, c.node).view(np.uint32)
            assert np.flatnonzero(a != b).tolist() == [c.element], c.name


@pytest.mark.parametrize("name", [n for n in CHEAT_NAMES if n.startswith("L4")])
def test_micro_fault_diverges_at_its_micro_step_and_changes_the_value(prog: TrainingProgram, name: str) -> None:
    c, make = _cheat(prog, name)
    w, honest = make(), TrainingWorld(*_args(prog))
    assert c.micro is not None and c.element is not None
    n = w.micro_steps(STEP, c.node)
    same = [w.micro_state(STEP, c.node, c.element, j) == honest.micro_state(STEP, c.node, c.element, j)
            for j in range(n + 1)]
    assert same == [j < c.micro for j in range(n + 1)]
    # the committed element is the corrupted trace's result, and not the honest one
    value = w._states(STEP, c.node, c.element)[-1].regs[0]
    assert int(w._output(STEP, c.node).view(np.uint32)[c.element]) == value
    assert int(honest._output(STEP, c.node).view(np.uint32)[c.element]) != value


def test_cheats_that_change_nothing_are_refused(prog: TrainingProgram) -> None:
    a = _args(prog)
    with pytest.raises(cheats.CheatError):
        cheats.SkippedStepWorld(*a, skip=1)
    with pytest.raises(cheats.CheatError):
        cheats.DeviantNodeWorld(*a, step=STEP, node=3)
    with pytest.raises(cheats.CheatError):
        cheats.WrongBatchWorld(*a, step=STEP, batch_of=STEP)
    with pytest.raises(cheats.CheatError):
        cheats.DodgingWorld(*a, fault=OutputFault(STEP, 3, 0), dodge="leaf")


# -- games on chain --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHEAT_NAMES)
def test_cheating_trainer_loses_to_honest_challenger(w3, deploy, artifacts, prog: TrainingProgram, name: str) -> None:  # type: ignore[no-untyped-def]
    c, make = _cheat(prog, name)
    liar = make()
    g = _play(w3, deploy, artifacts, liar, TrainingWorld(*_args(prog)), dstrat=c.strategy)
    out, v = g.out, g.final
    assert out.winner == g.challenger, (name, out.resolution, out.reverts)
    assert out.resolution == c.resolution, (name, out.reverts)
    # the one move the liar could not make, named by the referee (none when it lost at the step)
    assert out.reverts == ([c.error] if c.error else []), name
    if c.strategy != "consistent":
        # junk checkpoints: the search ends at some step whose node tree the liar cannot open
        assert "NodeRevealed" not in g.events
        return
    skip = getattr(liar, "skip", STEP)
    assert v.step == skip, (name, v.step)
    if c.level <= 2:
        # stopped at the node reveal: the descent found the first wrong node, it was never accepted
        assert v.cursor == c.node and "NodeRevealed" not in g.events, name
        return
    assert v.node_index == c.node and "NodeRevealed" in g.events
    if c.error in ("ChunkMismatch", "SubtreeMismatch"):
        assert "ElementRevealed" not in g.events  # L3: the shown chunk/subtree is not the committed one
        return
    assert v.element == c.element
    if c.error == "FinalValueMismatch":
        assert "ElementChosen" in g.events and "FinalStateRevealed" not in g.events
        return
    # L4: bisected down to the faulty instruction; the ScalarVM executed it and convicted the liar
    assert c.micro is not None and v.lo == c.micro - 1 and "Stepped" in g.events


@pytest.mark.parametrize("name", [n for n in CHEAT_NAMES if n not in ("L1-garbage-checkpoints", "L1-copied-checkpoints")])
def test_honest_trainer_beats_cheating_challenger(w3, deploy, artifacts, prog: TrainingProgram, name: str) -> None:  # type: ignore[no-untyped-def]
    c, make = _cheat(prog, name)
    g = _play(w3, deploy, artifacts, TrainingWorld(*_args(prog)), make())
    assert g.out.winner == g.defender, (name, g.out.resolution, g.out.reverts)
    # every claim of the honest trainer is right: whatever the liar picks ends in a step it wins
    assert g.out.resolution == Resolution.STEP and g.out.reverts == []
    # the liar steered the search to its own first disagreement, and lost there
    assert (g.final.step, g.final.node_index) == (getattr(make(), "skip", STEP), c.node)


def test_honest_trainer_beats_random_challenger(w3, deploy, artifacts, prog: TrainingProgram) -> None:  # type: ignore[no-untyped-def]
    honest = TrainingWorld(*_args(prog))
    g = _play(w3, deploy, artifacts, honest, TrainingWorld(*_args(prog)), cstrat="random")
    assert g.out.winner == g.defender and g.out.resolution in (Resolution.STEP, Resolution.PADDING)
    assert g.out.reverts == []


# -- the same cheats on the real JobMarket: the cheater's stake pays the honest rival --------------


@pytest.mark.parametrize("name", ["L1-lazy", "L2-stale-parameter", "L3-dodges-subtree", "L4-wrong-product"])
def test_cheating_trainer_loses_its_stake_in_the_job_market(w3, deploy, artifacts, chain, prog: TrainingProgram,  # type: ignore[no-untyped-def]
                                                             name: str) -> None:
    _, make = _cheat(prog, name)
    liar, honest = make(), TrainingWorld(*_args(prog))
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    market = Market.deploy(w3, artifacts, game.address, FAST)
    client_acct, cheater, trainer = w3.eth.accounts[1], w3.eth.accounts[3], w3.eth.accounts[4]
    reward, stake, bond = 10**18, 3 * 10**17, 10**16
    g = prog.graph
    job_spec = JobTerms(
        token=ETH, spec_hash=b"\x11" * 32, bundle_uri="", graph_root=g.root(), initial_commitment=honest.step_commitment(0),
        batch_root=batch_root_list(honest.batch_roots), num_steps=T, checkpoint_interval=T, reward=reward,
        trainer_stake=stake, min_challenge_bond=bond, slots=2, submission_deadline=chain.timestamp() + 1000,
        reveal_window=1000, challenge_window=1000, arity=ARITY, clock_seconds=CLOCK, num_nodes=len(g.nodes),
    )
    job_id, _ = market.post_job(job_spec, sender=client_acct)
    bad_slot, _ = market.join(job_id, sender=cheater)
    good_slot, _ = market.join(job_id, sender=trainer)
    market.commit_result(job_id, liar.step_commitment(T), b"\x01" * 32, sender=cheater)
    market.commit_result(job_id, honest.step_commitment(T), b"\x02" * 32, sender=trainer)
    chain.increase_time(1001)
    market.reveal(job_id, liar.step_commitment(T), ZERO32, b"\x01" * 32, sender=cheater)
    market.reveal(job_id, honest.step_commitment(T), ZERO32, b"\x02" * 32, sender=trainer)
    # the honest trainer disputes its rival's different result: the cheater defends its C_T
    gid, _ = market.dispute_rival(job_id, bad_slot, good_slot, sender=trainer, bond=bond)
    gclient = DisputeGameClient(w3, game, artifacts)
    out = runner.play(gclient, gid, pl.Defender(liar), pl.Challenger(honest), lambda s: increase_time(w3, s))
    assert out.winner == trainer
    assert market.slot(job_id, bad_slot).status == SlotStatus.REJECTED
    chain.increase_time(2001)
    market.finalize(job_id)
    assert market.job(job_id).accepted_result == honest.step_commitment(T)
    # the honest trainer: the whole reward, its stake and bond back and the cheater's stake less the
    # burned half; the cheater: nothing
    burnt, paid = split_forfeit(stake, FAST.burn_bps)
    assert market.balance_of(trainer) == reward + stake + bond + paid
    assert market.balance_of(cheater) == 0
    assert market.balance_of(client_acct) == 0
    assert market.burned() == burnt
    assert market.total_owed() == w3.eth.get_balance(market.address) == reward + 2 * stake + bond


# -- an inference job: a lie about an early batch's outputs is disputable ---------------------------


@pytest.mark.parametrize("where", ["batch-1-logit", "outputs-buffer-row-0"])
def test_lie_about_batch_1_of_a_3_batch_inference_job_loses(w3, deploy, artifacts, where: str) -> None:  # type: ignore[no-untyped-def]
    """The cheater's result is wrong only in batch 1's outputs: a logit it computed wrong at step
    1, or row 0 of the outputs buffer it rewrote at step 3. C_T commits every batch's outputs
    (the outputs buffer), so the honest challenger disputes and the game convicts the lie at the
    one-step proof (the write node is refereed like any other)."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    X = np.random.default_rng(4).standard_normal((6, 3)).astype(np.float32)
    job = job_from_torch(m, torch.zeros(2, 3), (X, None), steps=3, kind="inference")
    named = job.program.graph.named
    step, node, element = (1, named["output"], 3) if where == "batch-1-logit" else (3, named["outputs:output"], 1)
    liar = TrainingWorld.from_job(job, OutputFault(step, node, element, bit=7))
    honest = TrainingWorld.from_job(job)
    assert liar.step_commitment(3) != honest.step_commitment(3)
    g = play_real(w3, deploy, artifacts, liar, honest, steps=3, arity=ARITY, clock=CLOCK)
    assert g.out.winner == g.challenger and g.out.resolution == Resolution.STEP, (g.out.resolution, g.out.reverts)
    assert (g.final.step, g.final.node_index, g.final.element) == (step, node, element)
    assert "Stepped" in g.events

"""DisputeGame with the toy stepper: honest vs dishonest games at every level, timeouts, turn
order, binding invariants, and the toy machine's twin (tests/support/toy.py vs ToyStepper.sol).

The Python twins of the game's libraries have their own differential tests next to this one
(test_bisection_twin.py, test_clock_twin.py, test_nodecheck_twin.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import toy
from tests.support.dispute import CLOCK, MICRO, NUMELS, Env, revert, within_bound
from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.chain.revert import decode_revert
from verde_chain.chain.tx import call, transact
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute import bisection, runner
from verde_chain.dispute import players as pl
from verde_chain.dispute.types import GameParams, Phase, Resolution
from verde_chain.errors import ContractRevert
from verde_chain.graph.structure import SourceKind

# -- pure Python: the toy machine -------------------------------------------------------------------


def test_toy_affine_matches_trace() -> None:
    for n in (0, 1, 5, 33):
        a, b = toy.affine(n)
        for acc0 in (0, 1, 0xFFFFFFFF, 123456789):
            acc = acc0
            for j in range(n):
                acc = toy.next_acc(acc, j)
            assert acc == (a * acc0 + b) & toy.MASK


def test_faulty_world_diverges_only_from_the_fault() -> None:
    job = ToyJob(12, default_graph(5, NUMELS, MICRO))
    honest = ToyWorld(job)
    liar = ToyWorld(job, Fault("micro", 6, 2, 200, 3))
    agree = [honest.step_commitment(s) == liar.step_commitment(s) for s in range(13)]
    assert agree == [True] * 6 + [False] * 7
    hl, ll = honest.node_levels(6)[0], liar.node_levels(6)[0]
    assert [a == b for a, b in zip(hl, ll)][:3] == [True, True, False]
    states_h = [honest.micro_state(6, 2, 200, j) for j in range(8)]
    states_l = [liar.micro_state(6, 2, 200, j) for j in range(8)]
    assert [a == b for a, b in zip(states_h, states_l)] == [True] * 3 + [False] * 5


# -- the Python twin of the toy stepper against ToyStepper.sol -----------------------------------------


@pytest.mark.chain
def test_toy_stepper_twin(env: Env) -> None:
    s = env.stepper.functions
    job = ToyJob(3, default_graph(4, NUMELS, MICRO))
    w = ToyWorld(job)
    for d in range(4):
        spec = job.nodes[d]
        assert call(s.describe(spec.desc), env.artifacts) == [spec.numel, spec.micro_steps]
        ins = w._get(2).inputs[d]
        for e in (0, spec.numel - 1):
            ctx = (spec.desc_hash, spec.desc, ins, e, 0)
            st0 = w.micro_state(2, d, e, 0)
            assert call(s.initialStateHash(ctx), env.artifacts) == keccak256(st0)
            for j in range(spec.micro_steps):
                pre, post = w.micro_state(2, d, e, j), w.micro_state(2, d, e, j + 1)
                got = call(s.step((spec.desc_hash, spec.desc, ins, e, j), pre, b""), env.artifacts)
                assert got == keccak256(post)
            final = w.micro_state(2, d, e, spec.micro_steps)
            assert call(s.finalValue(final), env.artifacts) == [keccak256(final), toy.decode_state(final)[1]]
    with pytest.raises(ContractRevert) as err:  # a state for the wrong micro-step
        call(s.step((spec.desc_hash, spec.desc, ins, 0, 5), toy.encode_state(4, 1), b""), env.artifacts)
    assert err.value.name == "ToyBadState"


# -- honest vs dishonest, divergence point drawn at random ---------------------------------------------

GAME_SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


def _random_micro_fault(job: ToyJob, data: st.DataObject) -> Fault:
    d = data.draw(st.sampled_from([i for i, n in enumerate(job.nodes) if n.micro_steps > 0]), label="node")
    n = job.nodes[d]
    return Fault("micro", data.draw(st.integers(1, job.num_steps), label="step"), d,
                 data.draw(st.integers(0, n.numel - 1), label="element"),
                 data.draw(st.integers(1, n.micro_steps), label="micro"))


@pytest.mark.chain
@GAME_SETTINGS
@given(data=st.data(), num_steps=st.integers(1, 40), num_nodes=st.integers(1, 7), logk=st.integers(1, 4))
def test_lying_defender_loses_to_honest_challenger(env: Env, data: st.DataObject, num_steps: int, num_nodes: int,
                                                   logk: int) -> None:
    k = 1 << logk
    ckpt = data.draw(st.integers(1, num_steps), label="checkpoint interval")
    job = ToyJob(num_steps, default_graph(num_nodes, NUMELS, (1, 7, 20, 0)))
    liar, honest = ToyWorld(job, _random_micro_fault(job, data)), ToyWorld(job)
    gid = env.create(job, liar.step_commitment(num_steps), k, ckpt=ckpt)
    out = env.play(gid, liar, honest)
    env.expect(gid, out, env.challenger, Resolution.STEP)
    assert out.final is not None and out.final.step == liar.fault.step and out.final.node_index == liar.fault.node
    assert out.final.element == liar.fault.element and out.final.lo == liar.fault.micro - 1
    assert out.final.checkpoint_interval == ckpt
    assert out.reverts == []
    within_bound(out, job, k, ckpt)


@pytest.mark.chain
@GAME_SETTINGS
@given(data=st.data(), num_steps=st.integers(1, 40), num_nodes=st.integers(1, 7), logk=st.integers(1, 4),
       cstrat=st.sampled_from(["consistent", "random"]))
def test_honest_defender_beats_lying_challenger(env: Env, data: st.DataObject, num_steps: int, num_nodes: int,
                                                logk: int, cstrat: str) -> None:
    k = 1 << logk
    ckpt = data.draw(st.integers(1, num_steps), label="checkpoint interval")
    job = ToyJob(num_steps, default_graph(num_nodes, NUMELS, (7, 0, 1, 20)))
    liar, honest = ToyWorld(job, _random_micro_fault(job, data)), ToyWorld(job)
    gid = env.create(job, honest.step_commitment(num_steps), k, ckpt=ckpt)
    out = env.play(gid, honest, liar, cstrat=cstrat, seed=data.draw(st.integers(0, 1000), label="seed"))
    env.expect(gid, out, env.defender)
    assert out.resolution in (Resolution.STEP, Resolution.PADDING, Resolution.EMPTY_PROGRAM)
    assert out.reverts == []
    within_bound(out, job, k, ckpt)


# -- lies the referee rejects at L2/L3, and padding ------------------------------------------------------

PADDED = default_graph(5, NUMELS, (3, 7, 20))  # 5 nodes: 3 padding leaves in every step tree


@pytest.mark.chain
@pytest.mark.parametrize(
    "fault, expected_revert, resolution",
    [
        (Fault("input", 4, 2), "InputNotJustified", Resolution.TIMEOUT),  # an input not from its source
        (Fault("input", 4, 0), "InputNotJustified", Resolution.TIMEOUT),  # a wrong batch input
        (Fault("desc", 4, 3), "InvalidProof", Resolution.TIMEOUT),  # another op than the graph's
        (Fault("garbage_node", 6, 1), "NodeMismatch", Resolution.TIMEOUT),  # a node hash without preimage
        (Fault("node_padding", 6), None, Resolution.PADDING),  # non-zero padding in C_s
        (Fault("element_padding", 4, 1), None, Resolution.PADDING),  # non-zero padding element
        (Fault("leaf_padding", 4, 2), None, Resolution.PADDING),  # non-zero padding leaf (3 of 4 leaves)
    ],
    ids=lambda x: x.kind if isinstance(x, Fault) else str(x),
)
def test_invariant_breaking_defender_loses(env: Env, fault: Fault, expected_revert: str | None,
                                           resolution: Resolution) -> None:
    job = ToyJob(6, PADDED)
    liar, honest = ToyWorld(job, fault), ToyWorld(job)
    gid = env.create(job, liar.step_commitment(6), 2)
    out = env.play(gid, liar, honest)
    env.expect(gid, out, env.challenger, resolution)
    assert out.reverts == ([expected_revert] if expected_revert else [])
    within_bound(out, job, 2)


@pytest.mark.chain
@pytest.mark.parametrize("dstrat, expected", [("garbage", "SubtreeMismatch"), ("copy", None), ("stall", None)])
@pytest.mark.parametrize("k", [2, 16])
def test_garbage_copy_and_stalling_defenders_lose(env: Env, dstrat: str, expected: str | None, k: int) -> None:
    job = ToyJob(30, default_graph(6, NUMELS, (5, 9)))
    honest = ToyWorld(job)
    # the defender's C_T is a lie (from a faulty world); its intermediate claims are junk
    liar = ToyWorld(job, Fault("micro", 17, 2, 100, 2))
    gid = env.create(job, liar.step_commitment(30), k)
    out = env.play(gid, liar, honest, dstrat=dstrat)
    env.expect(gid, out, env.challenger)
    within_bound(out, job, k)
    if expected:
        assert out.reverts == [expected]
    if dstrat == "stall":
        assert out.resolution == Resolution.TIMEOUT and out.total_moves("defender") == 0


@pytest.mark.chain
@pytest.mark.parametrize("seed", range(6))
def test_random_challenger_loses_to_honest_defender(env: Env, seed: int) -> None:
    """A challenger disputing a correct result, choosing at random (hits padding, empty programs...)."""
    job = ToyJob(25, default_graph(5, NUMELS, MICRO))
    honest = ToyWorld(job)
    gid = env.create(job, honest.step_commitment(25), 4)
    out = env.play(gid, honest, honest, cstrat="random", seed=seed)
    env.expect(gid, out, env.defender)
    within_bound(out, job, 4)


@pytest.mark.chain
def test_copied_claims_challenger(env: Env) -> None:
    """Two honest players: whatever the challenger picks, the defender wins."""
    job = ToyJob(9, default_graph(3, NUMELS, (4,)))
    honest = ToyWorld(job)
    gid = env.create(job, honest.step_commitment(9), 2)
    out = env.play(gid, honest, honest)
    env.expect(gid, out, env.defender)
    within_bound(out, job, 2)


# -- timeouts at every level, for each party -----------------------------------------------------------

ALL_PHASES = [p for p in Phase if p not in (Phase.NONE, Phase.RESOLVED)]


@pytest.mark.chain
@pytest.mark.parametrize("lying_defender", [True, False], ids=["liar-defends", "liar-challenges"])
@pytest.mark.parametrize("phase", ALL_PHASES, ids=[p.name for p in ALL_PHASES])
def test_timeout_at_every_phase(env: Env, chain: Any, phase: Phase, lying_defender: bool) -> None:
    job = ToyJob(9, default_graph(5, (300,), (6,)))
    fault = Fault("micro", 5, 3, 200, 4)
    liar, honest = ToyWorld(job, fault), ToyWorld(job)
    final = (liar if lying_defender else honest).step_commitment(9)
    gid = env.create(job, final, 2)
    assert env.advance_to(gid, liar, honest, lying_defender, phase)
    v = env.client.game(gid)
    late, other = (v.defender, v.challenger) if v.phase.mover.name == "DEFENDER" else (v.challenger, v.defender)
    left = v.defender_left if late == v.defender else v.challenger_left
    # not yet: the party to move still has time
    with pytest.raises(ContractRevert) as err:
        env.client.claim_timeout(gid, other)
    assert err.value.name == "ClockNotExpired"
    chain.increase_time(left + 1)
    # too late to move now
    move = (pl.Defender(liar if lying_defender else honest) if late == v.defender
            else pl.Challenger(honest if lying_defender else liar)).move(v, runner.seen_from_history(env.client, gid))
    if move is not None:
        with pytest.raises(ContractRevert) as err:
            runner.apply(env.client, gid, move, late, v.phase.level)
        assert err.value.name == "ClockExpired"
    env.client.claim_timeout(gid, env.w3.eth.accounts[5])  # anyone may claim
    out_view = env.client.game(gid)
    assert out_view.winner == other and out_view.resolution == Resolution.TIMEOUT
    assert env.callbacks(gid) == [(env.client.contract.address, other, late)]


# -- turn order, replays, resolution -----------------------------------------------------------------


@pytest.mark.chain
def test_turn_order_replays_and_double_resolution(env: Env) -> None:
    job = ToyJob(20, default_graph(3, NUMELS, (4,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 11, 1, 3, 2))
    gid = env.create(job, liar.step_commitment(20), 4)
    g = env.client
    D, C = env.defender, env.challenger
    claims = [liar.step_commitment(p) for p in bisection.split_points(0, 20, 4)[1:-1]]
    # out of turn: the challenger cannot post, the defender cannot choose yet
    e = revert(lambda: g.post_claims(gid, claims, C))
    assert e.name == "NotYourTurn" and e.fields == {"gameId": gid, "caller": C, "expected": D}
    assert revert(lambda: g.choose(gid, 0, claims, C)).name == "WrongPhase"
    assert revert(lambda: g.post_claims(gid, claims[:-1], D)).fields == {"actual": 2, "expected": 3}
    g.post_claims(gid, claims, D)
    # replay of the same post
    assert revert(lambda: g.post_claims(gid, claims, D)).name == "WrongPhase"
    # forged / stale claim vectors and choices out of range
    forged = [keccak256(b"x")] + claims[1:]
    assert revert(lambda: g.choose(gid, 0, forged, C)).name == "ClaimsMismatch"
    e = revert(lambda: g.choose(gid, 4, claims, C))
    assert e.name == "ChoiceOutOfRange" and e.fields == {"choice": 4, "count": 4}
    g.choose(gid, 2, claims, C)  # [10, 15]
    assert revert(lambda: g.choose(gid, 2, claims, C)).name == "WrongPhase"  # replayed choice
    v = g.game(gid)
    assert (v.lo, v.hi, v.phase) == (10, 15, Phase.L1_POST)
    stale = [liar.step_commitment(p) for p in bisection.split_points(10, 15, 4)[1:-1]]
    g.post_claims(gid, stale, D)
    assert revert(lambda: g.choose(gid, 0, claims, C)).name == "ClaimsMismatch"  # last round's vector
    # unknown game
    e = revert(lambda: g.post_claims(99, claims, D))
    assert e.name == "UnknownGame" and e.fields == {"gameId": 99}
    assert revert(lambda: g.claim_timeout(99, D)).name == "UnknownGame"
    # finish the game, then nothing moves any more
    out = env.play(gid, liar, honest)
    env.expect(gid, out, C, Resolution.STEP)
    for attempt in (lambda: g.claim_timeout(gid, C), lambda: g.post_claims(gid, claims, D),
                    lambda: g.step(gid, b"", b"", b"", D)):
        e = revert(attempt)
        assert e.name == "GameAlreadyResolved" and e.fields == {"gameId": gid, "winner": C}
    assert env.callbacks(gid) == [(g.contract.address, C, D)]


@pytest.mark.chain
def test_create_game_validation(env: Env) -> None:
    job = ToyJob(4, default_graph(2, NUMELS, (2,)))
    base = GameParams(env.defender, env.challenger, b"\x01" * 32, b"\x02" * 32, 4, job.graph_root, job.batch_root,
                      4, CLOCK, 2)
    cases = [
        (replace(base, challenger=env.defender), "InvalidParties"),
        (replace(base, defender="0x" + "00" * 20), "InvalidParties"),
        (replace(base, arity=3), "InvalidArity"),
        (replace(base, arity=1), "InvalidArity"),
        (replace(base, arity=512), "InvalidArity"),
        (replace(base, num_steps=0), "InvalidGameSize"),
        (replace(base, num_nodes=0), "InvalidGameSize"),
        (replace(base, clock_seconds=0), "InvalidGameSize"),
        (replace(base, checkpoint_interval=0), "InvalidGameSize"),
    ]
    for p, name in cases:
        assert revert(lambda p=p: env.client.create_game_via(env.resolver, p)).name == name
    # an EOA cannot be a resolver (the callback would revert every final move)
    e = revert(lambda: transact(env.w3, env.client.contract.functions.createGame(base.as_tuple()), env.artifacts,
                                 sender=env.w3.eth.accounts[3]))
    assert e.name == "ResolverNotContract"
    assert env.client.game_count() == 0
    assert env.client.create_game_via(env.resolver, base) == 1


@pytest.mark.chain
def test_resolver_reentry_finds_the_game_resolved(env: Env) -> None:
    transact(env.w3, env.resolver.functions.setReenter(True), env.artifacts)
    job = ToyJob(3, default_graph(2, NUMELS, (2,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 2, 1, 5, 1))
    gid = env.create(job, liar.step_commitment(3), 2)
    env.expect(gid, env.play(gid, liar, honest), env.challenger, Resolution.STEP)
    data = call(env.resolver.functions.reentryRevert(), env.artifacts)
    assert decode_revert(env.artifacts, bytes(data)).name == "GameAlreadyResolved"


# -- binding checks at L3/L4 with hand-made bad moves ---------------------------------------------------


@pytest.mark.chain
def test_bad_reveals_are_rejected(env: Env) -> None:
    job = ToyJob(2, default_graph(2, (300,), (5,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 2, 1, 130, 3))
    gid = env.create(job, liar.step_commitment(2), 2)
    g, D, C = env.client, env.defender, env.challenger
    assert env.advance_to(gid, liar, honest, True, Phase.L2_REVEAL)
    v = g.game(gid)
    good = liar.node_reveal(v.step, v.cursor)
    bad_count = replace(good, input_proofs=good.input_proofs[:-1])
    assert revert(lambda: g.reveal_node(gid, bad_count, D)).name == "InputCountMismatch"
    p0 = good.input_proofs[0]
    two_out = replace(p0, node=replace(p0.node, output_roots=p0.node.output_roots * 2))
    e = revert(lambda: g.reveal_node(gid, replace(good, input_proofs=(two_out,) + good.input_proofs[1:]), D))
    assert e.name == "BadOutputCount" and e.fields == {"count": 2}
    assert revert(lambda: g.reveal_node(gid, replace(good, output_root=b"\x07" * 32), D)).name == "NodeMismatch"
    assert env.advance_to(gid, liar, honest, True, Phase.L3_CHUNK)
    v = g.game(gid)
    chunk = liar.output_chunk(v.step, v.node_index, v.cursor)
    assert revert(lambda: g.reveal_chunk(gid, chunk[:-4], D)).name == "BadChunkLength"
    assert revert(lambda: g.reveal_chunk(gid, bytes(512), D)).name == "ChunkMismatch"
    g.reveal_chunk(gid, chunk, D)
    e = revert(lambda: g.choose_element(gid, 0, chunk, C))  # element 0 is in leaf 0, the chunk is leaf 1
    assert e.name == "ElementNotInChunk" and e.fields == {"element": 0, "leafIndex": 1}
    g.choose_element(gid, 130, chunk, C)
    v = g.game(gid)
    assert v.phase == Phase.L4_START and v.element == 130
    desc = liar.desc(2, 1)
    honest_final = honest.micro_state(2, 1, 130, 5)
    e = revert(lambda: g.reveal_final_state(gid, desc, honest_final, D))  # the true final state: wrong value
    assert e.name == "FinalValueMismatch"
    assert revert(lambda: g.reveal_final_state(gid, desc + b"\x00", honest_final, D)).name == "DescriptorMismatch"
    assert env.advance_to(gid, liar, honest, True, Phase.L4_STEP)
    v = g.game(gid)
    assert v.lo == 2  # the fault is at state 3
    wrong_pre = honest.micro_state(2, 1, 130, 1)
    assert revert(lambda: g.step(gid, desc, wrong_pre, b"", C)).name == "StateMismatch"
    g.step(gid, desc, honest.micro_state(2, 1, 130, 2), b"", C)  # the challenger steps itself
    assert g.game(gid).winner == C


@pytest.mark.chain
def test_single_step_single_node_single_element(env: Env) -> None:
    """T = 1, one node, one element, N = 1: every level is entered at its end."""
    job = ToyJob(1, default_graph(1, (1,), (1,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 1, 0, 0, 1))
    gid = env.create(job, liar.step_commitment(1), 16)
    assert env.client.game(gid).phase == Phase.L2_REVEAL
    out = env.play(gid, liar, honest)
    env.expect(gid, out, env.challenger, Resolution.STEP)
    assert out.total_moves("defender") == 4 and out.total_moves("challenger") == 1  # reveal, chunk, final, step


@pytest.mark.chain
def test_history_reconstructs_the_game(env: Env) -> None:
    """A bot restarting mid-game rebuilds the last claims from the event log."""
    job = ToyJob(16, default_graph(3, NUMELS, (4,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 9, 2, 7, 2))
    gid = env.create(job, liar.step_commitment(16), 4)
    assert env.advance_to(gid, liar, honest, True, Phase.L2_CHOOSE)
    names = [n for n, _ in env.client.history(gid)]
    assert names[0] == "GameCreated" and names.count("Bisected") == 2 and names[-1] == "SubtreeRevealed"
    seen = runner.seen_from_history(env.client, gid)
    move = pl.Challenger(honest).move(env.client.game(gid), seen)
    assert isinstance(move, pl.Choose) and move.choice == 2  # node 2 is the first that differs


@pytest.mark.chain
@pytest.mark.parametrize(
    "change, error",
    [
        ({"sources": ((SourceKind.NODE_OUTPUT, 1),)}, "SourceNotEarlier"),
        ({"sources": ((SourceKind.BATCH, 5),)}, "BatchIndexOutOfRange"),
        ({"numel": 0}, "EmptyOutput"),
    ],
    ids=["forward-reference", "batch-index", "empty-output"],
)
def test_malformed_graph_node_cannot_be_justified(env: Env, change: dict[str, Any], error: str) -> None:
    """A node the client's graph wires impossibly cannot be revealed: its defender loses on time.
    (Trainers must check the graph before staking; docs/protocol.md.)"""
    nodes = default_graph(2, (5,), (3,))
    nodes[1] = replace(nodes[1], **change)
    job = ToyJob(1, nodes)
    honest = ToyWorld(job)
    gid = env.create(job, honest.step_commitment(1), 2)
    out = env.play(gid, honest, honest)  # the challenger finds no difference and takes the last node
    assert out.reverts == [error]
    env.expect(gid, out, env.challenger, Resolution.TIMEOUT)



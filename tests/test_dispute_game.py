"""DisputeGame with the toy stepper: honest vs dishonest games at every level, timeouts, turn
order, binding invariants, and the Python twins (rules, ToyStepper)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verde_chain.chain.anvil import increase_time
from verde_chain.chain.errors import decode_revert
from verde_chain.chain.game import DisputeGameClient, GameParams, InputKind, Phase, Resolution
from verde_chain.chain.tx import call, transact
from verde_chain.commit.merkle import keccak256
from verde_chain.commit.tensor import LEAF_ELEMS
from verde_chain.errors import ContractRevert
from verde_chain.game import players as pl
from verde_chain.game import rules, runner, toy
from verde_chain.game.toy import Fault, ToyJob, ToyWorld, default_graph

CLOCK = 3600
NUMELS = (1, 129, 300)  # 1, 2 and 3 output leaves (3: a padding leaf in the output tree)
MICRO = (0, 1, 7, 20)  # N = 0 (empty program), 1 (direct step), small and larger traces


# -- pure Python: rules and the toy machine ---------------------------------------------------------


@given(lo=st.integers(0, 1000), length=st.integers(1, 5000), logk=st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_split_points_cover_the_interval(lo: int, length: int, logk: int) -> None:
    k = 1 << logk
    hi = lo + length
    if length == 1:
        assert rules.bisection_rounds(length, k) == 0
        return
    p = rules.split_points(lo, hi, k)
    assert p[0] == lo and p[-1] == hi and len(p) == min(k, length) + 1
    assert all(a < b for a, b in pairwise(p))  # strictly increasing: no empty sub-interval
    assert max(b - a for a, b in pairwise(p)) == -(-length // min(k, length))


@given(lo=st.integers(0, 1000), length=st.integers(2, 5000), logk=st.integers(1, 8), ckpt=st.integers(1, 400))
@settings(max_examples=300, deadline=None)
def test_checkpoint_split_points(lo: int, length: int, logk: int, ckpt: int) -> None:
    """While (lo, hi) holds a multiple of N, every inner split point is one (evenly chosen among
    them); inside one checkpoint span the split is the plain even one. N = 1 is the even split."""
    k, hi = 1 << logk, lo + length
    p = rules.split_points(lo, hi, k, ckpt)
    inner = [m for m in range(lo + 1, hi) if m % ckpt == 0]
    assert p[0] == lo and p[-1] == hi and all(a < b for a, b in pairwise(p))
    if inner:
        assert all(x % ckpt == 0 for x in p[1:-1]) and len(p) == min(k, len(inner) + 1) + 1
        grid = [lo, *inner, hi]  # the chosen points are spread evenly over the checkpoint grid
        q = [grid.index(x) for x in p]
        assert max(b - a for a, b in pairwise(q)) - min(b - a for a, b in pairwise(q)) <= 1
    else:
        assert p == rules.split_points(lo, hi, k)
    assert rules.split_points(lo, hi, k, 1) == rules.split_points(lo, hi, k)


@given(length=st.integers(1, 3000), logk=st.integers(1, 5), seed=st.integers(0, 2**32), ckpt=st.integers(1, 300))
@settings(max_examples=150, deadline=None)
def test_bisection_rounds_is_the_worst_case(length: int, logk: int, seed: int, ckpt: int) -> None:
    k, rng = 1 << logk, random.Random(seed)
    for grid in (1, ckpt):
        lo, hi, rounds = 0, length, 0
        while hi - lo > 1:
            lo, hi = rules.narrow(lo, hi, k, rng.randrange(rules.parts(lo, hi, k, grid)), grid)
            rounds += 1
        assert rounds <= rules.step_rounds(length, k, grid)
    assert rules.step_rounds(length, k, 1) == rules.bisection_rounds(length, k)


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


# -- differential: rules.py vs lib/Bisection.sol ------------------------------------------------------


@pytest.fixture(scope="module")
def bisection(_session_w3, artifacts):  # type: ignore[no-untyped-def]
    from verde_chain.chain.deploy import deploy_contract

    return deploy_contract(_session_w3, artifacts, "BisectionHarness")


@pytest.mark.chain
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), lo=st.integers(0, 2**40), length=st.integers(2, 10**6), logk=st.integers(1, 8),
       ckpt=st.one_of(st.just(1), st.integers(1, 10**5)))
def test_bisection_twin(  # type: ignore[no-untyped-def]
    bisection, artifacts, data: st.DataObject, lo: int, length: int, logk: int, ckpt: int
) -> None:
    k, hi = 1 << logk, lo + length
    f = bisection.functions
    points = rules.split_points(lo, hi, k, ckpt)
    assert call(f.splitPoints(lo, hi, k, ckpt), artifacts) == points
    claims = [keccak256(p.to_bytes(32, "big")) for p in points[1:-1]]
    c_lo, c_hi = b"\x0a" * 32, b"\x0b" * 32
    choice = data.draw(st.integers(0, len(points) - 2))
    new_lo, new_hi = rules.narrow(lo, hi, k, choice, ckpt)
    ends = [c_lo, *claims, c_hi]
    assert call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims, choice), artifacts) == [
        new_lo, new_hi, ends[choice], ends[choice + 1]]
    e = _revert(lambda: call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims, len(points) - 1), artifacts))
    assert e.error == "ChoiceOutOfRange"
    e = _revert(lambda: call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims + [c_lo], 0), artifacts))
    assert e.error == "WrongClaimCount" and e.args_ == {"actual": len(claims) + 1, "expected": len(claims)}
    depth = data.draw(st.integers(0, 20))
    m = rules.descent_levels(k, depth)
    assert call(f.descentLevels(k, depth), artifacts) == m
    m = min(m, 4)
    children = [keccak256(bytes([i])) for i in range(1 << m)]
    node = rules.fold(children)
    assert call(f.checkSubtree(node, children, m), artifacts) is True
    e = _revert(lambda: call(f.checkSubtree(node, children[::-1], m), artifacts)) if m else None
    assert e is None or (e.error == "SubtreeMismatch" and e.args_["expected"] == node)


# -- chain fixtures ------------------------------------------------------------------------------------


@dataclass(repr=False)
class Env:
    w3: Any
    artifacts: Any
    client: DisputeGameClient
    stepper: Any
    resolver: Any
    defender: str
    challenger: str

    def create(self, job: ToyJob, final: bytes, k: int = 4, clock: int = CLOCK, ckpt: int = 1) -> int:
        p = GameParams(self.defender, self.challenger, ToyWorld(job).step_commitment(0), final, job.num_steps,
                       job.graph_root, job.batch_root, k, clock, job.num_nodes, ckpt)
        return self.client.create_game_via(self.resolver, p)

    def create_for(self, job: Any, final: bytes, k: int = 4, clock: int = CLOCK) -> int:
        """Create a game for any job with graph_root/batch_root/num_steps/num_nodes and a C_0."""
        from verde_chain.game.kernel_world import KernelWorld

        p = GameParams(self.defender, self.challenger, KernelWorld(job).step_commitment(0), final, job.num_steps,
                       job.graph_root, job.batch_root, k, clock, job.num_nodes)
        return self.client.create_game_via(self.resolver, p)

    def play(self, gid: int, dworld: Any, cworld: Any, dstrat: str = "consistent", cstrat: str = "consistent",
             seed: int = 0) -> runner.Outcome:
        return runner.play(self.client, gid, pl.Defender(dworld, dstrat, seed), pl.Challenger(cworld, cstrat, seed),
                           lambda s: increase_time(self.w3, s))

    def callbacks(self, gid: int) -> list[tuple[str, str, str]]:
        return [tuple(c) for c in call(self.resolver.functions.callbacks(gid), self.artifacts)]

    def expect(self, gid: int, out: runner.Outcome, winner: str, resolution: Resolution | None = None) -> None:
        loser = self.challenger if winner == self.defender else self.defender
        assert out.winner == winner, (out.resolution, out.reverts)
        if resolution is not None:
            assert out.resolution == resolution
        # the resolver was called back exactly once, by the game, with the right parties
        assert self.callbacks(gid) == [(self.client.contract.address, winner, loser)]


@pytest.fixture
def env(w3, deploy, artifacts) -> Env:  # type: ignore[no-untyped-def]
    stepper = deploy("ToyStepper")
    game = deploy("DisputeGame", stepper.address)
    resolver = deploy("ResolverMock")
    return Env(w3, artifacts, DisputeGameClient(w3, game, artifacts), stepper, resolver,
               w3.eth.accounts[1], w3.eth.accounts[2])


def _bound(job: ToyJob, k: int, ckpt: int = 1) -> rules.MoveBound:
    leaves = max(-(-n.numel // LEAF_ELEMS) for n in job.nodes)
    micro = max(max(n.micro_steps for n in job.nodes), 1)
    return rules.move_bound(job.num_steps, job.num_nodes, leaves, micro, k, ckpt)


def _within_bound(out: runner.Outcome, job: ToyJob, k: int, ckpt: int = 1) -> None:
    b = _bound(job, k, ckpt)
    # +1: the winner of a timeout game also sends claimTimeout
    assert out.total_moves("defender") <= b.defender + 1
    assert out.total_moves("challenger") <= b.challenger + 1


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
    assert err.value.error == "ToyBadState"


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
    _within_bound(out, job, k, ckpt)


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
    _within_bound(out, job, k, ckpt)


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
    _within_bound(out, job, 2)


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
    _within_bound(out, job, k)
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
    _within_bound(out, job, 4)


@pytest.mark.chain
def test_copied_claims_challenger(env: Env) -> None:
    """Two honest players: whatever the challenger picks, the defender wins."""
    job = ToyJob(9, default_graph(3, NUMELS, (4,)))
    honest = ToyWorld(job)
    gid = env.create(job, honest.step_commitment(9), 2)
    out = env.play(gid, honest, honest)
    env.expect(gid, out, env.defender)
    _within_bound(out, job, 2)


# -- timeouts at every level, for each party -----------------------------------------------------------

ALL_PHASES = [p for p in Phase if p not in (Phase.NONE, Phase.RESOLVED)]


def _advance_to(env: Env, gid: int, liar: ToyWorld, honest: ToyWorld, lying_defender: bool, target: Phase) -> bool:
    """Play until the game reaches `target`; False if this game never passes through it."""
    dworld, cworld = (liar, honest) if lying_defender else (honest, liar)
    d, c = pl.Defender(dworld), pl.Challenger(cworld)
    seen = pl.Seen()
    for _ in range(200):
        v = env.client.game(gid)
        if v.phase == target:
            return True
        if v.phase == Phase.RESOLVED:
            return False
        player = d if v.phase.mover.name == "DEFENDER" else c
        sender = v.defender if player is d else v.challenger
        move = player.move(v, seen)
        assert move is not None
        got = runner.apply(env.client, gid, move, sender, v.phase.level)
        seen = got or seen
    raise AssertionError("game too long")


@pytest.mark.chain
@pytest.mark.parametrize("lying_defender", [True, False], ids=["liar-defends", "liar-challenges"])
@pytest.mark.parametrize("phase", ALL_PHASES, ids=[p.name for p in ALL_PHASES])
def test_timeout_at_every_phase(env: Env, chain: Any, phase: Phase, lying_defender: bool) -> None:
    job = ToyJob(9, default_graph(5, (300,), (6,)))
    fault = Fault("micro", 5, 3, 200, 4)
    liar, honest = ToyWorld(job, fault), ToyWorld(job)
    final = (liar if lying_defender else honest).step_commitment(9)
    gid = env.create(job, final, 2)
    assert _advance_to(env, gid, liar, honest, lying_defender, phase)
    v = env.client.game(gid)
    late, other = (v.defender, v.challenger) if v.phase.mover.name == "DEFENDER" else (v.challenger, v.defender)
    left = v.defender_left if late == v.defender else v.challenger_left
    # not yet: the party to move still has time
    with pytest.raises(ContractRevert) as err:
        env.client.claim_timeout(gid, other)
    assert err.value.error == "ClockNotExpired"
    chain.increase_time(left + 1)
    # too late to move now
    move = (pl.Defender(liar if lying_defender else honest) if late == v.defender
            else pl.Challenger(honest if lying_defender else liar)).move(v, _seen_for(env, gid))
    if move is not None:
        with pytest.raises(ContractRevert) as err:
            runner.apply(env.client, gid, move, late, v.phase.level)
        assert err.value.error == "ClockExpired"
    env.client.claim_timeout(gid, env.w3.eth.accounts[5])  # anyone may claim
    out_view = env.client.game(gid)
    assert out_view.winner == other and out_view.resolution == Resolution.TIMEOUT
    assert env.callbacks(gid) == [(env.client.contract.address, other, late)]


def _seen_for(env: Env, gid: int) -> pl.Seen:
    return runner.seen_from_history(env.client, gid)


# -- turn order, replays, resolution -----------------------------------------------------------------


def _revert(fn: Any) -> ContractRevert:
    with pytest.raises(ContractRevert) as err:
        fn()
    return err.value


@pytest.mark.chain
def test_turn_order_replays_and_double_resolution(env: Env) -> None:
    job = ToyJob(20, default_graph(3, NUMELS, (4,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 11, 1, 3, 2))
    gid = env.create(job, liar.step_commitment(20), 4)
    g = env.client
    D, C = env.defender, env.challenger
    claims = [liar.step_commitment(p) for p in rules.split_points(0, 20, 4)[1:-1]]
    # out of turn: the challenger cannot post, the defender cannot choose yet
    e = _revert(lambda: g.post_claims(gid, claims, C))
    assert e.error == "NotYourTurn" and e.args_ == {"gameId": gid, "caller": C, "expected": D}
    assert _revert(lambda: g.choose(gid, 0, claims, C)).error == "WrongPhase"
    assert _revert(lambda: g.post_claims(gid, claims[:-1], D)).args_ == {"actual": 2, "expected": 3}
    g.post_claims(gid, claims, D)
    # replay of the same post
    assert _revert(lambda: g.post_claims(gid, claims, D)).error == "WrongPhase"
    # forged / stale claim vectors and choices out of range
    forged = [keccak256(b"x")] + claims[1:]
    assert _revert(lambda: g.choose(gid, 0, forged, C)).error == "ClaimsMismatch"
    e = _revert(lambda: g.choose(gid, 4, claims, C))
    assert e.error == "ChoiceOutOfRange" and e.args_ == {"choice": 4, "count": 4}
    g.choose(gid, 2, claims, C)  # [10, 15]
    assert _revert(lambda: g.choose(gid, 2, claims, C)).error == "WrongPhase"  # replayed choice
    v = g.game(gid)
    assert (v.lo, v.hi, v.phase) == (10, 15, Phase.L1_POST)
    stale = [liar.step_commitment(p) for p in rules.split_points(10, 15, 4)[1:-1]]
    g.post_claims(gid, stale, D)
    assert _revert(lambda: g.choose(gid, 0, claims, C)).error == "ClaimsMismatch"  # last round's vector
    # unknown game
    e = _revert(lambda: g.post_claims(99, claims, D))
    assert e.error == "UnknownGame" and e.args_ == {"gameId": 99}
    assert _revert(lambda: g.claim_timeout(99, D)).error == "UnknownGame"
    # finish the game, then nothing moves any more
    out = env.play(gid, liar, honest)
    env.expect(gid, out, C, Resolution.STEP)
    for attempt in (lambda: g.claim_timeout(gid, C), lambda: g.post_claims(gid, claims, D),
                    lambda: g.step(gid, b"", b"", b"", D)):
        e = _revert(attempt)
        assert e.error == "GameAlreadyResolved" and e.args_ == {"gameId": gid, "winner": C}
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
        assert _revert(lambda p=p: env.client.create_game_via(env.resolver, p)).error == name
    # an EOA cannot be a resolver (the callback would revert every final move)
    e = _revert(lambda: transact(env.w3, env.client.contract.functions.createGame(base.as_tuple()), env.artifacts,
                                 sender=env.w3.eth.accounts[3]))
    assert e.error == "ResolverNotContract"
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
    assert decode_revert(env.artifacts, bytes(data)).error == "GameAlreadyResolved"


# -- binding checks at L3/L4 with hand-made bad moves ---------------------------------------------------


@pytest.mark.chain
def test_bad_reveals_are_rejected(env: Env) -> None:
    job = ToyJob(2, default_graph(2, (300,), (5,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 2, 1, 130, 3))
    gid = env.create(job, liar.step_commitment(2), 2)
    g, D, C = env.client, env.defender, env.challenger
    assert _advance_to(env, gid, liar, honest, True, Phase.L2_REVEAL)
    v = g.game(gid)
    good = liar.node_reveal(v.step, v.cursor)
    bad_count = replace(good, input_proofs=good.input_proofs[:-1])
    assert _revert(lambda: g.reveal_node(gid, bad_count, D)).error == "InputCountMismatch"
    p0 = good.input_proofs[0]
    two_out = replace(p0, node=replace(p0.node, output_roots=p0.node.output_roots * 2))
    e = _revert(lambda: g.reveal_node(gid, replace(good, input_proofs=(two_out,) + good.input_proofs[1:]), D))
    assert e.error == "BadOutputCount" and e.args_ == {"count": 2}
    assert _revert(lambda: g.reveal_node(gid, replace(good, output_root=b"\x07" * 32), D)).error == "NodeMismatch"
    assert _advance_to(env, gid, liar, honest, True, Phase.L3_CHUNK)
    v = g.game(gid)
    chunk = liar.output_chunk(v.step, v.node_index, v.cursor)
    assert _revert(lambda: g.reveal_chunk(gid, chunk[:-4], D)).error == "BadChunkLength"
    assert _revert(lambda: g.reveal_chunk(gid, bytes(512), D)).error == "ChunkMismatch"
    g.reveal_chunk(gid, chunk, D)
    e = _revert(lambda: g.choose_element(gid, 0, chunk, C))  # element 0 is in leaf 0, the chunk is leaf 1
    assert e.error == "ElementNotInChunk" and e.args_ == {"element": 0, "leafIndex": 1}
    g.choose_element(gid, 130, chunk, C)
    v = g.game(gid)
    assert v.phase == Phase.L4_START and v.element == 130
    desc = liar.desc(2, 1)
    honest_final = honest.micro_state(2, 1, 130, 5)
    e = _revert(lambda: g.reveal_final_state(gid, desc, honest_final, D))  # the true final state: wrong value
    assert e.error == "FinalValueMismatch"
    assert _revert(lambda: g.reveal_final_state(gid, desc + b"\x00", honest_final, D)).error == "DescriptorMismatch"
    assert _advance_to(env, gid, liar, honest, True, Phase.L4_STEP)
    v = g.game(gid)
    assert v.lo == 2  # the fault is at state 3
    wrong_pre = honest.micro_state(2, 1, 130, 1)
    assert _revert(lambda: g.step(gid, desc, wrong_pre, b"", C)).error == "StateMismatch"
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
    assert _advance_to(env, gid, liar, honest, True, Phase.L2_CHOOSE)
    names = [n for n, _ in env.client.history(gid)]
    assert names[0] == "GameCreated" and names.count("Bisected") == 2 and names[-1] == "SubtreeRevealed"
    seen = _seen_for(env, gid)
    move = pl.Challenger(honest).move(env.client.game(gid), seen)
    assert isinstance(move, pl.Choose) and move.choice == 2  # node 2 is the first that differs


@pytest.mark.chain
@pytest.mark.parametrize(
    "change, error",
    [
        ({"sources": ((InputKind.NODE_OUTPUT, 1),)}, "SourceNotEarlier"),
        ({"sources": ((InputKind.BATCH, 5),)}, "BatchIndexOutOfRange"),
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


# -- with the real one-step prover (ScalarVM) over real RepOps kernels ------------------------------------


@pytest.mark.chain
@pytest.mark.parametrize("seed", range(3))
def test_games_refereed_by_scalar_vm(w3, deploy, artifacts, seed: int) -> None:  # type: ignore[no-untyped-def]
    from verde_chain.game.kernel_world import KernelJob, KernelWorld

    vm_stepper = deploy("ScalarVM")
    game = deploy("DisputeGame", vm_stepper.address)
    env = Env(w3, artifacts, DisputeGameClient(w3, game, artifacts), vm_stepper, deploy("ResolverMock"),
              w3.eth.accounts[1], w3.eth.accounts[2])
    rng = random.Random(seed)
    job = KernelJob(3, seed=seed)
    honest = KernelWorld(job)
    d = rng.randrange(job.num_nodes)
    desc = job.nodes[d][0]
    fault = Fault("micro", 3, d, rng.randrange(desc.numel), rng.randrange(1, desc.num_steps + 1))
    liar = KernelWorld(job, fault)
    if liar.step_commitment(3) == honest.step_commitment(3):  # the flipped register was dead
        fault = replace(fault, micro=desc.num_steps)
        liar = KernelWorld(job, fault)
    assert liar.step_commitment(3) != honest.step_commitment(3)
    # lying defender vs honest challenger: narrowed to the faulty instruction, the VM convicts it
    gid = env.create_for(job, liar.step_commitment(3), 2)
    out = env.play(gid, liar, honest)
    env.expect(gid, out, env.challenger, Resolution.STEP)
    assert out.final is not None and (out.final.node_index, out.final.element) == (fault.node, fault.element)
    assert out.final.lo == fault.micro - 1
    # honest defender vs lying (random-choosing) challenger
    gid = env.create_for(job, honest.step_commitment(3), 4)
    out = env.play(gid, honest, liar, cstrat="random", seed=seed)
    env.expect(gid, out, env.defender)


# -- the referee's L2 decision: Python twin (referee.py) vs NodeCheck.sol ---------------------------------


def _name(fn: Any) -> str | None:
    from verde_chain.errors import CommitmentError
    from verde_chain.game.referee import GameRuleError

    try:
        fn()
    except (GameRuleError, CommitmentError, ContractRevert) as err:
        return err.error if isinstance(err, ContractRevert) else err.name
    return None


@pytest.mark.chain
@pytest.mark.parametrize("node", [0, 2, 3])  # sources: (batch, prev) / (node, prev, batch) / (node, prev, node)
def test_referee_twin_on_tampered_reveals(env: Env, node: int) -> None:
    from verde_chain.game.referee import check_node

    job = ToyJob(5, default_graph(5, NUMELS, (3, 5)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 4, node, 0, 1))
    gid = env.create(job, liar.step_commitment(5), 2)
    assert _advance_to(env, gid, liar, honest, True, Phase.L2_REVEAL)
    v = env.client.game(gid)
    assert (v.step, v.cursor) == (4, node)
    good = liar.node_reveal(v.step, v.cursor)

    def flip(b: bytes) -> bytes:
        return bytes([b[0] ^ 1]) + b[1:]

    def with_proof(i: int, p: Any) -> Any:
        return replace(good, input_proofs=good.input_proofs[:i] + (p,) + good.input_proofs[i + 1:])

    cases = {
        "output root": replace(good, output_root=flip(good.output_root)),
        "desc": replace(good, desc=good.desc + b"\x00"),
        "graph sibling": replace(good, graph_proof=(flip(good.graph_proof[0]),) + good.graph_proof[1:]),
        "graph proof length": replace(good, graph_proof=good.graph_proof[:-1]),
        "sources": replace(good, sources=good.sources[::-1]),
        "missing proof": replace(good, input_proofs=good.input_proofs[:-1]),
    }
    for i, p in enumerate(good.input_proofs):
        cases[f"input {i} sibling"] = with_proof(i, replace(p, proof=(flip(p.proof[0]),) + p.proof[1:]))
        if p.batch_roots:
            roots = (flip(p.batch_roots[0]),) + p.batch_roots[1:]
            cases[f"input {i} batch"] = with_proof(i, replace(p, batch_roots=roots))
        else:
            two = replace(p.node, output_roots=p.node.output_roots * 2)
            cases[f"input {i} outputs"] = with_proof(i, replace(p, node=two))
            other = replace(p.node, desc_hash=flip(p.node.desc_hash))
            cases[f"input {i} preimage"] = with_proof(i, replace(p, node=other))
    seen_names = set()
    for label, bad in cases.items():
        py = _name(lambda bad=bad: check_node(v, node, bad))
        sol = _name(lambda bad=bad: env.client.reveal_node(gid, bad, env.defender))
        assert py == sol and py is not None, (label, py, sol)
        seen_names.add(py)
    assert {"NodeMismatch", "InvalidProof", "BadProofLength", "InputCountMismatch", "BadOutputCount"} <= seen_names
    assert check_node(v, node, good) == keccak256(good.desc)
    env.client.reveal_node(gid, good, env.defender)
    assert env.client.game(gid).phase in (Phase.L3_POST, Phase.L3_CHUNK)


@pytest.mark.chain
def test_referee_twin_on_unjustified_input(env: Env) -> None:
    from verde_chain.game.referee import check_node

    job = ToyJob(5, default_graph(5, NUMELS, (3,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("input", 3, 2))
    gid = env.create(job, liar.step_commitment(5), 4)
    assert _advance_to(env, gid, liar, honest, True, Phase.L2_REVEAL)
    v = env.client.game(gid)
    bad = liar.node_reveal(v.step, v.cursor)
    py = _name(lambda: check_node(v, v.cursor, bad))
    sol = _name(lambda: env.client.reveal_node(gid, bad, env.defender))
    assert py == sol == "InputNotJustified"

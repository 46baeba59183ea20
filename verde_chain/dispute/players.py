"""Honest and dishonest players: given the on-chain game view and a World, compute the next move.

A player is honest or lying through its World (a faulty World makes consistent lies), and
well-behaved or not through its style of play (``PlayStyle``):

  defender     consistent  post everything from its World (honest if the World is)
               garbage     random claims at the bisection levels (L1, L4)
               copy        repeat claimLo as every bisection claim
               stall       never move (loses on time)
  challenger   consistent  agree with the left end, choose the first disagreement
               random      uniformly random choices
               stall       never move

A move is a small dataclass of ``verde_chain.dispute.types``; ``runner.apply`` sends it through
the chain client.
"""

from __future__ import annotations

import enum
import random

from verde_chain.commit.merkle import keccak256
from verde_chain.commit.tensor import LEAF_ELEMS
from verde_chain.dispute import bisection
from verde_chain.dispute.types import (
    Choose,
    ChooseElement,
    GameView,
    Move,
    Phase,
    PostClaims,
    RevealChunk,
    RevealFinal,
    RevealNode,
    Seen,
    Step,
)
from verde_chain.dispute.world import World
from verde_chain.errors import VerdeError


class PlayStyle(enum.StrEnum):
    """How a player plays (the table above); each player takes the styles listed for it."""

    CONSISTENT = "consistent"
    GARBAGE = "garbage"
    COPY = "copy"
    STALL = "stall"
    RANDOM = "random"


DEFENDER_STYLES = frozenset({PlayStyle.CONSISTENT, PlayStyle.GARBAGE, PlayStyle.COPY, PlayStyle.STALL})
CHALLENGER_STYLES = frozenset({PlayStyle.CONSISTENT, PlayStyle.RANDOM, PlayStyle.STALL})


class PlayStyleError(VerdeError):
    """A player was given a style it does not play."""


def _style(style: PlayStyle | str, allowed: frozenset[PlayStyle], role: str) -> PlayStyle:
    if style not in allowed:
        raise PlayStyleError(f"a {role} plays {', '.join(sorted(allowed))}, not {style!r}")
    return PlayStyle(style)


def _layer(levels: list[list[bytes]], cursor: int, depth_left: int, m: int) -> list[bytes]:
    """The 2**m nodes m levels below node `cursor`, which sits depth_left levels above the leaves."""
    level = levels[depth_left - m]
    return level[cursor << m : (cursor << m) + (1 << m)]


def _micro_ctx(v: GameView) -> tuple[int, int, int]:
    return v.step, v.node_index, v.element


class Defender:
    def __init__(self, world: World, strategy: PlayStyle | str = PlayStyle.CONSISTENT, seed: int = 0) -> None:
        self.world = world
        self.strategy = _style(strategy, DEFENDER_STYLES, "defender")
        self.rng = random.Random(seed)

    def move(self, v: GameView, seen: Seen) -> Move | None:
        w = self.world
        if self.strategy == PlayStyle.STALL:
            return None
        if v.phase in (Phase.L1_POST, Phase.L4_POST):
            points = bisection.split_points(v.lo, v.hi, v.arity, v.grid)[1:-1]
            if self.strategy == PlayStyle.GARBAGE:
                return PostClaims(tuple(self.rng.randbytes(32) for _ in points))
            if self.strategy == PlayStyle.COPY:
                return PostClaims(tuple(v.claim_lo for _ in points))
            if v.phase == Phase.L1_POST:
                return PostClaims(tuple(w.step_commitment(p) for p in points))
            s, d, e = _micro_ctx(v)
            return PostClaims(tuple(keccak256(w.micro_state(s, d, e, p)) for p in points))
        if v.phase in (Phase.L2_POST, Phase.L3_POST):
            m = bisection.descent_levels(v.arity, v.depth_left)
            levels = w.node_levels(v.step) if v.phase == Phase.L2_POST else w.output_levels(v.step, v.node_index)
            if self.strategy == PlayStyle.GARBAGE:
                return PostClaims(tuple(self.rng.randbytes(32) for _ in range(1 << m)))
            return PostClaims(tuple(_layer(levels, v.cursor, v.depth_left, m)))
        if v.phase == Phase.L2_REVEAL:
            return RevealNode(w.node_reveal(v.step, v.cursor))
        if v.phase == Phase.L3_CHUNK:
            return RevealChunk(w.output_chunk(v.step, v.node_index, v.cursor))
        if v.phase == Phase.L4_START:
            s, d, e = _micro_ctx(v)
            return RevealFinal(w.desc(s, d), w.micro_state(s, d, e, w.micro_steps(s, d)))
        if v.phase == Phase.L4_STEP:
            return step_move(w, v)
        raise AssertionError(f"not the defender's phase: {v.phase!r}")


def step_move(w: World, v: GameView) -> Step | None:
    """The one-step move from this World, if its state j is the agreed one (else it cannot step)."""
    s, d, e = _micro_ctx(v)
    pre = w.micro_state(s, d, e, v.lo)
    if keccak256(pre) != v.claim_lo:
        return None
    return Step(w.desc(s, d), pre, w.step_proof(s, d, e, v.lo))


class Challenger:
    def __init__(self, world: World, strategy: PlayStyle | str = PlayStyle.CONSISTENT, seed: int = 0) -> None:
        self.world = world
        self.strategy = _style(strategy, CHALLENGER_STYLES, "challenger")
        self.rng = random.Random(seed)

    def _pick(self, posted: list[bytes], own: list[bytes]) -> int:
        """First position where the posted value differs from ours (last one if none does)."""
        if self.strategy == PlayStyle.RANDOM:
            return self.rng.randrange(len(posted))
        for i, (a, b) in enumerate(zip(posted, own)):
            if a != b:
                return i
        return len(posted) - 1

    def move(self, v: GameView, seen: Seen) -> Move | None:
        w = self.world
        if self.strategy == PlayStyle.STALL:
            return None
        if v.phase in (Phase.L1_CHOOSE, Phase.L4_CHOOSE):
            points = bisection.split_points(v.lo, v.hi, v.arity, v.grid)[1:]
            posted = list(seen.claims) + [v.claim_hi]  # right ends of the sub-intervals
            if v.phase == Phase.L1_CHOOSE:
                own = [w.step_commitment(p) for p in points]
            else:
                s, d, e = _micro_ctx(v)
                own = [keccak256(w.micro_state(s, d, e, p)) for p in points]
            return Choose(self._pick(posted, own), seen.claims)
        if v.phase in (Phase.L2_CHOOSE, Phase.L3_CHOOSE):
            # depth_left already refers to the round's parent: the children are m levels down.
            m = len(seen.claims).bit_length() - 1
            levels = w.node_levels(v.step) if v.phase == Phase.L2_CHOOSE else w.output_levels(v.step, v.node_index)
            own = _layer(levels, v.cursor, v.depth_left, m)
            return Choose(self._pick(list(seen.claims), own), seen.claims)
        if v.phase == Phase.L3_ELEMENT:
            first = v.cursor * LEAF_ELEMS
            if self.strategy == PlayStyle.RANDOM:
                return ChooseElement(first + self.rng.randrange(LEAF_ELEMS), seen.chunk)
            mine = w.output_chunk(v.step, v.node_index, v.cursor)
            for i in range(LEAF_ELEMS):
                if seen.chunk[4 * i : 4 * i + 4] != mine[4 * i : 4 * i + 4]:
                    return ChooseElement(first + i, seen.chunk)
            return ChooseElement(first, seen.chunk)
        raise AssertionError(f"not the challenger's phase: {v.phase!r}")


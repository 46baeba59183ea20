"""Python twin of ``contracts/dispute/GameTypes.sol``, and the moves ``DisputeGame.sol`` accepts.

Pure data: the players, worlds and the referee's twin (``nodecheck``) build and read these; the
web3 client (``verde_chain.chain.dispute_client``) encodes them as the contract's ABI tuples.
Enum numbers are the Solidity ones. An input's source kind is ``SourceKind``
(``verde_chain.graph.structure``); ``NodeReveal.sources`` carries it as ``(int(kind), index)``,
the ABI form of ``InputSource``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


class Side(enum.IntEnum):
    DEFENDER = 0
    CHALLENGER = 1


class Phase(enum.IntEnum):
    """Mirror of GameTypes.Phase (same numbers)."""

    NONE = 0
    L1_POST = 1
    L1_CHOOSE = 2
    L2_POST = 3
    L2_CHOOSE = 4
    L2_REVEAL = 5
    L3_POST = 6
    L3_CHOOSE = 7
    L3_CHUNK = 8
    L3_ELEMENT = 9
    L4_START = 10
    L4_POST = 11
    L4_CHOOSE = 12
    L4_STEP = 13
    RESOLVED = 14

    @property
    def level(self) -> int:
        if self <= Phase.L1_CHOOSE:
            return 1
        if self <= Phase.L2_REVEAL:
            return 2
        if self <= Phase.L3_ELEMENT:
            return 3
        return 4

    @property
    def mover(self) -> Side:
        if self in (Phase.L1_CHOOSE, Phase.L2_CHOOSE, Phase.L3_CHOOSE, Phase.L3_ELEMENT, Phase.L4_CHOOSE):
            return Side.CHALLENGER
        return Side.DEFENDER


class Resolution(enum.IntEnum):
    STEP = 0
    TIMEOUT = 1
    PADDING = 2
    EMPTY_PROGRAM = 3


@dataclass(frozen=True)
class GameParams:
    defender: str
    challenger: str
    initial_commitment: bytes
    final_commitment: bytes
    num_steps: int
    graph_root: bytes
    batch_root: bytes
    arity: int
    clock_seconds: int
    num_nodes: int
    checkpoint_interval: int = 1  # 1: level 1 splits evenly (every step is a checkpoint)

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            self.defender, self.challenger, self.initial_commitment, self.final_commitment, self.num_steps,
            self.graph_root, self.batch_root, self.arity, self.clock_seconds, self.num_nodes, self.checkpoint_interval,
        )


@dataclass(frozen=True)
class NodePreimage:
    desc_hash: bytes
    input_roots: tuple[bytes, ...]
    output_roots: tuple[bytes, ...]

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.desc_hash, list(self.input_roots), list(self.output_roots))


EMPTY_PREIMAGE = NodePreimage(b"\x00" * 32, (), ())


@dataclass(frozen=True)
class InputProof:
    node: NodePreimage = EMPTY_PREIMAGE
    batch_roots: tuple[bytes, ...] = ()
    proof: tuple[bytes, ...] = ()

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.node.as_tuple(), list(self.batch_roots), list(self.proof))


@dataclass(frozen=True)
class NodeReveal:
    desc: bytes
    input_roots: tuple[bytes, ...]
    output_root: bytes
    sources: tuple[tuple[int, int], ...]  # (SourceKind, index)
    graph_proof: tuple[bytes, ...]
    input_proofs: tuple[InputProof, ...]

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            self.desc, list(self.input_roots), self.output_root, [tuple(s) for s in self.sources],
            list(self.graph_proof), [p.as_tuple() for p in self.input_proofs],
        )


@dataclass(frozen=True)
class GameView:
    """Decoded ``getGame`` (field names follow GameTypes.Game)."""

    defender: str
    challenger: str
    resolver: str
    phase: Phase
    arity: int
    num_nodes: int
    num_steps: int
    checkpoint_interval: int
    initial_commitment: bytes
    final_commitment: bytes
    graph_root: bytes
    batch_root: bytes
    defender_left: int
    challenger_left: int
    turn_started_at: int
    lo: int
    hi: int
    claim_lo: bytes
    claim_hi: bytes
    pending: bytes
    cursor: int
    depth_left: int
    node: bytes
    step: int
    agreed_state: bytes
    disputed_state: bytes
    node_index: int
    desc_hash: bytes
    output_root: bytes
    output_numel: int
    micro_steps: int
    input_roots: tuple[bytes, ...]
    element: int
    value: int
    winner: str
    resolution: Resolution

    @classmethod
    def from_tuple(cls, t: Sequence[Any]) -> GameView:
        (d, c, r, ph, k, nn, ns, ck, c0, ct, gr, br, clock, lo, hi, clo, chi, pend, cur, dl, node, st, ag, ds, ni,
         dh, orr, on, ms, ir, el, val, win, res) = t
        return cls(
            d, c, r, Phase(ph), k, nn, ns, ck, bytes(c0), bytes(ct), bytes(gr), bytes(br), clock[0], clock[1], clock[2],
            lo, hi, bytes(clo), bytes(chi), bytes(pend), cur, dl, bytes(node), st, bytes(ag), bytes(ds), ni,
            bytes(dh), bytes(orr), on, ms, tuple(bytes(x) for x in ir), el, val, win, Resolution(res),
        )

    @property
    def grid(self) -> int:
        """The checkpoint interval of the running bisection level (L1: the job's; L4: 1)."""
        return self.checkpoint_interval if self.phase.level == 1 else 1

    @property
    def expires_at(self) -> int:
        """When the running turn's clock runs out (a timeout can be claimed in any later block)."""
        return self.turn_started_at + (self.defender_left if self.phase.mover == Side.DEFENDER else self.challenger_left)

    @property
    def to_move(self) -> str | None:
        if self.phase in (Phase.NONE, Phase.RESOLVED):
            return None
        return self.defender if self.phase.mover == Side.DEFENDER else self.challenger


# -- moves ------------------------------------------------------------------------------------------
# One dataclass per DisputeGame transaction a player makes: ``function`` is the contract function,
# ``args()`` its arguments after the game id. The web3 client and the bots' crash-safe sender both
# send a move through these two, so no caller dispatches on the move's type.


@dataclass(frozen=True)
class PostClaims:
    """L1/L4 split-point claims, or the L2/L3 subtree layer below the cursor."""

    claims: tuple[bytes, ...]
    function: ClassVar[str] = "postClaims"

    def args(self) -> tuple[Any, ...]:
        return (list(self.claims),)


@dataclass(frozen=True)
class Choose:
    choice: int
    claims: tuple[bytes, ...]
    function: ClassVar[str] = "choose"

    def args(self) -> tuple[Any, ...]:
        return (self.choice, list(self.claims))


@dataclass(frozen=True)
class RevealNode:
    reveal: NodeReveal
    function: ClassVar[str] = "revealNode"

    def args(self) -> tuple[Any, ...]:
        return (self.reveal.as_tuple(),)


@dataclass(frozen=True)
class RevealChunk:
    chunk: bytes
    function: ClassVar[str] = "revealChunk"

    def args(self) -> tuple[Any, ...]:
        return (self.chunk,)


@dataclass(frozen=True)
class ChooseElement:
    element: int
    chunk: bytes
    function: ClassVar[str] = "chooseElement"

    def args(self) -> tuple[Any, ...]:
        return (self.element, self.chunk)


@dataclass(frozen=True)
class RevealFinal:
    desc: bytes
    state: bytes
    function: ClassVar[str] = "revealFinalState"

    def args(self) -> tuple[Any, ...]:
        return (self.desc, self.state)


@dataclass(frozen=True)
class Step:
    desc: bytes
    pre_state: bytes
    proof: bytes
    function: ClassVar[str] = "step"

    def args(self) -> tuple[Any, ...]:
        return (self.desc, self.pre_state, self.proof)


Move = PostClaims | Choose | RevealNode | RevealChunk | ChooseElement | RevealFinal | Step


@dataclass(frozen=True)
class Seen:
    """What a player has read from the game's events: the last posted claims and chunk."""

    claims: tuple[bytes, ...] = ()
    chunk: bytes = b""

    def after(self, events: Iterable[tuple[str, Mapping[str, Any]]]) -> Seen:
        """This view updated by DisputeGame events ``(name, args)`` in log order."""
        seen = self
        for name, args in events:
            if name == "Bisected":
                seen = Seen(tuple(bytes(c) for c in args["claims"]), seen.chunk)
            elif name == "SubtreeRevealed":
                seen = Seen(tuple(bytes(c) for c in args["nodes"]), seen.chunk)
            elif name == "ElementRevealed":
                seen = Seen(seen.claims, bytes(args["chunk"]))
        return seen

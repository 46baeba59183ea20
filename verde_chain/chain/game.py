"""Typed client of ``contracts/DisputeGame.sol``: every move, every view, every event.

Reverts come back as ``verde_chain.errors.ContractRevert`` carrying the custom error's name and
arguments (see ``contracts/DisputeErrors.sol``). Every transaction is logged in ``moves`` with its
sender, function, level and gas so games can be measured (scripts/bench_dispute.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from web3 import Web3
from web3.contract import Contract
from web3.types import TxReceipt

from verde_chain.chain.compile import Artifact
from verde_chain.chain.tx import call, transact
from verde_chain.errors import ChainError


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


class InputKind(enum.IntEnum):
    NODE_OUTPUT = 0
    PREV_STEP_NODE_OUTPUT = 1
    BATCH = 2


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
    sources: tuple[tuple[int, int], ...]  # (InputKind, index)
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
    def to_move(self) -> str | None:
        if self.phase in (Phase.NONE, Phase.RESOLVED):
            return None
        return self.defender if self.phase.mover == Side.DEFENDER else self.challenger


@dataclass
class MoveRecord:
    sender: str
    function: str
    level: int
    gas: int
    game_id: int = 0


EVENT_NAMES = (
    "GameCreated", "Bisected", "SubtreeRevealed", "Chosen", "NodeRevealed", "ElementRevealed", "ElementChosen",
    "FinalStateRevealed", "Stepped", "Resolved",
)


@dataclass
class DisputeGameClient:
    """Wraps a deployed DisputeGame. ``moves`` logs every successful transaction sent through it."""

    w3: Web3
    contract: Contract
    artifacts: Mapping[str, Artifact]
    moves: list[MoveRecord] = field(default_factory=list)

    # -- transactions -----------------------------------------------------------------------------

    def _send(self, fn: str, args: Sequence[Any], sender: str, level: int) -> TxReceipt:
        receipt = transact(self.w3, getattr(self.contract.functions, fn)(*args), self.artifacts, sender=sender)
        self.moves.append(MoveRecord(sender, fn, level, int(receipt["gasUsed"]), int(args[0])))
        return receipt

    def create_game_via(self, resolver: Contract, params: GameParams, sender: str | None = None) -> int:
        """Create a game through a resolver contract (ResolverMock.createGame(game, params))."""
        receipt = transact(
            self.w3, resolver.functions.createGame(self.contract.address, params.as_tuple()), self.artifacts,
            sender=sender,
        )
        for ev in self.contract.events.GameCreated().process_receipt(receipt):
            return int(ev["args"]["gameId"])
        raise ChainError("createGame emitted no GameCreated event")

    def post_claims(self, game_id: int, claims: Sequence[bytes], sender: str, level: int = 0) -> TxReceipt:
        return self._send("postClaims", [game_id, list(claims)], sender, level)

    def choose(self, game_id: int, choice: int, claims: Sequence[bytes], sender: str, level: int = 0) -> TxReceipt:
        return self._send("choose", [game_id, choice, list(claims)], sender, level)

    def reveal_node(self, game_id: int, reveal: NodeReveal, sender: str) -> TxReceipt:
        return self._send("revealNode", [game_id, reveal.as_tuple()], sender, 2)

    def reveal_chunk(self, game_id: int, chunk: bytes, sender: str) -> TxReceipt:
        return self._send("revealChunk", [game_id, chunk], sender, 3)

    def choose_element(self, game_id: int, element: int, chunk: bytes, sender: str) -> TxReceipt:
        return self._send("chooseElement", [game_id, element, chunk], sender, 3)

    def reveal_final_state(self, game_id: int, desc: bytes, final_state: bytes, sender: str) -> TxReceipt:
        return self._send("revealFinalState", [game_id, desc, final_state], sender, 4)

    def step(self, game_id: int, desc: bytes, pre_state: bytes, proof: bytes, sender: str) -> TxReceipt:
        return self._send("step", [game_id, desc, pre_state, proof], sender, 4)

    def claim_timeout(self, game_id: int, sender: str) -> TxReceipt:
        return self._send("claimTimeout", [game_id], sender, 0)

    # -- views ------------------------------------------------------------------------------------

    def game(self, game_id: int) -> GameView:
        return GameView.from_tuple(call(self.contract.functions.getGame(game_id), self.artifacts))

    def turn(self, game_id: int) -> str:
        return str(call(self.contract.functions.turn(game_id), self.artifacts))

    def game_count(self) -> int:
        return int(call(self.contract.functions.gameCount(), self.artifacts))

    # -- events -----------------------------------------------------------------------------------

    def events(self, receipt: TxReceipt) -> list[tuple[str, dict[str, Any]]]:
        """Every DisputeGame event in a receipt, in log order, as (name, args)."""
        out: list[tuple[int, str, dict[str, Any]]] = []
        for name in EVENT_NAMES:
            for ev in getattr(self.contract.events, name)().process_receipt(receipt, errors=_DISCARD):
                out.append((int(ev["logIndex"]), name, dict(ev["args"])))
        return [(n, a) for _, n, a in sorted(out, key=lambda x: x[0])]

    def history(self, game_id: int, from_block: int = 0) -> list[tuple[str, dict[str, Any]]]:
        """All events of one game from the chain's logs (what a bot that restarts would read)."""
        out: list[tuple[int, int, str, dict[str, Any]]] = []
        for name in EVENT_NAMES:
            for ev in getattr(self.contract.events, name)().get_logs(
                from_block=from_block, argument_filters={"gameId": game_id}
            ):
                out.append((int(ev["blockNumber"]), int(ev["logIndex"]), name, dict(ev["args"])))
        return [(n, a) for _, _, n, a in sorted(out, key=lambda x: (x[0], x[1]))]


def _discard() -> Any:
    from web3.logs import DISCARD

    return DISCARD


_DISCARD = _discard()

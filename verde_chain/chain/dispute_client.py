"""Typed web3 client of ``contracts/dispute/DisputeGame.sol``: every move, every view, every event.

The data it sends and reads are the pure types of ``verde_chain.dispute.types``. Reverts come back
as ``verde_chain.errors.ContractRevert`` carrying the custom error's name and fields (see
``contracts/dispute/DisputeErrors.sol``). Every transaction is logged in ``moves`` with its
sender, function, level and gas so games can be measured (scripts/bench_dispute.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from web3 import Web3
from web3.contract import Contract
from web3.types import TxReceipt

from verde_chain.chain.compile import Artifact
from verde_chain.chain.tx import call, transact
from verde_chain.dispute.types import (
    Choose,
    ChooseElement,
    GameParams,
    GameView,
    Move,
    NodeReveal,
    PostClaims,
    RevealChunk,
    RevealFinal,
    RevealNode,
    Step,
)
from verde_chain.errors import ChainError


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

    def move_call(self, game_id: int, move: Move) -> Any:
        """The contract call that makes ``move`` in game ``game_id`` (not sent)."""
        return getattr(self.contract.functions, move.function)(game_id, *move.args())

    def send_move(self, game_id: int, move: Move, sender: str, level: int) -> TxReceipt:
        return self._send(move.function, [game_id, *move.args()], sender, level)

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
        return self.send_move(game_id, PostClaims(tuple(claims)), sender, level)

    def choose(self, game_id: int, choice: int, claims: Sequence[bytes], sender: str, level: int = 0) -> TxReceipt:
        return self.send_move(game_id, Choose(choice, tuple(claims)), sender, level)

    def reveal_node(self, game_id: int, reveal: NodeReveal, sender: str) -> TxReceipt:
        return self.send_move(game_id, RevealNode(reveal), sender, 2)

    def reveal_chunk(self, game_id: int, chunk: bytes, sender: str) -> TxReceipt:
        return self.send_move(game_id, RevealChunk(chunk), sender, 3)

    def choose_element(self, game_id: int, element: int, chunk: bytes, sender: str) -> TxReceipt:
        return self.send_move(game_id, ChooseElement(element, chunk), sender, 3)

    def reveal_final_state(self, game_id: int, desc: bytes, final_state: bytes, sender: str) -> TxReceipt:
        return self.send_move(game_id, RevealFinal(desc, final_state), sender, 4)

    def step(self, game_id: int, desc: bytes, pre_state: bytes, proof: bytes, sender: str) -> TxReceipt:
        return self.send_move(game_id, Step(desc, pre_state, proof), sender, 4)

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

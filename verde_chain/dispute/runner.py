"""Drive one game on chain between two players until it is resolved.

The runner reads the game state, asks the player to move, sends the move and reads back the
posted claims / revealed chunk from the move's events (as a bot following the chain would).
A player that does not move (stalls, or its move reverts: it cannot justify its claim) is
waited out: the runner lets its clock run out and the other party claims the timeout. In the
one-step phase the challenger steps itself if the defender does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.dispute import players as pl
from verde_chain.dispute.types import GameView, Move, Phase, Resolution, Seen, Side
from verde_chain.errors import ContractRevert


@dataclass
class Outcome:
    winner: str
    resolution: Resolution
    moves: Counter[tuple[str, int]] = field(default_factory=Counter)  # (party, level) -> moves
    gas: Counter[tuple[str, int]] = field(default_factory=Counter)  # (party, level) -> gas
    reverts: list[str] = field(default_factory=list)  # names of the errors players' moves hit
    final: GameView | None = None

    def total_moves(self, party: str) -> int:
        return sum(n for (p, _), n in self.moves.items() if p == party)

    def total_gas(self, party: str | None = None) -> int:
        return sum(g for (p, _), g in self.gas.items() if party is None or p == party)


def apply(client: DisputeGameClient, game_id: int, move: Move, sender: str, level: int,
          seen: Seen | None = None) -> Seen:
    """Send `move`; return `seen` updated by what its events revealed (claims or chunk)."""
    receipt = client.send_move(game_id, move, sender, level)
    return (seen or Seen()).after(client.events(receipt))


def seen_from_history(client: DisputeGameClient, game_id: int, from_block: int = 0) -> Seen:
    """Rebuild what a player needs from the game's event log (last claims, last chunk), so a
    bot that starts or restarts mid-game can continue."""
    return Seen().after(client.history(game_id, from_block))


def play(
    client: DisputeGameClient,
    game_id: int,
    defender: pl.Defender,
    challenger: pl.Challenger,
    advance_time: Callable[[int], None],
    max_moves: int = 400,
) -> Outcome:
    seen = seen_from_history(client, game_id)
    moves: Counter[tuple[str, int]] = Counter()
    gas: Counter[tuple[str, int]] = Counter()
    reverts: list[str] = []
    start = len(client.moves)
    for _ in range(max_moves):
        v = client.game(game_id)
        if v.phase == Phase.RESOLVED:
            break
        side = v.phase.mover
        party = "defender" if side == Side.DEFENDER else "challenger"
        player: pl.Defender | pl.Challenger = defender if side == Side.DEFENDER else challenger
        sender = v.defender if side == Side.DEFENDER else v.challenger
        move = player.move(v, seen)
        if move is None and v.phase == Phase.L4_STEP:
            # The defender does not step: the challenger may (anyone may execute the step).
            alt = pl.step_move(challenger.world, v)
            if alt is not None and challenger.strategy != pl.PlayStyle.STALL:
                move, sender = alt, v.challenger
        moved = False
        if move is not None:
            try:
                seen = apply(client, game_id, move, sender, v.phase.level, seen)
                moved = True
            except ContractRevert as err:
                reverts.append(err.name)
        if not moved:
            # Wait out the stalled party's clock; the other side claims the timeout.
            left = v.defender_left if side == Side.DEFENDER else v.challenger_left
            advance_time(left + 1)
            other = v.challenger if side == Side.DEFENDER else v.defender
            client.claim_timeout(game_id, other)
    else:
        raise AssertionError(f"game {game_id} not resolved after {max_moves} moves")
    v = client.game(game_id)
    for rec in client.moves[start:]:
        party = "defender" if rec.sender == v.defender else "challenger"
        moves[(party, rec.level)] += 1
        gas[(party, rec.level)] += rec.gas
    return Outcome(v.winner, v.resolution, moves, gas, reverts, v)

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

from verde_chain.chain.game import DisputeGameClient, GameView, Phase, Resolution, Side
from verde_chain.errors import ContractRevert
from verde_chain.game import players as pl


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


def apply(client: DisputeGameClient, game_id: int, move: pl.Move, sender: str, level: int) -> pl.Seen | None:
    """Send `move`; return what its events revealed (claims or chunk) for the other player."""
    if isinstance(move, pl.PostClaims):
        client.post_claims(game_id, move.claims, sender, level)
        return pl.Seen(claims=move.claims)
    if isinstance(move, pl.Choose):
        client.choose(game_id, move.choice, move.claims, sender, level)
    elif isinstance(move, pl.RevealNode):
        client.reveal_node(game_id, move.reveal, sender)
    elif isinstance(move, pl.RevealChunk):
        receipt = client.reveal_chunk(game_id, move.chunk, sender)
        ((_, args),) = [e for e in client.events(receipt) if e[0] == "ElementRevealed"]
        return pl.Seen(chunk=bytes(args["chunk"]))
    elif isinstance(move, pl.ChooseElement):
        client.choose_element(game_id, move.element, move.chunk, sender)
    elif isinstance(move, pl.RevealFinal):
        client.reveal_final_state(game_id, move.desc, move.state, sender)
    elif isinstance(move, pl.Step):
        client.step(game_id, move.desc, move.pre_state, move.proof, sender)
    return None


def seen_from_history(client: DisputeGameClient, game_id: int) -> pl.Seen:
    """Rebuild what a player needs from the game's event log (last claims, last chunk), so a
    bot that starts or restarts mid-game can continue."""
    seen = pl.Seen()
    for name, args in client.history(game_id):
        if name == "Bisected":
            seen = pl.Seen(claims=tuple(bytes(c) for c in args["claims"]), chunk=seen.chunk)
        elif name == "SubtreeRevealed":
            seen = pl.Seen(claims=tuple(bytes(c) for c in args["nodes"]), chunk=seen.chunk)
        elif name == "ElementRevealed":
            seen = pl.Seen(claims=seen.claims, chunk=bytes(args["chunk"]))
    return seen


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
            if alt is not None and challenger.strategy != "stall":
                move, sender = alt, v.challenger
        moved = False
        if move is not None:
            try:
                got = apply(client, game_id, move, sender, v.phase.level)
                moved = True
                if got is not None:
                    seen = got
            except ContractRevert as err:
                reverts.append(err.error)
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

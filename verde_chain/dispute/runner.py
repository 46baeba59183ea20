"""Drive games on chain between players until they are resolved.

The runner reads the game state, asks the player to move, sends the move and reads back the
posted claims / revealed chunk from the move's events (as a bot following the chain would).
A player that does not move (stalls, or its move reverts: it cannot justify its claim) is
waited out: the runner lets its clock run out and the other party claims the timeout. In the
one-step phase the challenger steps itself if the defender does not.

``play`` drives one game; ``play_many`` drives several at once, one move per game per round (as a
defender facing many disputes plays them all concurrently): time only jumps when no game can
move, and then only to the earliest clock that runs out, so a party that always answers never
has its clock charged for the other games' waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
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


@dataclass
class _Match:
    """One game being played: its players and what they have seen so far."""

    game_id: int
    defender: pl.Defender
    challenger: pl.Challenger
    seen: Seen
    reverts: list[str] = field(default_factory=list)


def _turn(client: DisputeGameClient, m: _Match) -> tuple[bool, GameView]:
    """Let the party to move in `m` move; (whether a move was made, the view before it)."""
    v = client.game(m.game_id)
    if v.phase == Phase.RESOLVED:
        return False, v
    side = v.phase.mover
    player: pl.Defender | pl.Challenger = m.defender if side == Side.DEFENDER else m.challenger
    sender = v.defender if side == Side.DEFENDER else v.challenger
    move = player.move(v, m.seen)
    if move is None and v.phase == Phase.L4_STEP:
        # The defender does not step: the challenger may (anyone may execute the step).
        alt = pl.step_move(m.challenger.world, v)
        if alt is not None and m.challenger.strategy != pl.PlayStyle.STALL:
            move, sender = alt, v.challenger
    if move is None:
        return False, v
    try:
        m.seen = apply(client, m.game_id, move, sender, v.phase.level, m.seen)
    except ContractRevert as err:
        m.reverts.append(err.name)
        return False, v
    return True, v


def _outcome(client: DisputeGameClient, m: _Match, start: int) -> Outcome:
    """The game's result and the moves sent through `client` for it since `start`."""
    v = client.game(m.game_id)
    moves: Counter[tuple[str, int]] = Counter()
    gas: Counter[tuple[str, int]] = Counter()
    for rec in client.moves[start:]:
        if rec.game_id != m.game_id:
            continue
        party = "defender" if rec.sender == v.defender else "challenger"
        moves[(party, rec.level)] += 1
        gas[(party, rec.level)] += rec.gas
    return Outcome(v.winner, v.resolution, moves, gas, m.reverts, v)


def play(
    client: DisputeGameClient,
    game_id: int,
    defender: pl.Defender,
    challenger: pl.Challenger,
    advance_time: Callable[[int], None],
    max_moves: int = 400,
) -> Outcome:
    return play_many(client, [(game_id, defender, challenger)], advance_time, max_moves)[game_id]


def play_many(
    client: DisputeGameClient,
    games: Sequence[tuple[int, pl.Defender, pl.Challenger]],
    advance_time: Callable[[int], None],
    max_rounds: int = 400,
    on_resolved: Callable[[int], None] | None = None,
) -> dict[int, Outcome]:
    """Play every game to its resolution, round by round (one move per game and round); calls
    `on_resolved(game_id)` once each game is seen resolved."""
    matches = [_Match(gid, d, c, seen_from_history(client, gid)) for gid, d, c in games]
    live = list(matches)
    start = len(client.moves)

    def done(m: _Match) -> None:
        live.remove(m)
        if on_resolved is not None:
            on_resolved(m.game_id)

    for _ in range(max_rounds):
        if not live:
            break
        stalled: list[tuple[_Match, GameView]] = []
        for m in list(live):
            moved, v = _turn(client, m)
            if v.phase == Phase.RESOLVED:
                done(m)
            elif not moved:
                stalled.append((m, v))
        if live and len(stalled) == len(live):
            # Nobody can move: wait out the earliest stalled clock; the other side claims the timeout.
            due = min(v.expires_at for _, v in stalled)
            now = int(client.w3.eth.get_block("latest")["timestamp"])
            advance_time(max(0, due - now) + 1)
            for m, v in stalled:
                if v.expires_at <= due:
                    client.claim_timeout(m.game_id, v.challenger if v.phase.mover == Side.DEFENDER else v.defender)
                    done(m)
    if live:
        raise AssertionError(f"games {[m.game_id for m in live]} not resolved after {max_rounds} rounds")
    return {m.game_id: _outcome(client, m, start) for m in matches}

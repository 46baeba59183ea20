"""Python twin of ``contracts/dispute/Clock.sol``: a chess clock for the two parties of a game.

Only the clock of the party to move runs; a party whose running turn has taken more than it has
left has lost (a move exactly at the last second, elapsed == left, is still on time)::

  t0 ---- defender thinks ---- t1 ---- challenger thinks ---- t2 ...
          defender_left -= t1-t0        challenger_left -= t2-t1
"""

from __future__ import annotations

from dataclasses import dataclass

from verde_chain.dispute.types import Side
from verde_chain.errors import CustomError


@dataclass
class ChessClockModel:
    """Twin of GameTypes.ChessClock with Clock.sol's rules (times in seconds, ``now`` given)."""

    defender_left: int
    challenger_left: int
    turn_started_at: int

    def left(self, side: Side) -> int:
        return self.defender_left if side == Side.DEFENDER else self.challenger_left

    def expired(self, side: Side, now: int) -> bool:
        return now - self.turn_started_at > self.left(side)

    def charge(self, side: Side, now: int) -> None:
        """Clock.charge: end ``side``'s turn at ``now`` (raises ClockExpired if it ran out)."""
        used, have = now - self.turn_started_at, self.left(side)
        if used > have:
            raise CustomError("ClockExpired", side=int(side), elapsed=used, left=have)
        if side == Side.DEFENDER:
            self.defender_left = have - used
        else:
            self.challenger_left = have - used
        self.turn_started_at = now

    def require_expired(self, side: Side, now: int) -> None:
        """Clock.requireExpired: the condition to claim a timeout against ``side``."""
        used, have = now - self.turn_started_at, self.left(side)
        if used <= have:
            raise CustomError("ClockNotExpired", side=int(side), elapsed=used, left=have)

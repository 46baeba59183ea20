// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ChessClock, Side} from "./GameTypes.sol";
import {ClockExpired, ClockNotExpired} from "./DisputeErrors.sol";

/// @title Clock — a chess clock for two parties (twin: verde_chain/dispute/clock.py)
/// @notice Each party starts with the same budget. Only the clock of the party to move runs:
///
///   t0 ---- defender thinks ---- t1 ---- challenger thinks ---- t2 ...
///           defenderLeft -= t1-t0        challengerLeft -= t2-t1
///
/// A party whose running time exceeds what it has left has lost: its moves revert with
/// ClockExpired and anyone can claim the timeout. A move made exactly at the last second
/// (elapsed == left) is still on time.
library Clock {
    function start(ChessClock storage c, uint64 budget) internal {
        c.defenderLeft = budget;
        c.challengerLeft = budget;
        c.turnStartedAt = uint64(block.timestamp);
    }

    /// @notice Seconds the running turn has taken so far.
    function elapsed(ChessClock storage c) internal view returns (uint256) {
        return block.timestamp - c.turnStartedAt;
    }

    function left(ChessClock storage c, Side side) internal view returns (uint256) {
        return side == Side.Defender ? c.defenderLeft : c.challengerLeft;
    }

    function expired(ChessClock storage c, Side side) internal view returns (bool) {
        return elapsed(c) > left(c, side);
    }

    /// @notice End the running turn of `side`: charge it the elapsed time and start the next turn.
    function charge(ChessClock storage c, Side side) internal {
        uint256 used = elapsed(c);
        uint256 have = left(c, side);
        // INVARIANT: a party cannot move after its time is up; without this a stalled party
        // could still move after the other side was entitled to claim the timeout.
        if (used > have) revert ClockExpired(uint8(side), used, have);
        uint64 rest = uint64(have - used);
        if (side == Side.Defender) c.defenderLeft = rest;
        else c.challengerLeft = rest;
        c.turnStartedAt = uint64(block.timestamp);
    }

    /// @notice Revert unless `side`'s running time is over (the condition to claim a timeout).
    function requireExpired(ChessClock storage c, Side side) internal view {
        uint256 used = elapsed(c);
        uint256 have = left(c, side);
        if (used <= have) revert ClockNotExpired(uint8(side), used, have);
    }
}

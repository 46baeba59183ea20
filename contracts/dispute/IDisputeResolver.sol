// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title IDisputeResolver — who a resolved game reports to (the job market)
/// @notice The contract that creates a game is its resolver: DisputeGame calls it back exactly
///         once, as the very last thing of the move that resolves the game.
interface IDisputeResolver {
    /// @notice Game `gameId` is over. `winner` and `loser` are its defender and challenger in
    ///         some order. The resolver moves the loser's stake or bond to the winner.
    /// @dev Called after the game's state is final (checks-effects-interactions), so a resolver
    ///      that re-enters the game finds it resolved. If this call reverts, the resolving move
    ///      reverts too: a resolver must not revert for a game it created.
    function onDisputeResolved(uint256 gameId, address winner, address loser) external;
}

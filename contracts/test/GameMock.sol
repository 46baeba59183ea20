// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {GameParams} from "../dispute/GameTypes.sol";
import {IDisputeResolver} from "../dispute/IDisputeResolver.sol";

/// @notice A fake dispute game for JobMarket's defensive checks only: it can report outcomes the
///         real DisputeGame never would (strangers as winners, unknown or replayed game ids), so
///         tests can show the market refuses them (WrongParties, UnknownDispute). Every other
///         market test runs against the real DisputeGame with the ToyStepper.
contract GameMock {
    uint256 public gameCount;
    mapping(uint256 => GameParams) internal _games;
    mapping(uint256 => address) public resolverOf;

    function createGame(GameParams calldata p) external returns (uint256 gameId) {
        gameId = ++gameCount;
        _games[gameId] = p;
        resolverOf[gameId] = msg.sender;
    }

    /// @notice Make the next createGame hand out `next` again (a broken game reusing ids).
    function rewind(uint256 next) external {
        gameCount = next - 1;
    }

    function getGame(uint256 gameId) external view returns (GameParams memory) {
        return _games[gameId];
    }

    /// @notice The test decides: the defender wins if `defenderWins`, else the challenger.
    function resolve(uint256 gameId, bool defenderWins) external {
        GameParams storage p = _games[gameId];
        (address w, address l) = defenderWins ? (p.defender, p.challenger) : (p.challenger, p.defender);
        IDisputeResolver(resolverOf[gameId]).onDisputeResolved(gameId, w, l);
    }

    /// @notice Report arbitrary parties to `resolver` (for WrongParties / UnknownDispute tests).
    function resolveRaw(address resolver, uint256 gameId, address winner, address loser) external {
        IDisputeResolver(resolver).onDisputeResolved(gameId, winner, loser);
    }
}

// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IDisputeResolver} from "../dispute/IDisputeResolver.sol";
import {DisputeGame} from "../dispute/DisputeGame.sol";
import {GameParams} from "../dispute/GameTypes.sol";

/// @title ResolverMock — creates games and records resolution callbacks (game-only tests)
/// @notice With `reenter` set, the callback tries to resolve the game a second time through
///         claimTimeout and records the revert data (it must be GameAlreadyResolved).
contract ResolverMock is IDisputeResolver {
    struct Callback {
        address game;
        address winner;
        address loser;
    }

    mapping(uint256 gameId => Callback[]) internal _callbacks;
    bool public reenter;
    bytes public reentryRevert;

    event Callback_(uint256 indexed gameId, address game, address winner, address loser);

    function setReenter(bool on) external {
        reenter = on;
    }

    function createGame(DisputeGame game, GameParams calldata p) external returns (uint256) {
        return game.createGame(p);
    }

    /// @inheritdoc IDisputeResolver
    function onDisputeResolved(uint256 gameId, address winner, address loser) external {
        _callbacks[gameId].push(Callback(msg.sender, winner, loser));
        emit Callback_(gameId, msg.sender, winner, loser);
        if (reenter) {
            try DisputeGame(msg.sender).claimTimeout(gameId) {
                reentryRevert = hex"";
            } catch (bytes memory data) {
                reentryRevert = data;
            }
        }
    }

    function callbacks(uint256 gameId) external view returns (Callback[] memory) {
        return _callbacks[gameId];
    }
}

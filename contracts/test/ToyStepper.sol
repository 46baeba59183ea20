// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IStepper, StepContext} from "../vm/IStepper.sol";

/// A toy state must be (j, acc) with acc a 32-bit value and j the micro-step about to run.
error ToyBadState(uint256 j, uint256 acc, uint256 expectedJ);

/// @title ToyStepper — a trivial machine for dispute-game tests (twin: tests/support/toy.py)
/// @notice Like Optimism's AlphabetVM: states are tiny, steps are cheap, and the Python twin
///         computes every claim an honest player needs.
///
///   desc        = abi.encode(uint256 outputNumel, uint256 numSteps, uint256 opId)
///   state       = abi.encode(uint256 j, uint256 acc)        hash = keccak256(state)
///   acc_0       = (uint32(keccak256(abi.encode(descHash, inputRoots))) + e * 0x9E3779B9) mod 2^32
///   acc_{j+1}   = (acc_j * 1103515245 + 12345 + j) mod 2^32
///   value       = uint32(acc_N)
///
/// The step is a bijection in acc for fixed j (odd multiplier), so two traces that differ at one
/// state differ at every later state, as a real machine's traces usually do after a wrong result.
contract ToyStepper is IStepper {
    uint32 internal constant GOLDEN = 0x9E3779B9;
    uint32 internal constant MUL = 1103515245;
    uint32 internal constant INC = 12345;

    /// @inheritdoc IStepper
    function describe(bytes calldata desc) external pure returns (uint256 outputNumel, uint256 numSteps) {
        (outputNumel, numSteps,) = abi.decode(desc, (uint256, uint256, uint256));
    }

    /// @inheritdoc IStepper
    function initialStateHash(StepContext calldata ctx) external pure returns (bytes32) {
        return keccak256(abi.encode(uint256(0), uint256(initialAcc(ctx.descHash, ctx.inputRoots, ctx.element))));
    }

    /// @inheritdoc IStepper
    function step(StepContext calldata ctx, bytes calldata preState, bytes calldata)
        external
        pure
        returns (bytes32 postStateHash)
    {
        (uint256 j, uint256 acc) = abi.decode(preState, (uint256, uint256));
        if (j != ctx.microStep || acc > type(uint32).max) revert ToyBadState(j, acc, ctx.microStep);
        return keccak256(abi.encode(j + 1, uint256(next(uint32(acc), j))));
    }

    /// @inheritdoc IStepper
    function finalValue(bytes calldata statePreimage) external pure returns (bytes32 stateHash, uint32 value) {
        (uint256 j, uint256 acc) = abi.decode(statePreimage, (uint256, uint256));
        if (acc > type(uint32).max) revert ToyBadState(j, acc, j);
        return (keccak256(statePreimage), uint32(acc));
    }

    function initialAcc(bytes32 descHash, bytes32[] calldata inputRoots, uint256 element)
        public
        pure
        returns (uint32)
    {
        unchecked {
            uint32 base = uint32(uint256(keccak256(abi.encode(descHash, inputRoots))));
            return base + uint32(element) * GOLDEN;
        }
    }

    function next(uint32 acc, uint256 j) public pure returns (uint32) {
        unchecked {
            return acc * MUL + INC + uint32(j);
        }
    }
}

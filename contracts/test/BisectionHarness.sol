// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Bisection} from "../dispute/Bisection.sol";

/// @notice Exposes dispute/Bisection to its differential test (tests/dispute/test_bisection_twin.py).
contract BisectionHarness {
    function splitPoints(uint256 lo, uint256 hi, uint256 k, uint256 ckpt) external pure returns (uint256[] memory p) {
        uint256 n = Bisection.parts(lo, hi, k, ckpt);
        p = new uint256[](n + 1);
        for (uint256 i = 0; i <= n; ++i) {
            p[i] = Bisection.splitPoint(lo, hi, n, ckpt, i);
        }
    }

    function narrow(
        uint256 lo,
        uint256 hi,
        uint256 k,
        uint256 ckpt,
        bytes32 claimLo,
        bytes32 claimHi,
        bytes32[] calldata claims,
        uint256 choice
    ) external pure returns (uint256, uint256, bytes32, bytes32) {
        Bisection.checkClaimCount(lo, hi, k, ckpt, claims.length);
        return Bisection.narrow(lo, hi, k, ckpt, claimLo, claimHi, claims, choice);
    }

    function descentLevels(uint256 k, uint256 depthLeft) external pure returns (uint256) {
        return Bisection.descentLevels(k, depthLeft);
    }

    function checkSubtree(bytes32 node, bytes32[] calldata children, uint256 m) external pure returns (bool) {
        Bisection.checkSubtree(node, children, m);
        return true;
    }
}

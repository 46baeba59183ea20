// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {WrongClaimCount, ChoiceOutOfRange, SubtreeMismatch} from "./DisputeErrors.sol";

/// @title Bisection — k-ary interval bisection and k-ary Merkle descent (twin: verde_chain/dispute/bisection.py)
/// @notice Interval bisection (levels L1 and L4) over states s_lo .. s_hi. The split points lie on
///         a grid of [lo, hi] fixed by the checkpoint interval N (L1: the job's interval; L4: 1):
///
///   checkpoint grid   while (lo, hi) holds a multiple of N, the grid is lo, the multiples of N
///                     strictly inside, hi:  g_0 = lo, g_1 = a*N, ..., g_M = b*N, g_{M+1} = hi
///                     (S = M + 1 segments); otherwise (inside one checkpoint span) every step:
///                     g_q = lo + q  (S = hi - lo segments). N = 1 is the plain even split.
///
///   n = min(k, S) parts, q_i = S * i / n, p_i = g_{q_i}:
///
///   p_0 = lo    p_1        p_2   ...   p_{n-1}     p_n = hi
///    |----------|----------|------ ... --|-----------|
///   claimLo   claims[0]  claims[1]    claims[n-2]  claimHi      (defender posts n - 1 claims)
///   choice i  -> new interval [p_i, p_{i+1}]  (challenger agrees with p_i, disagrees with p_{i+1})
///
///         So level 1 first narrows to one checkpoint span (claims a trainer has stored), then
///         bisects inside it: a full bisection re-executes about N steps, not a share of T.
///
///         Merkle descent (levels L2 and L3) walks down a positional tree (Merkle.sol layout)
///         from a node at depth t with index `cursor`, m = min(log2 k, depthLeft) levels at a time:
///
///                 node (cursor)                       the defender reveals the 2^m nodes
///           /      |      |      \                    m levels below; they must fold back to
///       c_0      c_1    ...    c_{2^m-1}              `node`; the challenger picks child i and
///                                                     the cursor becomes cursor * 2^m + i
library Bisection {
    /// @notice The grid of [lo, hi] (lo < hi) for checkpoint interval `ckpt` >= 1: its number of
    ///         segments S and the index a of its first interior multiple of `ckpt` (0 when no
    ///         multiple lies strictly inside and the grid is every step).
    function grid(uint256 lo, uint256 hi, uint256 ckpt) internal pure returns (uint256 segs, uint256 first) {
        uint256 a = lo / ckpt + 1; // smallest m with m * ckpt > lo
        uint256 b = (hi - 1) / ckpt; // largest m with m * ckpt < hi
        if (b >= a) return (b - a + 2, a);
        return (hi - lo, 0);
    }

    /// @notice Number of sub-intervals a bisection round of [lo, hi] uses.
    function parts(uint256 lo, uint256 hi, uint256 k, uint256 ckpt) internal pure returns (uint256) {
        (uint256 segs,) = grid(lo, hi, ckpt);
        return segs < k ? segs : k;
    }

    /// @notice Split point i (0 <= i <= n) of [lo, hi] with n parts on the checkpoint grid.
    function splitPoint(uint256 lo, uint256 hi, uint256 n, uint256 ckpt, uint256 i) internal pure returns (uint256) {
        (uint256 segs, uint256 first) = grid(lo, hi, ckpt);
        uint256 q = (segs * i) / n;
        if (q == 0) return lo;
        if (q == segs) return hi;
        return first == 0 ? lo + q : (first + q - 1) * ckpt;
    }

    /// @notice Check a posted claim vector has the n - 1 entries of an n-part round.
    function checkClaimCount(uint256 lo, uint256 hi, uint256 k, uint256 ckpt, uint256 count) internal pure {
        uint256 n = parts(lo, hi, k, ckpt);
        // SAFETY: a shorter vector would leave split points without a claim, a longer one
        // would let the challenger choose an index that is no sub-interval.
        if (count != n - 1) revert WrongClaimCount(count, n - 1);
    }

    /// @notice Narrow [lo, hi] to sub-interval `choice` and return its bounds and end claims.
    function narrow(
        uint256 lo,
        uint256 hi,
        uint256 k,
        uint256 ckpt,
        bytes32 claimLo,
        bytes32 claimHi,
        bytes32[] calldata claims,
        uint256 choice
    ) internal pure returns (uint256 newLo, uint256 newHi, bytes32 newClaimLo, bytes32 newClaimHi) {
        uint256 n = parts(lo, hi, k, ckpt);
        if (choice >= n) revert ChoiceOutOfRange(choice, n);
        newLo = splitPoint(lo, hi, n, ckpt, choice);
        newHi = splitPoint(lo, hi, n, ckpt, choice + 1);
        newClaimLo = choice == 0 ? claimLo : claims[choice - 1];
        newClaimHi = choice == n - 1 ? claimHi : claims[choice];
    }

    /// @notice Levels one descent round reveals: log2(k) or what is left of the tree.
    function descentLevels(uint256 k, uint256 depthLeft) internal pure returns (uint256 m) {
        uint256 logK = log2(k);
        m = logK < depthLeft ? logK : depthLeft;
    }

    /// @notice Check that `children` (2^m nodes, left to right) fold back to `node`.
    function checkSubtree(bytes32 node, bytes32[] calldata children, uint256 m) internal pure {
        uint256 width = uint256(1) << m;
        if (children.length != width) revert WrongClaimCount(children.length, width);
        bytes32[] memory level = children;
        while (width > 1) {
            width >>= 1;
            for (uint256 i = 0; i < width; ++i) {
                level[i] = keccak256(abi.encodePacked(level[2 * i], level[2 * i + 1]));
            }
        }
        // INVARIANT: the revealed layer is the tree committed by `node`; otherwise the defender
        // could swap in a different subtree than the one it committed to.
        if (level[0] != node) revert SubtreeMismatch(level[0], node);
    }

    /// @notice floor(log2(x)) for x >= 1.
    function log2(uint256 x) internal pure returns (uint256 r) {
        while (x > 1) {
            x >>= 1;
            unchecked {
                ++r;
            }
        }
    }
}

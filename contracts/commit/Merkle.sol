// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {EmptyTree, IndexOutOfRange, BadProofLength, InvalidProof} from "./CommitErrors.sol";

/// @title Merkle — positional keccak-256 binary Merkle trees (twin: verde_chain/commit/merkle.py)
/// @notice Layout:
///
///                          root
///                    /               \
///              H(n0 || n1)        H(n2 || n3)          H = keccak256 over the 64-byte pair
///              /      \           /       \
///           leaf0   leaf1      leaf2    ZERO           ZERO = bytes32(0) pads to a power of two
///
/// - Leaves are 32-byte values given by the caller (already hashes); they are not hashed again.
/// - Pairs are positional (left || right), never sorted, so a proof also proves the index.
/// - n >= 1 leaves give depth ceil(log2(n)); a one-leaf tree's root is the leaf itself.
/// - A proof lists siblings from the leaf upwards; its length must equal the depth.
/// Second preimages across levels are ruled out because the depth is fixed by the committed
/// size, so an internal node can never be presented as a leaf of the same tree.
library Merkle {
    /// @notice Depth of a tree with `size` leaves (ceil(log2(size))).
    function depth(uint256 size) internal pure returns (uint256 d) {
        // INVARIANT: an empty tree has no root; accepting it would let a claim commit to nothing.
        if (size == 0) revert EmptyTree();
        uint256 n = size - 1;
        while (n != 0) {
            n >>= 1;
            unchecked {
                ++d;
            }
        }
    }

    /// @notice Root that `proof` leads to from `leaf` at `index` in a tree of `size` leaves.
    function rootFromProof(bytes32 leaf, uint256 index, uint256 size, bytes32[] memory proof)
        internal
        pure
        returns (bytes32 node)
    {
        uint256 d = depth(size);
        // SAFETY: without the range check a proof for index i + 2^d would pass as index i.
        if (index >= size) revert IndexOutOfRange(index, size);
        // SAFETY: a shorter proof would open an internal node as if it were a leaf.
        if (proof.length != d) revert BadProofLength(proof.length, d);
        node = leaf;
        for (uint256 i = 0; i < d; ++i) {
            bytes32 sib = proof[i];
            assembly ("memory-safe") {
                switch and(shr(i, index), 1)
                case 0 {
                    mstore(0x00, node)
                    mstore(0x20, sib)
                }
                default {
                    mstore(0x00, sib)
                    mstore(0x20, node)
                }
                node := keccak256(0x00, 0x40)
            }
        }
    }

    /// @notice Revert with InvalidProof unless `proof` opens `leaf` at `index` under `root`.
    function verify(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] memory proof)
        internal
        pure
    {
        bytes32 got = rootFromProof(leaf, index, size, proof);
        if (got != root) revert InvalidProof(got, root);
    }

    /// @notice Root of a full list of leaves (for small lists built on-chain, e.g. in tests).
    function root(bytes32[] memory leaves) internal pure returns (bytes32) {
        uint256 d = depth(leaves.length);
        uint256 width = 1 << d;
        bytes32[] memory level = new bytes32[](width);
        for (uint256 i = 0; i < leaves.length; ++i) {
            level[i] = leaves[i];
        }
        while (width > 1) {
            width >>= 1;
            for (uint256 i = 0; i < width; ++i) {
                level[i] = keccak256(abi.encodePacked(level[2 * i], level[2 * i + 1]));
            }
        }
        return level[0];
    }
}

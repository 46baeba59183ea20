// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice Errors of the commitment layer (Merkle trees, tensor openings, node hashes).
/// @dev Twins: verde_chain.errors.CommitmentError with the same names.

/// A tree must have at least one leaf.
error EmptyTree();
/// The opened index is not below the tree's (or tensor's) size.
error IndexOutOfRange(uint256 index, uint256 size);
/// The proof does not have exactly `expected` siblings (the depth fixed by the size).
error BadProofLength(uint256 actual, uint256 expected);
/// The proof leads to `computed` instead of the committed root `expected`.
error InvalidProof(bytes32 computed, bytes32 expected);
/// A tensor leaf chunk must be exactly LEAF_BYTES long.
error BadChunkLength(uint256 actual, uint256 expected);

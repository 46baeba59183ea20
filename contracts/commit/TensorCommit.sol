// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "./Merkle.sol";
import {IndexOutOfRange, BadChunkLength} from "./CommitErrors.sol";

/// @title TensorCommit — tensor roots, element openings, node hashes (twin: verde_chain/commit/tensor.py)
/// @notice Tensor root layout (LEAF_ELEMS = 128 binary32 elements per leaf):
///
///   elements  e0 e1 ... e127 | e128 ... e255 | ... | e(128m) .. e(n-1) 0 0 0   (zero-padded)
///             \_____ 512 B _/ \____ 512 B __/        \______ 512 B ______/
///   leaves      keccak(chunk0)  keccak(chunk1)   ...   keccak(chunk m)
///   root        Merkle.root(leaves)  (positional, ZERO-padded to a power of two)
///
/// Each element is its 4-byte big-endian bit pattern, in flat row-major order. 128 elements
/// (512 bytes = 4 keccak blocks) per leaf keeps hashing near bulk keccak speed (one internal
/// hash per four leaf blocks) while an opening costs 512 bytes of calldata plus a proof of
/// depth ceil(log2(ceil(n/128))).
///
/// Node hash  = keccak256(abi.encode(uint256 index, bytes32 descHash, bytes32[] inputRoots,
///                                   bytes32[] outputRoots))
/// Step commitment C_s = Merkle.root(node hashes of step s, in the graph's topological order).
library TensorCommit {
    uint256 internal constant LEAF_ELEMS = 128;
    uint256 internal constant LEAF_BYTES = LEAF_ELEMS * 4;

    /// @notice Number of leaves of a tensor with `numel` elements.
    function leafCount(uint256 numel) internal pure returns (uint256) {
        return (numel + LEAF_ELEMS - 1) / LEAF_ELEMS;
    }

    /// @notice Verify that `chunk` is leaf `element / 128` of the tensor `root` and return the
    ///         element's bit pattern.
    function openElement(
        bytes32 root,
        uint256 numel,
        uint256 element,
        bytes memory chunk,
        bytes32[] memory proof
    ) internal pure returns (uint32 bits) {
        // SAFETY: padding elements beyond numel are not part of the tensor and must not be opened.
        if (element >= numel) revert IndexOutOfRange(element, numel);
        if (chunk.length != LEAF_BYTES) revert BadChunkLength(chunk.length, LEAF_BYTES);
        Merkle.verify(root, keccak256(chunk), element / LEAF_ELEMS, leafCount(numel), proof);
        uint256 off = (element % LEAF_ELEMS) * 4;
        assembly ("memory-safe") {
            bits := shr(224, mload(add(add(chunk, 32), off)))
        }
    }

    function nodeHash(uint256 index, bytes32 descHash, bytes32[] memory inputRoots, bytes32[] memory outputRoots)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(index, descHash, inputRoots, outputRoots));
    }
}

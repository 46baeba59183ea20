// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "../commit/Merkle.sol";
import {TensorCommit} from "../commit/TensorCommit.sol";

/// @notice Exposes the commitment libraries to differential tests and gas benchmarks.
contract MerkleHarness {
    function depth(uint256 size) external pure returns (uint256) {
        return Merkle.depth(size);
    }

    function rootFromProof(bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        external
        pure
        returns (bytes32)
    {
        return Merkle.rootFromProof(leaf, index, size, proof);
    }

    function verify(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        external
        pure
        returns (bool)
    {
        Merkle.verify(root, leaf, index, size, proof);
        return true;
    }

    function root(bytes32[] calldata leaves) external pure returns (bytes32) {
        return Merkle.root(leaves);
    }

    function openElement(bytes32 root_, uint256 numel, uint256 element, bytes calldata chunk, bytes32[] calldata proof)
        external
        pure
        returns (uint32)
    {
        return TensorCommit.openElement(root_, numel, element, chunk, proof);
    }

    /// @notice Gas benchmark: verify a batch of element openings in one call.
    function openElements(
        bytes32 root_,
        uint256 numel,
        uint256[] calldata elements,
        bytes[] calldata chunks,
        bytes32[][] calldata proofs
    ) external pure returns (uint32[] memory out) {
        out = new uint32[](elements.length);
        for (uint256 i = 0; i < elements.length; ++i) {
            out[i] = TensorCommit.openElement(root_, numel, elements[i], chunks[i], proofs[i]);
        }
    }

    function nodeHash(uint256 index, bytes32 descHash, bytes32[] calldata inputRoots, bytes32[] calldata outputRoots)
        external
        pure
        returns (bytes32)
    {
        return TensorCommit.nodeHash(index, descHash, inputRoots, outputRoots);
    }
}

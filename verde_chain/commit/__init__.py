"""Commitment layer: positional keccak Merkle trees, tensor roots, node hashes, step commitments."""

from verde_chain.commit.merkle import keccak256, merkle_proof, merkle_root, verify
from verde_chain.commit.tensor import (
    LEAF_ELEMS,
    ElementOpening,
    NodeOpening,
    list_commitment,
    node_hash,
    open_element,
    step_commitment,
    tensor_root,
    verify_element,
    verify_node_output,
)

__all__ = [
    "LEAF_ELEMS",
    "ElementOpening",
    "NodeOpening",
    "keccak256",
    "list_commitment",
    "merkle_proof",
    "merkle_root",
    "node_hash",
    "open_element",
    "step_commitment",
    "tensor_root",
    "verify",
    "verify_element",
    "verify_node_output",
]

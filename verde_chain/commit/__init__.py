"""Commitment layer: positional keccak Merkle trees, tensor roots, node hashes, step commitments."""

from verde_chain.commit.merkle import keccak256, merkle_proof, merkle_root, verify
from verde_chain.commit.tensor import (
    LEAF_ELEMS,
    ElementOpening,
    list_commitment,
    node_hash,
    open_element,
    step_commitment,
    tensor_root,
    verify_element,
)

__all__ = [
    "LEAF_ELEMS",
    "ElementOpening",
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
]

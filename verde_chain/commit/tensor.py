"""Tensor roots, element openings, node hashes and step commitments (twin of TensorCommit.sol).

Layout (LEAF_ELEMS = 128 binary32 elements per leaf)::

  elements  e0 e1 ... e127 | e128 ... e255 | ... | e(128m) .. e(n-1) 0 0 0   (zero-padded)
            \\_____ 512 B _/ \\____ 512 B __/        \\______ 512 B ______/
  leaves      keccak(chunk0)  keccak(chunk1)   ...   keccak(chunk m)
  root        merkle_root(leaves)  (positional, ZERO-padded to a power of two)

Each element is its 4-byte big-endian bit pattern in flat row-major order. The leaf size is a
trade-off: bigger leaves mean fewer internal hashes (hashing speed approaches bulk keccak),
smaller leaves mean cheaper openings on-chain (calldata is 16 gas per byte). 128 elements is
4 keccak blocks per leaf and one internal hash per leaf; see docs/protocol.md for the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verde_chain.commit import merkle, native
from verde_chain.commit.merkle import keccak256
from verde_chain.commit.native import LEAF_BYTES, LEAF_ELEMS, as_bits
from verde_chain.errors import CommitmentError

# The layout constants and the hashing itself live in one place, the native binding (which
# falls back to numpy + pycryptodome where no C compiler exists); this module adds openings,
# node hashes and step commitments on top.


def chunks(bits: np.ndarray) -> np.ndarray:
    """(n_leaves, 512) uint8 array of big-endian, zero-padded leaf chunks."""
    n = bits.size
    if n == 0:
        raise CommitmentError("EmptyTree", "a tensor commitment needs at least one element")
    padded = np.zeros(-(-n // LEAF_ELEMS) * LEAF_ELEMS, dtype=">u4")
    padded[:n] = bits
    return padded.view(np.uint8).reshape(-1, LEAF_BYTES)


def tensor_leaves(tensor: object) -> list[bytes]:
    return [bytes(row) for row in native.tensor_leaves(tensor)]


def tensor_root(tensor: object) -> bytes:
    return native.tensor_root(tensor)


@dataclass(frozen=True)
class ElementOpening:
    """Everything the contract needs to check one element: the leaf chunk and its proof."""

    element: int
    numel: int
    chunk: bytes
    proof: tuple[bytes, ...]

    @property
    def bits(self) -> int:
        off = (self.element % LEAF_ELEMS) * 4
        return int.from_bytes(self.chunk[off : off + 4], "big")


def open_element(tensor: object, element: int) -> ElementOpening:
    bits = as_bits(tensor)
    chunk, _, proof = native.element_proof(bits, element)
    return ElementOpening(element, bits.size, chunk.astype(">u4").tobytes(), tuple(proof))


def verify_element(root: bytes, opening: ElementOpening) -> int:
    """Check an opening against a tensor root; return the element's bit pattern."""
    if not 0 <= opening.element < opening.numel:
        raise CommitmentError(
            "IndexOutOfRange",
            f"element {opening.element} not in [0, {opening.numel})",
            index=opening.element,
            size=opening.numel,
        )
    if len(opening.chunk) != LEAF_BYTES:
        raise CommitmentError(
            "BadChunkLength", f"chunk is {len(opening.chunk)} bytes, expected {LEAF_BYTES}",
            actual=len(opening.chunk), expected=LEAF_BYTES,
        )
    n_leaves = -(-opening.numel // LEAF_ELEMS)
    merkle.verify(root, keccak256(opening.chunk), opening.element // LEAF_ELEMS, n_leaves, list(opening.proof))
    return opening.bits


def node_hash(index: int, desc_hash: bytes, input_roots: Sequence[bytes], output_roots: Sequence[bytes]) -> bytes:
    """Verde's augmented graph node: (index, op descriptor hash, input roots, output roots).

    ``keccak256(abi.encode(uint256, bytes32, bytes32[], bytes32[]))``, laid out by hand: this runs
    once per node per step, and eth_abi's generic encoder cost four times the hashing itself.
    """
    ins, outs = list(input_roots), list(output_roots)
    for r in (desc_hash, *ins, *outs):
        if len(r) != 32:
            raise CommitmentError("BadLeaf", f"roots are 32 bytes, got {len(r)}", length=len(r))

    def word(x: int) -> bytes:
        return x.to_bytes(32, "big")

    head = word(index) + desc_hash + word(4 * 32) + word(4 * 32 + 32 * (1 + len(ins)))
    return keccak256(b"".join([head, word(len(ins)), *ins, word(len(outs)), *outs]))


@dataclass(frozen=True)
class NodeOpening:
    """A node's whole output opened against a step commitment: what its hash needs besides the
    output's root (the node's index, its input roots) and the Merkle proof of that hash among
    the step's ``size`` node hashes."""

    index: int
    input_roots: tuple[bytes, ...]
    size: int
    proof: tuple[bytes, ...]


def verify_node_output(commitment: bytes, desc_hash: bytes, opening: NodeOpening, tensor: object) -> None:
    """Raise ``CommitmentError`` unless ``tensor`` is the output node ``opening.index`` (of
    descriptor ``desc_hash``) committed to in ``commitment``: its root makes the node hash, and
    the node hash is leaf ``index`` of C_s's tree."""
    leaf = node_hash(opening.index, desc_hash, opening.input_roots, [tensor_root(tensor)])
    merkle.verify(commitment, leaf, opening.index, opening.size, list(opening.proof))


def step_commitment(node_hashes: Sequence[bytes] | np.ndarray) -> bytes:
    """C_s: root over the node hashes of one training step, in topological order (the native
    twin of ``merkle.merkle_root``; an ``(n, 32)`` uint8 array is taken as it is)."""
    return native.merkle_root(node_hashes if isinstance(node_hashes, np.ndarray) else list(node_hashes))


def list_commitment(items: Sequence[bytes]) -> bytes:
    """Root over a sequence of 32-byte states (bisection sequences: checkpoints, VM states); the
    native twin of ``merkle.merkle_root``."""
    return native.merkle_root(list(items))

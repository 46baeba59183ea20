"""Positional keccak-256 binary Merkle trees — the Python twin of ``contracts/commit/Merkle.sol``.

Layout (identical in the Solidity library's header)::

                         root
                   /               \\
             H(n0 || n1)        H(n2 || n3)          H = keccak256 over the 64-byte pair
             /      \\           /       \\
          leaf0   leaf1      leaf2    ZERO           ZERO = bytes32(0) pads to a power of two

* Leaves are 32-byte values supplied by the caller (already hashes); they are not hashed again.
* Pairs are positional (left || right), never sorted: a proof also proves the index.
* A tree of ``n >= 1`` leaves has depth ``ceil(log2(n))``; missing leaves on the right are
  ``ZERO``. A one-leaf tree's root is the leaf. An empty tree is an error.
* A proof is the list of siblings from the leaf upwards; its length must equal the depth.
"""

from __future__ import annotations

from Crypto.Hash import keccak

from verde_chain.errors import CommitmentError

ZERO = b"\x00" * 32


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def depth_for(n: int) -> int:
    if n <= 0:
        raise CommitmentError("EmptyTree", "a Merkle tree needs at least one leaf")
    return (n - 1).bit_length()


def _check_leaf(leaf: bytes) -> None:
    if len(leaf) != 32:
        raise CommitmentError("BadLeaf", f"leaves are 32 bytes, got {len(leaf)}", length=len(leaf))


def levels(leaves: list[bytes]) -> list[list[bytes]]:
    """All levels of the tree, leaves (padded) first, root level last."""
    d = depth_for(len(leaves))
    for leaf in leaves:
        _check_leaf(leaf)
    level = list(leaves) + [ZERO] * ((1 << d) - len(leaves))
    out = [level]
    while len(level) > 1:
        level = [keccak256(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
        out.append(level)
    return out


def merkle_root(leaves: list[bytes]) -> bytes:
    return levels(leaves)[-1][0]


def merkle_proof(leaves: list[bytes], index: int) -> list[bytes]:
    if not 0 <= index < len(leaves):
        raise CommitmentError(
            "IndexOutOfRange", f"index {index} not in [0, {len(leaves)})", index=index, size=len(leaves)
        )
    return proof_from_levels(levels(leaves), index)


def proof_from_levels(lv: list[list[bytes]], index: int) -> list[bytes]:
    """The proof of leaf ``index`` out of a tree's ``levels`` (leaves first), without rehashing."""
    proof = []
    for level in lv[:-1]:
        proof.append(level[index ^ 1])
        index >>= 1
    return proof


def root_from_proof(leaf: bytes, index: int, size: int, proof: list[bytes]) -> bytes:
    """Recompute the root a proof leads to, checking index range and proof length."""
    d = depth_for(size)
    _check_leaf(leaf)
    if not 0 <= index < size:
        raise CommitmentError("IndexOutOfRange", f"index {index} not in [0, {size})", index=index, size=size)
    if len(proof) != d:
        raise CommitmentError(
            "BadProofLength", f"proof has {len(proof)} siblings, depth is {d}", actual=len(proof), expected=d
        )
    node = leaf
    for sib in proof:
        _check_leaf(sib)
        node = keccak256(sib + node) if index & 1 else keccak256(node + sib)
        index >>= 1
    return node


def verify(root: bytes, leaf: bytes, index: int, size: int, proof: list[bytes]) -> None:
    """Raise ``CommitmentError('InvalidProof')`` unless the proof opens ``leaf`` at ``index``."""
    got = root_from_proof(leaf, index, size, proof)
    if got != root:
        raise CommitmentError(
            "InvalidProof", f"proof leads to 0x{got.hex()}, expected 0x{root.hex()}", computed=got, expected=root
        )

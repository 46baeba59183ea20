"""Merkle.sol (contracts/commit/) against its Python twin verde_chain/commit/merkle.py, through
MerkleHarness (eth_call): the same roots, proofs and refusals (error name and fields)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verde_chain.chain.tx import call
from verde_chain.commit import merkle, tensor
from verde_chain.errors import CommitmentError, ContractRevert

leaf_st = st.binary(min_size=32, max_size=32)
DIFF_EXAMPLES = int(os.environ.get("VERDE_MERKLE_EXAMPLES", "1000"))


# -- pure Python ------------------------------------------------------------------------------


def test_known_roots() -> None:
    a, b, c = (bytes([i]) * 32 for i in (1, 2, 3))
    assert merkle.merkle_root([a]) == a
    assert merkle.merkle_root([a, b]) == merkle.keccak256(a + b)
    assert merkle.merkle_root([a, b, c]) == merkle.keccak256(merkle.keccak256(a + b) + merkle.keccak256(c + merkle.ZERO))
    # positional, not sorted: swapping leaves changes the root
    assert merkle.merkle_root([b, a]) != merkle.merkle_root([a, b])
    assert merkle.keccak256(b"").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"


@pytest.mark.parametrize(
    "mutate, name",
    [
        (lambda l, i, n, p: (l, i ^ 1 if n > 1 else i + 1, n, p), None),
        (lambda l, i, n, p: (l, i, n, [bytes(32)] + p[1:]), "InvalidProof"),
        (lambda l, i, n, p: (l, i, n, p + [bytes(32)]), "BadProofLength"),
        (lambda l, i, n, p: (l, n, n, p), "IndexOutOfRange"),
        (lambda l, i, n, p: (bytes(31) + b"\x01", i, n, p), "InvalidProof"),
    ],
    ids=["wrong-index", "wrong-sibling", "wrong-length", "out-of-range", "tampered-leaf"],
)
def test_python_rejects(mutate, name) -> None:  # type: ignore[no-untyped-def]
    leaves = [bytes([i]) * 32 for i in range(1, 6)]
    root = merkle.merkle_root(leaves)
    i = 2
    args = mutate(leaves[i], i, len(leaves), merkle.merkle_proof(leaves, i))
    with pytest.raises(CommitmentError) as ei:
        merkle.verify(root, *args)
    assert ei.value.name in ({name} if name else {"InvalidProof", "IndexOutOfRange"})


def test_empty_tree_rejected() -> None:
    with pytest.raises(CommitmentError, match="EmptyTree"):
        merkle.merkle_root([])
    with pytest.raises(CommitmentError, match="EmptyTree"):
        tensor.tensor_root(np.zeros(0, np.float32))


# -- differential: Python vs Solidity ----------------------------------------------------------


@pytest.mark.chain
@settings(max_examples=DIFF_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(min_value=1, max_value=70))
def test_differential_random_trees(harness, artifacts, data, n) -> None:  # type: ignore[no-untyped-def]
    leaves = data.draw(st.lists(leaf_st, min_size=n, max_size=n))
    i = data.draw(st.integers(0, n - 1))
    root = merkle.merkle_root(leaves)
    proof = merkle.merkle_proof(leaves, i)
    merkle.verify(root, leaves[i], i, n, proof)
    assert call(harness.functions.rootFromProof(leaves[i], i, n, proof), artifacts) == root
    assert call(harness.functions.verify(root, leaves[i], i, n, proof), artifacts) is True
    if n <= 16:
        assert call(harness.functions.root(leaves), artifacts) == root


def _both_reject(harness, artifacts, root, leaf, i, n, proof):  # type: ignore[no-untyped-def]
    with pytest.raises(CommitmentError) as py:
        merkle.verify(root, leaf, i, n, proof)
    with pytest.raises(ContractRevert) as sol:
        call(harness.functions.verify(root, leaf, i, n, proof), artifacts)
    assert py.value.decoded == sol.value.decoded, (py.value, sol.value)
    return sol.value


@pytest.mark.chain
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(min_value=2, max_value=40))
def test_differential_rejections(harness, artifacts, data, n) -> None:  # type: ignore[no-untyped-def]
    leaves = data.draw(st.lists(leaf_st, min_size=n, max_size=n, unique=True))
    i = data.draw(st.integers(0, n - 1))
    root = merkle.merkle_root(leaves)
    proof = merkle.merkle_proof(leaves, i)
    j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
    # wrong index: the same leaf and proof claimed at another position
    err = _both_reject(harness, artifacts, root, leaves[i], j, n, proof)
    assert err.name in ("InvalidProof", "BadProofLength")
    # wrong sibling
    k = data.draw(st.integers(0, len(proof) - 1))
    bad = list(proof)
    bad[k] = bytes(32) if bad[k] != bytes(32) else b"\x01" * 32
    assert _both_reject(harness, artifacts, root, leaves[i], i, n, bad).name == "InvalidProof"
    # wrong proof length
    err = _both_reject(harness, artifacts, root, leaves[i], i, n, proof[:-1])
    assert err.name == "BadProofLength" and err.fields == {"actual": len(proof) - 1, "expected": len(proof)}
    # index out of range
    err = _both_reject(harness, artifacts, root, leaves[i], n + i, n, proof)
    assert err.name == "IndexOutOfRange" and err.fields == {"index": n + i, "size": n}
    # tampered leaf
    tampered = bytes([leaves[i][0] ^ 1]) + leaves[i][1:]
    err = _both_reject(harness, artifacts, root, tampered, i, n, proof)
    assert err.name == "InvalidProof" and err.fields["expected"] == root


@pytest.mark.chain
def test_empty_tree_rejected_on_chain(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as e:
        call(harness.functions.verify(bytes(32), bytes(32), 0, 0, []), artifacts)
    assert e.value.name == "EmptyTree"

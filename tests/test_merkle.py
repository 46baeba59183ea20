"""Merkle trees and tensor openings: Python twin vs the deployed Solidity library (eth_call)."""

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


@pytest.fixture(scope="module")
def harness(_session_w3, artifacts):  # type: ignore[no-untyped-def]
    from verde_chain.chain.deploy import deploy_contract

    return deploy_contract(_session_w3, artifacts, "MerkleHarness")


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


def test_tensor_opening_roundtrip() -> None:
    rng = np.random.default_rng(1)
    for n in (1, 127, 128, 129, 1000, 4097):
        t = rng.standard_normal(n).astype(np.float32)
        root = tensor.tensor_root(t)
        for e in {0, n // 2, n - 1}:
            op = tensor.open_element(t, e)
            assert tensor.verify_element(root, op) == int(t.view(np.uint32)[e])


def test_tensor_root_layout() -> None:
    t = np.arange(130, dtype=np.float32)
    be = t.astype(">f4").tobytes()
    leaf0 = merkle.keccak256(be[:512])
    leaf1 = merkle.keccak256(be[512:] + bytes(512 - len(be[512:])))
    assert tensor.tensor_root(t) == merkle.keccak256(leaf0 + leaf1)


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
    assert py.value.name == sol.value.error, (py.value, sol.value)
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
    assert err.error in ("InvalidProof", "BadProofLength")
    # wrong sibling
    k = data.draw(st.integers(0, len(proof) - 1))
    bad = list(proof)
    bad[k] = bytes(32) if bad[k] != bytes(32) else b"\x01" * 32
    assert _both_reject(harness, artifacts, root, leaves[i], i, n, bad).error == "InvalidProof"
    # wrong proof length
    err = _both_reject(harness, artifacts, root, leaves[i], i, n, proof[:-1])
    assert err.error == "BadProofLength" and err.args_ == {"actual": len(proof) - 1, "expected": len(proof)}
    # index out of range
    err = _both_reject(harness, artifacts, root, leaves[i], n + i, n, proof)
    assert err.error == "IndexOutOfRange" and err.args_ == {"index": n + i, "size": n}
    # tampered leaf
    tampered = bytes([leaves[i][0] ^ 1]) + leaves[i][1:]
    err = _both_reject(harness, artifacts, root, tampered, i, n, proof)
    assert err.error == "InvalidProof" and err.args_["expected"] == root


@pytest.mark.chain
def test_empty_tree_rejected_on_chain(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as e:
        call(harness.functions.verify(bytes(32), bytes(32), 0, 0, []), artifacts)
    assert e.value.error == "EmptyTree"


@pytest.mark.chain
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(min_value=1, max_value=3000))
def test_differential_tensor_openings(harness, artifacts, data, n) -> None:  # type: ignore[no-untyped-def]
    seed = data.draw(st.integers(0, 2**32 - 1))
    bits = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32)
    root = tensor.tensor_root(bits)
    e = data.draw(st.integers(0, n - 1))
    op = tensor.open_element(bits, e)
    assert tensor.verify_element(root, op) == int(bits[e])
    got = call(harness.functions.openElement(root, n, e, op.chunk, list(op.proof)), artifacts)
    assert got == int(bits[e])
    # tampered chunk, wrong element, element past numel, short chunk: both reject with one name
    cases = [
        (tensor.ElementOpening(e, n, bytes([op.chunk[0] ^ 1]) + op.chunk[1:], op.proof), "InvalidProof"),
        (tensor.ElementOpening(n, n, op.chunk, op.proof), "IndexOutOfRange"),
        (tensor.ElementOpening(e, n, op.chunk[:-4], op.proof), "BadChunkLength"),
    ]
    if n > 128:
        other = (e + 128) % n
        if other // 128 != e // 128:
            cases.append((tensor.ElementOpening(other, n, op.chunk, op.proof), "InvalidProof"))
    for bad, name in cases:
        with pytest.raises(CommitmentError) as py:
            tensor.verify_element(root, bad)
        with pytest.raises(ContractRevert) as sol:
            call(harness.functions.openElement(root, n, bad.element, bad.chunk, list(bad.proof)), artifacts)
        assert py.value.name == sol.value.error == name


@pytest.mark.chain
def test_node_hash_twin(harness, artifacts) -> None:  # type: ignore[no-untyped-def]
    ins = [bytes([1]) * 32, bytes([2]) * 32]
    outs = [bytes([3]) * 32]
    desc = merkle.keccak256(b"desc")
    assert call(harness.functions.nodeHash(7, desc, ins, outs), artifacts) == tensor.node_hash(7, desc, ins, outs)


@settings(max_examples=200, deadline=None)
@given(
    index=st.integers(0, 2**256 - 1),
    desc=leaf_st,
    ins=st.lists(leaf_st, max_size=5),
    outs=st.lists(leaf_st, max_size=3),
)
def test_node_hash_is_abi_encode(index: int, desc: bytes, ins: list[bytes], outs: list[bytes]) -> None:
    """The hand-laid node hash equals keccak(abi.encode(uint256, bytes32, bytes32[], bytes32[]))."""
    from eth_abi import encode

    expected = merkle.keccak256(encode(["uint256", "bytes32", "bytes32[]", "bytes32[]"], [index, desc, ins, outs]))
    assert tensor.node_hash(index, desc, ins, outs) == expected

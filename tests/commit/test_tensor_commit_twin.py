"""TensorCommit.sol (contracts/commit/) against its Python twin verde_chain/commit/tensor.py, through
MerkleHarness (eth_call): tensor element openings (and their refusals, by error name and fields)
and node hashes."""

from __future__ import annotations

import numpy as np
import pytest
from eth_abi import encode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verde_chain.chain.tx import call
from verde_chain.commit import merkle, tensor
from verde_chain.errors import CommitmentError, ContractRevert

leaf_st = st.binary(min_size=32, max_size=32)


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
        assert py.value.decoded == sol.value.decoded and sol.value.name == name, (py.value, sol.value)


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
    expected = merkle.keccak256(encode(["uint256", "bytes32", "bytes32[]", "bytes32[]"], [index, desc, ins, outs]))
    assert tensor.node_hash(index, desc, ins, outs) == expected

"""The C tensor Merkle root (kernels/keccak_tree.c) against an independent pure-Python reference."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tensor_ref import ref_keccak, ref_leaves, ref_root
from verde_chain.commit import merkle, native
from verde_chain.errors import CommitmentError

EMPTY_KECCAK = "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
ABC_KECCAK = "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45"


def random_bits(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, size=n, dtype=np.uint32)


@pytest.fixture(scope="module", autouse=True)
def _require_native() -> None:
    if native.load_library() is None:
        pytest.skip(f"native library unavailable: {native.backend()}")


def test_known_keccak_vectors() -> None:
    assert native.bulk_keccak(b"").hex() == EMPTY_KECCAK
    assert native.bulk_keccak(b"abc").hex() == ABC_KECCAK


@pytest.mark.parametrize("length", [1, 55, 135, 136, 137, 271, 272, 512, 1000, 4097])
def test_bulk_keccak_matches_pycryptodome(length: int) -> None:
    data = os.urandom(length)
    assert native.bulk_keccak(data) == ref_keccak(data)


def test_byte_layout_is_big_endian_bit_patterns() -> None:
    # The numpy encoding the reference uses agrees with struct's '>f' for signed zeros, NaN, inf.
    vals = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38], dtype=np.float32)
    via_struct = b"".join(struct.pack(">f", float(v)) for v in vals)
    assert vals.view(np.uint32).astype(">u4").tobytes() == via_struct
    leaf = native.tensor_leaves(vals)[0].tobytes()
    assert leaf == ref_keccak(via_struct + b"\x00" * (512 - len(via_struct)))


SIZES = [1, 2, 127, 128, 129, 255, 256, 1000, 128 * 64, 128 * 64 + 1, 2**16 + 3, 128 * 1025 - 5]


@pytest.mark.parametrize("n", SIZES)
def test_tensor_root_matches_reference(n: int) -> None:
    bits = random_bits(n, n)
    expected = ref_root(bits)
    for threads in (1, 2, 4):
        assert native.tensor_root(bits, threads=threads) == expected, threads
    leaves = native.tensor_leaves(bits, threads=2)
    assert [row.tobytes() for row in leaves] == ref_leaves(bits)
    assert native.merkle_root(leaves, threads=3) == expected


def test_large_tensor_many_subtrees() -> None:
    # > 2^14 leaves per task cap x 2 threads x 4 tasks: exercises full-height tasks, a partial
    # last task and the top fold with zero padding (2^17 + 1 leaves -> depth 18).
    n = 128 * (2**17 + 1) - 7
    bits = random_bits(n, 7)
    expected = ref_root(bits)
    for threads in (1, 2, 3, 8):
        started = native.threads_started()
        assert native.tensor_root(bits, threads=threads) == expected, threads
        # the comparison is only worth something if the extra threads really hashed
        assert native.threads_started() - started == threads - 1, threads


def test_float_inputs_are_taken_bit_for_bit() -> None:
    x = np.random.default_rng(1).standard_normal((3, 50, 7)).astype(np.float32)
    x[0, 0, 0] = -0.0
    x[1, 1, 1] = np.nan
    bits = x.reshape(-1).view(np.uint32)
    assert native.tensor_root(x) == ref_root(bits)
    # Non-contiguous views are committed in logical C order.
    xt = x.transpose(2, 0, 1)
    assert native.tensor_root(xt) == ref_root(np.ascontiguousarray(xt).reshape(-1).view(np.uint32))
    torch = pytest.importorskip("torch")
    assert native.tensor_root(torch.from_numpy(x)) == native.tensor_root(x)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=700),
    st.integers(1, 5),
)
def test_tensor_root_property(values: list[int], threads: int) -> None:
    bits = np.array(values, dtype=np.uint32)
    assert native.tensor_root(bits, threads=threads) == ref_root(bits)


@pytest.mark.parametrize("n_leaves", [1, 2, 3, 5, 8, 13, 100, 256, 1025])
def test_merkle_root_and_proofs_match_python_twin(n_leaves: int) -> None:
    leaves = [ref_keccak(i.to_bytes(4, "big") + n_leaves.to_bytes(4, "big")) for i in range(n_leaves)]
    root = merkle.merkle_root(leaves)
    assert native.merkle_root(leaves) == root
    for index in {0, n_leaves // 2, n_leaves - 1}:
        proof = native.leaves_proof(leaves, index)
        assert proof == merkle.merkle_proof(leaves, index)
        merkle.verify(root, leaves[index], index, n_leaves, proof)


def test_element_proof_opens_one_element() -> None:
    n = 128 * 37 + 11
    bits = random_bits(n, 3)
    root = native.tensor_root(bits)
    for element in (0, 128 * 20 + 5, n - 1):
        chunk, leaf_index, proof = native.element_proof(bits, element)
        assert chunk[element % 128] == bits[element]
        merkle.verify(root, native.chunk_leaf(chunk), leaf_index, native.n_leaves_for(n), proof)


def test_zero_subtree_roots() -> None:
    node = merkle.ZERO
    for depth in range(8):
        assert native.zero_subtree_root(depth) == node
        node = ref_keccak(node + node)


def test_fallback_path_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    bits = random_bits(128 * 5 + 3, 11)
    fast = native.tensor_root(bits), native.tensor_leaves(bits), native.element_proof(bits, 300)[2]
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_loaded", True)
    assert native.backend().startswith("python")
    slow = native.tensor_root(bits), native.tensor_leaves(bits), native.element_proof(bits, 300)[2]
    assert fast[0] == slow[0]
    assert np.array_equal(fast[1], slow[1])
    assert fast[2] == slow[2]
    assert native.bulk_keccak(b"abc").hex() == ABC_KECCAK


def test_errors() -> None:
    with pytest.raises(CommitmentError, match="EmptyTree"):
        native.tensor_root(np.zeros(0, dtype=np.float32))
    with pytest.raises(CommitmentError, match="BadDtype"):
        native.tensor_root(np.zeros(4, dtype=np.float64))
    with pytest.raises(CommitmentError, match="BadLeaf"):
        native.merkle_root([b"\x00" * 31])
    with pytest.raises(CommitmentError, match="IndexOutOfRange"):
        native.element_proof(np.zeros(3, dtype=np.float32), 3)
    with pytest.raises(CommitmentError, match="BadThreads"):
        native.tensor_root(np.zeros(3, dtype=np.float32), threads=0)


def test_portable_build_without_multiversioning_agrees() -> None:
    # The second flag set (no target_clones: baseline x86-64 or another architecture) must give
    # the same roots; it runs the 4-lane vector code through GCC's generic lowering.
    import ctypes

    cc = native._compiler()
    assert cc is not None
    lib = ctypes.CDLL(str(native._build(cc, native._FLAG_SETS[1])))
    native._declare(lib)
    for n in (1, 1000, 128 * 600 + 9):
        bits = random_bits(n, n + 1)
        out = ctypes.create_string_buffer(32)
        assert lib.tensor_root(bits.ctypes.data, bits.size, out, 2) == 0
        assert out.raw == ref_root(bits)

"""Batched native commitments (one call per committed step) against their one-at-a-time twins:
``tensor_roots`` / ``arena_roots`` vs ``tensor_root``, ``node_hashes`` vs ``node_hash``,
``keccak_many`` vs keccak256, the array form of ``step_commitment`` vs ``merkle.merkle_root``,
and the batch schedule's ``epoch_permutation`` vs its definition. Each also without the native
library (the numpy + pycryptodome fallback gives the same bytes)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tensor_ref import ref_root
from verde_chain.commit import merkle, native, node_hash, step_commitment, tensor_root
from verde_chain.commit.merkle import keccak256
from verde_chain.errors import CommitmentError
from verde_chain.graph.data import epoch_permutation

# sizes around every small-tree boundary: 1 leaf, ragged leaves, 4-leaf groups, 256 leaves
SIZES = [1, 2, 127, 128, 129, 511, 512, 513, 640, 4096, 5000, 128 * 255, 128 * 256, 128 * 256 + 1, 128 * 300]


@pytest.fixture(params=["native", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(native, "load_library", lambda: None)
    elif native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    return str(request.param)


def test_tensor_roots_and_arena_roots_equal_tensor_root(mode: str) -> None:
    rng = np.random.default_rng(1)
    tensors = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    expected = [ref_root(t.view(np.uint32)) for t in tensors]  # the spec written out directly
    assert [bytes(r) for r in native.tensor_roots(tensors)] == expected
    # the same tensors as slices of one arena, at 16-element aligned offsets with gaps
    offsets = np.cumsum([0, *(n + 16 - n % 16 + 16 for n in SIZES[:-1])])
    arena = rng.standard_normal(int(offsets[-1]) + SIZES[-1]).astype(np.float32)
    for o, t in zip(offsets, tensors):
        arena[o : o + t.size] = t
    assert [bytes(r) for r in native.arena_roots(arena, offsets, SIZES)] == expected
    assert [tensor_root(t) for t in tensors] == expected


def test_tensor_roots_of_many_small_tensors_do_not_depend_on_threads() -> None:
    """A step's node outputs: hundreds of small trees (leaves and levels hashed across tensor
    boundaries, the trees shared out among threads) beside a few large ones (threaded alone)."""
    if native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    rng = np.random.default_rng(3)
    sizes = [int(n) for n in rng.integers(1, 128 * 40, size=300)] + [128 * 256, 128 * 256 + 1, 128 * 3000 + 5]
    tensors = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    expected = [ref_root(t.view(np.uint32)) for t in tensors]
    for threads in (1, 2, 3):
        assert [bytes(r) for r in native.tensor_roots(tensors, threads)] == expected, threads
        # the small trees alone (~6,000 leaves) are shared out among every thread asked for
        started = native.threads_started()
        assert [bytes(r) for r in native.tensor_roots(tensors[:300], threads)] == expected[:300], threads
        assert native.threads_started() - started == threads - 1, threads


# trees of more than 256 leaves (elements): the smallest, ragged last leaves, 2,048 and 2^14 + 1
# leaves (tasks of the largest size and a one-leaf last task)
BIG = [128 * 256 + 1, 128 * 257 - 3, 128 * 2048, 128 * 2048 + 1, 128 * 2**14 + 1]


def test_tensor_roots_cut_big_trees_into_tasks_the_threads_share() -> None:
    """``tensor_roots`` cuts every tree of more than 256 leaves into subtree tasks (as
    ``tensor_root`` cuts one tensor) and shares them and the small trees' groups among its
    threads: the twin's roots at 1-4 threads, each big tree alone split when it is worth two
    threads (2,048 leaves or more: ``MIN_LEAVES_PER_THREAD`` each) and then hashed on every
    thread started for it."""
    if native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    rng = np.random.default_rng(5)
    big = [rng.standard_normal(n).astype(np.float32) for n in BIG]
    small = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 128 * 40, size=60)]
    expected = {id(t): ref_root(t.view(np.uint32)) for t in big + small}
    for threads in (1, 2, 3, 4):
        assert [bytes(r) for r in native.tensor_roots(small + big, threads)] == [expected[id(t)] for t in small + big]
        for t in big:
            started, split = native.threads_started(), native.trees_split()
            assert bytes(native.tensor_roots([t], threads)[0]) == expected[id(t)], (threads, t.size)
            workers = min(threads, t.size // (128 * 1024))
            assert native.trees_split() - split == (workers > 1), (threads, t.size)
            assert native.threads_started() - started == max(workers, 1) - 1, (threads, t.size)


def test_arena_roots_refuse_slices_outside_the_arena() -> None:
    arena = np.zeros(100, dtype=np.float32)
    for offsets, numels in (([0, 90], [10, 11]), ([-1], [5]), ([0], [0])):
        with pytest.raises(CommitmentError, match="inside the arena"):
            native.arena_roots(arena, offsets, numels)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_node_hashes_equal_node_hash(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12))
    extra = data.draw(st.integers(0, 4))  # other roots the inputs may name (state, batch)
    rows = data.draw(st.lists(st.binary(min_size=32, max_size=32), min_size=n + extra, max_size=n + extra))
    descs = data.draw(st.lists(st.binary(min_size=32, max_size=32), min_size=n, max_size=n))
    inputs = [data.draw(st.lists(st.integers(0, n + extra - 1), max_size=5)) for _ in range(n)]
    table = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, 32)
    desc = np.frombuffer(b"".join(descs), dtype=np.uint8).reshape(-1, 32)
    got = native.node_hashes(table, desc, native.NodeWiring(inputs))
    expected = [node_hash(d, descs[d], [rows[i] for i in inputs[d]], [rows[d]]) for d in range(n)]
    assert [bytes(r) for r in got] == expected
    assert step_commitment(got) == merkle.merkle_root(expected) == step_commitment(expected)


def test_node_hashes_refuse_rows_outside_the_table(mode: str) -> None:
    table = np.zeros((3, 32), dtype=np.uint8)
    desc = np.zeros((2, 32), dtype=np.uint8)
    with pytest.raises(CommitmentError):
        native.node_hashes(table, desc, native.NodeWiring([[0], [3]]))
    with pytest.raises(CommitmentError, match="do not fit"):
        native.node_hashes(table[:1], desc, native.NodeWiring([[0], [0]]))


def test_keccak_many_equals_keccak256(mode: str) -> None:
    rng = np.random.default_rng(2)
    for length in (0, 1, 48, 135, 136, 137, 300):
        msgs = rng.integers(0, 256, (23, length), dtype=np.uint8)  # 8 + 8 + 4 lanes and 3 alone
        assert [bytes(r) for r in native.keccak_many(msgs)] == [keccak256(m.tobytes()) for m in msgs]
    assert native.keccak_many(np.zeros((0, 48), dtype=np.uint8)).shape == (0, 32)


@pytest.mark.parametrize("seed,epoch,n", [(0, 0, 1), (1, 3, 7), (12345, 2, 1797), (2**255 + 7, 9, 3000)])
def test_epoch_permutation_is_its_definition(seed: int, epoch: int, n: int, mode: str) -> None:
    """0..n-1 sorted by (keccak256(seed:uint256 || epoch:uint64 || i:uint64), i) — docs/training.md."""
    epoch_permutation.cache_clear()
    prefix = seed.to_bytes(32, "big") + epoch.to_bytes(8, "big")
    keys = [keccak256(prefix + i.to_bytes(8, "big")) for i in range(n)]
    expected = sorted(range(n), key=lambda i: (keys[i], i))
    assert epoch_permutation(seed, epoch, n).tolist() == expected
    epoch_permutation.cache_clear()


# Node hashes of 0..12 inputs: messages of 2..5 Keccak blocks (8, 12, 12 and 9 nodes), hashed a
# vector of one block count at a time: ragged ends for eight lanes and for four.
NODE_INPUTS = [[]] * 5 + [[(7 * d + j) % 40 for j in range(1 + d % 12)] for d in range(36)]
NODES = len(NODE_INPUTS)


def test_four_lane_and_eight_lane_hashing_give_the_same_roots() -> None:
    """The eight-lane (AVX-512) path is chosen at run time; VERDE_KECCAK_LANES=4 forces the
    four-lane code, which CPUs without AVX-512 run. Both must give the spec's roots and keys."""
    import json
    import os
    import subprocess
    import sys

    if native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    code = (
        "import json, numpy as np; from verde_chain.commit import native; "
        "rng = np.random.default_rng(5); "
        f"ts = [rng.standard_normal(n).astype(np.float32) for n in {SIZES}]; "
        "roots = [native.tensor_root(t).hex() for t in ts] + [bytes(r).hex() for r in native.tensor_roots(ts)]; "
        "keys = native.keccak_many(np.arange(23 * 48, dtype=np.uint32).astype(np.uint8).reshape(23, 48)); "
        f"table = np.arange({NODES * 32 + 320}, dtype=np.uint32).astype(np.uint8).reshape(-1, 32); "
        f"wiring = native.NodeWiring({NODE_INPUTS}); "
        f"nh = native.node_hashes(table, table[:{NODES}][::-1].copy(), wiring); "
        "print(json.dumps(roots + [bytes(k).hex() for k in keys] + [bytes(h).hex() for h in nh]))"
    )
    roots = {}
    for lanes in ("4", "8"):
        env = {**os.environ, "VERDE_KECCAK_LANES": lanes}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        roots[lanes] = json.loads(out.stdout)
    rng = np.random.default_rng(5)
    expected = [ref_root(rng.standard_normal(n).astype(np.float32).view(np.uint32)).hex() for n in SIZES] * 2
    msgs = np.arange(23 * 48, dtype=np.uint32).astype(np.uint8).reshape(23, 48)
    expected += [keccak256(m.tobytes()).hex() for m in msgs]
    table = [bytes(r) for r in np.arange(NODES * 32 + 320, dtype=np.uint32).astype(np.uint8).reshape(-1, 32)]
    descs = table[:NODES][::-1]
    expected += [node_hash(d, descs[d], [table[i] for i in NODE_INPUTS[d]], [table[d]]).hex() for d in range(NODES)]
    assert roots["4"] == roots["8"] == expected


def test_epoch_permutation_orders_by_the_whole_key_when_first_words_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path sorts by each key's first 64 bits; keys that share them (forced here) must
    still come in (whole key, i) order, as the definition says."""
    from verde_chain.graph import data

    real = data.keccak_many

    def tied(msgs: np.ndarray) -> np.ndarray:
        out = real(msgs)
        out[:, :8] = 0
        out[::3, 8:16] = 0  # some keys tie on the second word too
        return out

    monkeypatch.setattr(data, "keccak_many", tied)
    epoch_permutation.cache_clear()
    n, seed, epoch = 40, 9, 2
    msgs = np.array([list(seed.to_bytes(32, "big") + epoch.to_bytes(8, "big") + i.to_bytes(8, "big")) for i in range(n)],
                    dtype=np.uint8)  # fmt: skip
    keys = [bytes(k) for k in tied(msgs)]
    assert epoch_permutation(seed, epoch, n).tolist() == sorted(range(n), key=lambda i: (keys[i], i))
    epoch_permutation.cache_clear()


def test_roots_taken_apart_give_the_same_roots_in_any_item_order() -> None:
    """``roots_begin`` / ``roots_run_item`` / ``roots_end`` (the whole-step plan hashes outputs in
    its pool's idle time with them): items capped at 2^max_item_log leaves, run in a shuffled
    order, give every tensor's reference root; big trees really are cut at the cap (at one
    thread too); ``roots_threads`` keeps the threads asked for when each gets its minimum of
    leaves and cuts them down when the tensors are too small to share; and an empty tensor is
    refused (-1) before anything is allocated."""
    lib = native.load_library()
    if lib is None:
        pytest.skip("no C compiler: the native library is not built here")
    rng = np.random.default_rng(7)
    sizes = [*SIZES, 128 * 2**10 + 3, 128 * 2**14 + 1]
    tensors = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    expected = [ref_root(t.view(np.uint32)) for t in tensors]
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.ctypes.data for t in tensors])
    numels = (ctypes.c_size_t * len(tensors))(*sizes)
    big_leaves = sum(-(-n // 128) for n in sizes if n > 128 * 256)
    for threads, max_log in ((1, 0), (2, 0), (1, 6), (2, 8), (4, 5)):
        roots = np.zeros((len(tensors), 32), dtype=np.uint8)
        rc = ctypes.c_int(99)
        work = lib.roots_begin(ptrs, numels, len(tensors), roots.ctypes.data, threads, 64, max_log, ctypes.byref(rc))
        assert work and rc.value == 0
        n_items = lib.roots_items(work)
        assert lib.roots_threads(work) == threads
        if max_log:  # every big tree cut into items of at most 2^max_log leaves
            assert n_items >= big_leaves >> max_log, (threads, max_log, n_items)
        for i in rng.permutation(n_items):
            lib.roots_run_item(work, int(i))
        assert lib.roots_end(work) == 0
        assert [bytes(r) for r in roots] == expected, (threads, max_log)
    for numel, want in ((128 * 64, 1), (128 * 64 * 3 - 128, 2), (128 * 64 * 3, 3)):  # >= 64 leaves a thread
        one, big = (ctypes.c_size_t * 1)(numel), (ctypes.c_void_p * 1)(tensors[-1].ctypes.data)
        work = lib.roots_begin(big, one, 1, roots.ctypes.data, 4, 64, 0, ctypes.byref(rc))
        assert work and lib.roots_threads(work) == want, numel
        for i in range(lib.roots_items(work)):
            lib.roots_run_item(work, i)
        assert lib.roots_end(work) == 0
        assert bytes(roots[0]) == ref_root(tensors[-1][:numel].view(np.uint32))
    numels[3] = 0
    rc = ctypes.c_int(99)
    assert not lib.roots_begin(ptrs, numels, len(tensors), roots.ctypes.data, 2, 64, 8, ctypes.byref(rc))
    assert rc.value == -1

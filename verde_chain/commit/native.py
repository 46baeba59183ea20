"""Fast tensor Merkle roots: ctypes binding of ``kernels/keccak_tree.c``, with a pure fallback.

Tensor commitment layout (the C source opens with the same picture)::

    tensor, n binary32 elements in flat C order
      -> each element as its 4 bit-pattern bytes, BIG-endian
      -> chunks of LEAF_ELEMS = 128 elements (512 bytes), the last chunk zero-padded
      -> leaf i = keccak256(chunk i)
      -> root = merkle.merkle_root(leaves)   (positional pairs, ZERO-padded to a power of two)

The C library is compiled at first use with the system ``gcc`` (plain ``-O3``, portable to any
x86-64; on x86-64 the Keccak permutation gets a BMI2 clone chosen at load time) into
``build/native/keccak_tree-<hash>/``, keyed by the hash of the source and flags, and written
atomically so concurrent processes may race to build it. When no compiler is available (or
``VERDE_NO_NATIVE=1``), every function falls back to numpy + pycryptodome: same results, about
two orders of magnitude slower for large tensors.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from Crypto.Hash import keccak as _pykeccak

from verde_chain.commit import merkle
from verde_chain.errors import CommitmentError

LEAF_ELEMS = 128
LEAF_BYTES = LEAF_ELEMS * 4

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = REPO_ROOT / "kernels" / "keccak_tree.c"
BUILD_ROOT = REPO_ROOT / "build" / "native"

# The first flag set is tried first; the second drops function multiversioning for compilers
# or libcs without ifunc support.
_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3", "-shared", "-fPIC", "-pthread", "-DVERDE_MULTIVERSION"),
    ("-O3", "-shared", "-fPIC", "-pthread"),
)

_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_loaded = False


class NativeBuildError(CommitmentError):
    """The C Merkle library could not be compiled or loaded."""

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__("NativeBuildFailed", message, **fields)


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build(cc: str, flags: Sequence[str]) -> Path:
    """Compile (or reuse) the shared library for one flag set; return its path."""
    key = hashlib.sha256(SOURCE.read_bytes() + "\0".join([cc, *flags]).encode()).hexdigest()[:16]
    out_dir = BUILD_ROOT / f"keccak_tree-{key}"
    lib_path = out_dir / "libkeccak_tree.so"
    if lib_path.exists():
        return lib_path
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build under a unique name, then rename: a concurrent builder never sees a partial file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(f"{cc} failed: {proc.stderr.strip()[-2000:]}", flags=list(flags))
        os.replace(tmp, lib_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib_path


def _declare(lib: ctypes.CDLL) -> None:
    u8p = ctypes.c_void_p
    size = ctypes.c_size_t
    lib.keccak256.argtypes = [u8p, size, u8p]
    lib.keccak256.restype = None
    lib.tensor_root.argtypes = [u8p, size, u8p, ctypes.c_int]
    lib.tensor_root.restype = ctypes.c_int
    lib.tensor_leaves.argtypes = [u8p, size, u8p, ctypes.c_int]
    lib.tensor_leaves.restype = ctypes.c_int
    lib.merkle_root_from_leaves.argtypes = [u8p, size, u8p, ctypes.c_int]
    lib.merkle_root_from_leaves.restype = ctypes.c_int
    lib.merkle_subtree_root.argtypes = [u8p, size, ctypes.c_int, u8p, ctypes.c_int]
    lib.merkle_subtree_root.restype = ctypes.c_int
    lib.zero_subtree_root.argtypes = [ctypes.c_int, u8p]
    lib.zero_subtree_root.restype = ctypes.c_int
    lib.tensor_roots.argtypes = [u8p, u8p, size, u8p, ctypes.c_int]
    lib.tensor_roots.restype = ctypes.c_int
    # the same work taken apart (roots_begin / roots_run_item / roots_end) and reached as one
    # table of function addresses: the whole-step plan hashes outputs on its own threads with it
    lib.keccak_roots_api.argtypes = []
    lib.keccak_roots_api.restype = ctypes.c_void_p
    lib.roots_begin.argtypes = [u8p, u8p, size, u8p, ctypes.c_int, size, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.roots_begin.restype = ctypes.c_void_p
    lib.roots_items.argtypes = [ctypes.c_void_p]
    lib.roots_items.restype = ctypes.c_int64
    lib.roots_threads.argtypes = [ctypes.c_void_p]
    lib.roots_threads.restype = ctypes.c_int
    lib.roots_run_item.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.roots_run_item.restype = None
    lib.roots_end.argtypes = [ctypes.c_void_p]
    lib.roots_end.restype = ctypes.c_int
    lib.node_hashes.argtypes = [u8p, size, u8p, u8p, u8p, size, u8p]
    lib.node_hashes.restype = ctypes.c_int
    lib.keccak256_many.argtypes = [u8p, size, size, u8p]
    lib.keccak256_many.restype = None
    lib.leaf_elems.argtypes = []
    lib.leaf_elems.restype = size
    lib.keccak_threads_started.argtypes = []
    lib.keccak_threads_started.restype = size
    lib.keccak_trees_split.argtypes = []
    lib.keccak_trees_split.restype = size


def load_library() -> ctypes.CDLL | None:
    """The compiled library, building it on first use; None when only the fallback is usable."""
    global _lib, _lib_error, _loaded
    if _loaded:
        return _lib
    _loaded = True
    if os.environ.get("VERDE_NO_NATIVE") == "1":
        _lib_error = "disabled by VERDE_NO_NATIVE=1"
        return None
    cc = _compiler()
    if cc is None:
        _lib_error = "no C compiler (gcc/cc) on PATH"
        return None
    errors = []
    for flags in _FLAG_SETS:
        try:
            lib = ctypes.CDLL(str(_build(cc, flags)))
        except (NativeBuildError, OSError) as exc:
            errors.append(str(exc))
            continue
        _declare(lib)
        if lib.leaf_elems() != LEAF_ELEMS:
            raise NativeBuildError(f"C LEAF_ELEMS is {lib.leaf_elems()}, Python says {LEAF_ELEMS}")
        _lib = lib
        return lib
    _lib_error = "; ".join(errors)
    return None


def backend() -> str:
    """'native' or 'python: <why>' — for logs and benchmark reports."""
    return "native" if load_library() is not None else f"python: {_lib_error}"


def threads_started() -> int:
    """Worker threads the native library has started so far (0 without it): a test comparing
    thread counts reads it before and after to prove that more than one thread hashed."""
    lib = load_library()
    return 0 if lib is None else int(lib.keccak_threads_started())


def trees_split() -> int:
    """Tensors ``tensor_roots`` (or the whole-step plan's in-plan hashing) has cut into more than
    one subtree task so far (0 without the library): tests read it before and after to prove
    that their sizes took the split path."""
    lib = load_library()
    return 0 if lib is None else int(lib.keccak_trees_split())


def _ptr(a: np.ndarray | ctypes.Array[Any]) -> int | None:
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return ctypes.addressof(a)


def _threads(threads: int | None) -> int:
    t = default_threads() if threads is None else int(threads)
    if t < 1:
        raise CommitmentError("BadThreads", f"threads must be >= 1, got {t}", threads=t)
    return t


def as_bits(tensor: object) -> np.ndarray:
    """Flat C-order uint32 bit patterns of a float32 tensor (numpy, torch CPU, or a sequence).

    float32 and uint32 arrays are taken bit for bit; other array dtypes are refused rather than
    silently rounded. Plain Python sequences are converted to float32.
    """
    if hasattr(tensor, "detach") and hasattr(tensor, "numpy"):  # torch.Tensor without importing torch
        tensor = tensor.detach().cpu().contiguous().numpy()  # type: ignore[attr-defined]
    arr = np.asarray(tensor) if isinstance(tensor, np.ndarray | np.generic) else np.asarray(tensor, np.float32)
    if arr.dtype == np.float32:
        arr = np.ascontiguousarray(arr).view(np.uint32)
    elif arr.dtype != np.uint32:
        raise CommitmentError("BadDtype", f"tensor commitments take float32, got {arr.dtype}", dtype=str(arr.dtype))
    return np.ascontiguousarray(arr).reshape(-1)


def n_leaves_for(n_elems: int) -> int:
    return -(-n_elems // LEAF_ELEMS)


def _check_nonempty(n: int) -> None:
    if n == 0:
        raise CommitmentError("EmptyTree", "a tensor commitment needs at least one element")


# --------------------------------------------------------------------------------------------
# keccak
# --------------------------------------------------------------------------------------------


def bulk_keccak(data: bytes | bytearray | memoryview | np.ndarray) -> bytes:
    """keccak256 of a byte string (or an array's raw bytes) with the C sponge (the benchmark's
    bulk baseline)."""
    lib = load_library()
    if isinstance(data, np.ndarray):
        buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if lib is None:
        return _pykeccak.new(digest_bits=256, data=buf.tobytes()).digest()
    out = ctypes.create_string_buffer(32)
    lib.keccak256(_ptr(buf) if buf.size else None, buf.size, out)
    return out.raw


# --------------------------------------------------------------------------------------------
# Pure fallback (numpy + pycryptodome): the same layout, used when no compiler is available.
# --------------------------------------------------------------------------------------------


def keccak_many(msgs: np.ndarray) -> np.ndarray:
    """keccak256 of every row of an ``(n, length)`` uint8 array, as an ``(n, 32)`` array."""
    msgs = np.ascontiguousarray(msgs, dtype=np.uint8)
    if msgs.ndim != 2:
        raise CommitmentError("BadLeaf", f"messages must be an (n, length) uint8 array, got {msgs.shape}")
    n, length = msgs.shape
    out = np.empty((n, 32), dtype=np.uint8)
    lib = load_library()
    if lib is None:
        for i in range(n):
            out[i] = np.frombuffer(merkle.keccak256(msgs[i].tobytes()), dtype=np.uint8)
    elif n:
        lib.keccak256_many(_ptr(msgs), length, n, _ptr(out))
    return out


def _py_chunks(bits: np.ndarray) -> bytes:
    n = bits.size
    padded = np.zeros(n_leaves_for(n) * LEAF_ELEMS, dtype=">u4")
    padded[:n] = bits
    return padded.tobytes()


def _py_leaves(bits: np.ndarray) -> np.ndarray:
    raw = _py_chunks(bits)
    out = np.empty((len(raw) // LEAF_BYTES, 32), dtype=np.uint8)
    for i in range(out.shape[0]):
        out[i] = np.frombuffer(merkle.keccak256(raw[i * LEAF_BYTES : (i + 1) * LEAF_BYTES]), dtype=np.uint8)
    return out


def _py_subtree_root(leaves: np.ndarray, depth: int) -> bytes:
    level = [bytes(row) for row in leaves] + [merkle.ZERO] * ((1 << depth) - leaves.shape[0])
    while len(level) > 1:
        level = [merkle.keccak256(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def tensor_leaves(tensor: object, threads: int | None = None) -> np.ndarray:
    """All leaves of the tensor as an ``(ceil(n / 128), 32)`` uint8 array."""
    bits = as_bits(tensor)
    _check_nonempty(bits.size)
    lib = load_library()
    if lib is None:
        return _py_leaves(bits)
    out = np.empty((n_leaves_for(bits.size), 32), dtype=np.uint8)
    rc = lib.tensor_leaves(_ptr(bits), bits.size, _ptr(out), _threads(threads))
    if rc != 0:  # pragma: no cover - arguments are checked above
        raise CommitmentError("NativeFailed", f"tensor_leaves returned {rc}", rc=rc)
    return out


def tensor_root(tensor: object, threads: int | None = None) -> bytes:
    """The tensor's Merkle root (32 bytes); independent of ``threads``."""
    bits = as_bits(tensor)
    _check_nonempty(bits.size)
    lib = load_library()
    if lib is None:
        return merkle.merkle_root([bytes(row) for row in _py_leaves(bits)])
    out = ctypes.create_string_buffer(32)
    rc = lib.tensor_root(_ptr(bits), bits.size, out, _threads(threads))
    if rc != 0:
        raise CommitmentError("NativeFailed", f"tensor_root returned {rc}", rc=rc)
    return out.raw


def tensor_roots(tensors: Sequence[np.ndarray], threads: int | None = None) -> np.ndarray:
    """``tensor_root`` of every tensor, as an ``(n, 32)`` uint8 array, in one native call."""
    bits = [as_bits(t) for t in tensors]
    for b in bits:
        _check_nonempty(b.size)
    lib = load_library()
    out = np.empty((len(bits), 32), dtype=np.uint8)
    if lib is None:
        for i, b in enumerate(bits):
            out[i] = np.frombuffer(merkle.merkle_root([bytes(row) for row in _py_leaves(b)]), dtype=np.uint8)
        return out
    ptrs = np.array([b.__array_interface__["data"][0] for b in bits], dtype=np.uintp)
    return _native_roots(lib, ptrs, np.array([b.size for b in bits], dtype=np.uintp), out, threads)


def arena_roots(arena: np.ndarray, offsets: np.ndarray, numels: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``tensor_roots`` of the slices ``arena[offsets[i] : offsets[i] + numels[i]]`` of one flat
    float32/uint32 buffer (a whole-step kernel's node outputs), without a view per slice."""
    bits = as_bits(arena)
    offsets, numels = np.asarray(offsets, dtype=np.int64), np.asarray(numels, dtype=np.int64)
    if offsets.shape != numels.shape or (numels < 1).any() or (offsets < 0).any() or (offsets + numels > bits.size).any():
        raise CommitmentError("BadLeaf", "arena slices must be non-empty and inside the arena", size=bits.size)
    lib = load_library()
    if lib is None:
        return tensor_roots([bits[o : o + n] for o, n in zip(offsets, numels)], threads)
    ptrs = (bits.__array_interface__["data"][0] + 4 * offsets).astype(np.uintp)
    out = np.empty((offsets.size, 32), dtype=np.uint8)
    return _native_roots(lib, ptrs, numels.astype(np.uintp), out, threads)


def _native_roots(lib: ctypes.CDLL, ptrs: np.ndarray, numels: np.ndarray, out: np.ndarray, threads: int | None) -> np.ndarray:
    rc = lib.tensor_roots(_ptr(ptrs), _ptr(numels), ptrs.size, _ptr(out), _threads(threads))
    if rc != 0:  # pragma: no cover - sizes are checked by the callers
        raise CommitmentError("NativeFailed", f"tensor_roots returned {rc}", rc=rc)
    return out


class NodeWiring:
    """Which rows of a root table each node's inputs are, for ``node_hashes``: node d's inputs
    are rows ``idx[start[d]:start[d + 1]]`` (CSR layout), its output row is d."""

    def __init__(self, inputs: Sequence[Sequence[int]]) -> None:
        self.n_nodes = len(inputs)
        self.start = np.cumsum([0, *(len(i) for i in inputs)], dtype=np.int64)
        self.idx = np.array([r for i in inputs for r in i], dtype=np.int64)
        self.inputs = [list(i) for i in inputs]


def node_hashes(table: np.ndarray, desc_hashes: np.ndarray, wiring: NodeWiring) -> np.ndarray:
    """Every node hash of a step (``tensor.node_hash`` for node d = 0 .. n-1, with input roots
    ``table[wiring rows]`` and output root ``table[d]``) as an ``(n, 32)`` uint8 array."""
    table = np.ascontiguousarray(table, dtype=np.uint8)
    desc_hashes = np.ascontiguousarray(desc_hashes, dtype=np.uint8)
    n = wiring.n_nodes
    if table.ndim != 2 or table.shape[1] != 32 or table.shape[0] < n or desc_hashes.shape != (n, 32):
        raise CommitmentError("BadLeaf", f"root table {table.shape} / descriptor hashes {desc_hashes.shape} "
                              f"do not fit {n} nodes", nodes=n)
    if wiring.idx.size and (wiring.idx.min() < 0 or wiring.idx.max() >= table.shape[0]):
        raise CommitmentError("BadLeaf", f"a node input names a row outside the {table.shape[0]}-row root table")
    lib = load_library()
    if lib is None:
        from verde_chain.commit.tensor import node_hash

        rows = [bytes(r) for r in table]
        hashes = [node_hash(d, bytes(desc_hashes[d]), [rows[i] for i in wiring.inputs[d]], [rows[d]]) for d in range(n)]
        return np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(n, 32)
    out = np.empty((n, 32), dtype=np.uint8)
    start, idx = wiring.start, wiring.idx if wiring.idx.size else np.zeros(1, dtype=np.int64)
    rc = lib.node_hashes(_ptr(table), table.shape[0], _ptr(desc_hashes), _ptr(start), _ptr(idx), n, _ptr(out))
    if rc != 0:
        raise CommitmentError("NativeFailed", f"node_hashes returned {rc} (an input row outside the table)", rc=rc)
    return out


def _leaves_array(leaves: np.ndarray | Sequence[bytes]) -> np.ndarray:
    if isinstance(leaves, np.ndarray):
        arr = np.ascontiguousarray(leaves, dtype=np.uint8)
        if arr.ndim != 2 or arr.shape[1] != 32:
            raise CommitmentError("BadLeaf", f"leaves must be (n, 32) uint8, got {arr.shape}", shape=arr.shape)
        return arr
    for leaf in leaves:
        if len(leaf) != 32:
            raise CommitmentError("BadLeaf", f"leaves are 32 bytes, got {len(leaf)}", length=len(leaf))
    return np.frombuffer(b"".join(leaves), dtype=np.uint8).reshape(-1, 32)


def merkle_root(leaves: np.ndarray | Sequence[bytes], threads: int | None = None) -> bytes:
    """``merkle.merkle_root`` over 32-byte leaves, in C."""
    arr = _leaves_array(leaves)
    if arr.shape[0] == 0:
        raise CommitmentError("EmptyTree", "a Merkle tree needs at least one leaf")
    lib = load_library()
    if lib is None:
        return merkle.merkle_root([bytes(row) for row in arr])
    out = ctypes.create_string_buffer(32)
    lib.merkle_root_from_leaves(_ptr(arr), arr.shape[0], out, _threads(threads))
    return out.raw


def zero_subtree_root(depth: int) -> bytes:
    """Root of a subtree of height ``depth`` made only of ZERO leaves."""
    if not 0 <= depth <= 63:
        raise CommitmentError("BadDepth", f"depth {depth} not in [0, 63]", depth=depth)
    lib = load_library()
    if lib is None:
        node = merkle.ZERO
        for _ in range(depth):
            node = merkle.keccak256(node + node)
        return node
    out = ctypes.create_string_buffer(32)
    lib.zero_subtree_root(depth, out)
    return out.raw


def _subtree_root(leaves: np.ndarray, depth: int, threads: int) -> bytes:
    if leaves.shape[0] == 0:
        return zero_subtree_root(depth)
    lib = load_library()
    if lib is None:
        return _py_subtree_root(leaves, depth)
    out = ctypes.create_string_buffer(32)
    rc = lib.merkle_subtree_root(_ptr(leaves), leaves.shape[0], depth, out, threads)
    if rc != 0:  # pragma: no cover - callers pass consistent sizes
        raise CommitmentError("NativeFailed", f"merkle_subtree_root returned {rc}", rc=rc)
    return out.raw


def leaves_proof(leaves: np.ndarray | Sequence[bytes], index: int, threads: int | None = None) -> list[bytes]:
    """``merkle.merkle_proof`` (siblings from the leaf upwards), with each sibling subtree in C."""
    arr = _leaves_array(leaves)
    n = arr.shape[0]
    depth = merkle.depth_for(n)
    if not 0 <= index < n:
        raise CommitmentError("IndexOutOfRange", f"index {index} not in [0, {n})", index=index, size=n)
    t = _threads(threads)
    proof = []
    for level in range(depth):
        first = ((index >> level) ^ 1) << level
        proof.append(_subtree_root(arr[first : min(first + (1 << level), n)], level, t))
    return proof


def element_proof(tensor: object, element: int, threads: int | None = None) -> tuple[np.ndarray, int, list[bytes]]:
    """Open one element: (its 128-element chunk as uint32 bits, leaf index, Merkle proof).

    The verifier hashes the chunk (big-endian bytes) to the leaf and checks the proof with
    ``merkle.verify(root, leaf, leaf_index, n_leaves, proof)``; the element sits at position
    ``element % 128`` of the chunk.
    """
    bits = as_bits(tensor)
    _check_nonempty(bits.size)
    if not 0 <= element < bits.size:
        raise CommitmentError("IndexOutOfRange", f"element {element} not in [0, {bits.size})", index=element, size=bits.size)
    leaves = tensor_leaves(bits, threads)
    leaf_index = element // LEAF_ELEMS
    chunk = np.zeros(LEAF_ELEMS, dtype=np.uint32)
    part = bits[leaf_index * LEAF_ELEMS : (leaf_index + 1) * LEAF_ELEMS]
    chunk[: part.size] = part
    return chunk, leaf_index, leaves_proof(leaves, leaf_index, threads)


def chunk_leaf(chunk: np.ndarray) -> bytes:
    """keccak256 of a 128-element chunk of bit patterns, as the leaf hash."""
    c = np.asarray(chunk, dtype=np.uint32)
    if c.shape != (LEAF_ELEMS,):
        raise CommitmentError("BadChunk", f"a chunk has {LEAF_ELEMS} elements, got {c.shape}", shape=c.shape)
    return merkle.keccak256(c.astype(">u4").tobytes())

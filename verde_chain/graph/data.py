"""Datasets, the deterministic batch schedule and the per-step batch commitments.

Dataset commitment: ``dataset_root = list_commitment([tensor_root(X), tensor_root(Y)])`` over
the float32 sample tensor X (N, ...) and the target tensor Y (N, ...) (class ids / token ids are
float32 integers). ``Dataset.from_arrays`` takes a user's arrays as they come: integers (int32 /
int64 token ids, class labels) and booleans are converted exactly, which binary32 can do for
every integer of magnitude below 2**24 (larger ones are refused with ``IntegerRangeError``);
float64 and float16 are rounded once to the nearest binary32.

Batch schedule (counter-based, so any step can be rebuilt alone): sample position
``p = (s - 1) * B + j`` (step s >= 1, j < B) is sample ``perm_e[p mod N]`` of epoch ``e = p // N``,
where ``perm_e`` sorts ``0..N-1`` by ``keccak256(seed:uint256 || e:uint64 || i:uint64)`` (ties
impossible in practice, broken by i). The batch of step s is packed by the training graph
(``TrainingProgram.batch``) into ONE tensor; ``batch_root_s = tensor_root(packed batch of s)``.
The job's ``batchRoot`` is the list commitment the dispute game opens (``GameTypes.sol``)::

    leaf_{s-1} = keccak256(abi.encode(bytes32[] [batch_root_s]))     (one batch tensor per step)
    batchRoot  = list_commitment([leaf_0, ..., leaf_{T-1}])

so a BATCH input source of index 0 is ``batch_root_s``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from eth_abi import encode as abi_encode

from verde_chain.commit import list_commitment, tensor_root
from verde_chain.commit.merkle import keccak256
from verde_chain.commit.native import keccak_many
from verde_chain.graph.errors import IntegerRangeError, NonFiniteDataError, ShapeMismatchError
from verde_chain.graph.ir import EXACT_INT


@dataclass(frozen=True)
class Dataset:
    X: np.ndarray  # float32 (N, ...)
    Y: np.ndarray  # float32 (N, ...)
    input_name: str = "x"

    def __post_init__(self) -> None:
        if self.X.dtype != np.float32 or self.Y.dtype != np.float32:
            raise ShapeMismatchError(f"dataset tensors must be float32, got {self.X.dtype}, {self.Y.dtype}")
        if len(self.X) != len(self.Y) or len(self.X) == 0:
            raise ShapeMismatchError(f"dataset X has {len(self.X)} samples, Y {len(self.Y)}")

    def __len__(self) -> int:
        return len(self.X)

    @classmethod
    def from_arrays(cls, X: np.ndarray, Y: np.ndarray | None = None, input_name: str = "x") -> Dataset:
        """A dataset from arrays of any numeric dtype (module docstring); no ``Y`` (an inference
        job's) is zeros, one per sample."""
        x = as_binary32("X", X)
        y = np.zeros(len(x), dtype=np.float32) if Y is None else as_binary32("Y", Y)
        return cls(x, y, input_name)

    def root(self) -> bytes:
        return list_commitment([tensor_root(self.X), tensor_root(self.Y)])


def as_binary32(name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` as float32: integers and booleans exactly (magnitude below 2**24, else
    ``IntegerRangeError``), floats rounded once to nearest."""
    a = np.asarray(arr)
    if a.dtype == np.bool_:
        return a.astype(np.float32)
    if np.issubdtype(a.dtype, np.integer):
        big = np.abs(a.astype(np.int64)) >= EXACT_INT if a.size else np.zeros(0, dtype=bool)
        if big.any():
            i = int(np.argmax(big.reshape(-1)))
            raise IntegerRangeError(
                f"{name} holds the integer {int(a.reshape(-1)[i])} at flat index {i}: binary32 holds integers "
                f"exactly only below 2**24 = {EXACT_INT} in magnitude (renumber the ids or labels)",
                tensor=name, index=i, value=int(a.reshape(-1)[i]))
        return a.astype(np.float32)
    if not np.issubdtype(a.dtype, np.floating):
        raise ShapeMismatchError(f"{name} has dtype {a.dtype}; a dataset holds numbers (floats, integers, booleans)",
                                 tensor=name)
    return np.ascontiguousarray(a, dtype=np.float32)


def check_finite(name: str, arr: np.ndarray) -> None:
    """Refuse NaN and infinities (``NonFiniteDataError`` naming the first one)."""
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad.reshape(-1)))
        v = float(arr.reshape(-1)[i])
        row = np.unravel_index(i, arr.shape)[0] if arr.ndim else 0
        raise NonFiniteDataError(f"{name} holds {v} at flat index {i} (sample {row}); the job's data must be finite "
                                 "(drop or impute those samples)", tensor=name, index=i, value=v)


@functools.lru_cache(maxsize=64)
def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """0..n-1 sorted by (keccak256(seed:uint256 || epoch:uint64 || i:uint64), i)."""
    msgs = np.empty((n, 48), dtype=np.uint8)
    msgs[:, :40] = np.frombuffer(seed.to_bytes(32, "big") + epoch.to_bytes(8, "big"), dtype=np.uint8)
    msgs[:, 40:] = np.arange(n, dtype=">u8").view(np.uint8).reshape(n, 8)
    # one native call for all n keys; byte order of a key = order of its big-endian words
    words = keccak_many(msgs).view(">u8").reshape(n, 4)
    first = words[:, 0].astype(np.uint64)
    order = np.argsort(first, kind="stable")
    if np.any(first[order[1:]] == first[order[:-1]]):  # a 64-bit tie: order by the whole key, then i
        order = np.lexsort((np.arange(n), words[:, 3], words[:, 2], words[:, 1], words[:, 0]))
    return order.astype(np.int64)


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
    if step < 1:
        raise ValueError(f"steps are 1-based, got {step}")
    pos = (step - 1) * batch_size + np.arange(batch_size, dtype=np.int64)
    epochs, slots = pos // n, pos % n
    out = np.empty(batch_size, dtype=np.int64)
    for e in range(int(epochs[0]), int(epochs[-1]) + 1):  # positions ascend: a few epochs at most
        sel = epochs == e
        out[sel] = epoch_permutation(seed, e, n)[slots[sel]]
    return out


def batch_leaf(tensor_roots: Sequence[bytes]) -> bytes:
    """Leaf s - 1 of batchRoot, for step s: keccak256(abi.encode(bytes32[] tensorRoots of step s))."""
    return keccak256(abi_encode(["bytes32[]"], [list(tensor_roots)]))


def batch_root_list(roots: list[bytes]) -> bytes:
    """batchRoot over the per-step batch tensor roots (one packed tensor per step)."""
    return list_commitment([batch_leaf([r]) for r in roots])

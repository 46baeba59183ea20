"""An independent pure-Python reference of the tensor root (the spec written out directly), for
the tests of the native and batched commitment builders."""

from __future__ import annotations

import numpy as np
from Crypto.Hash import keccak

from verde_chain.commit import merkle


def ref_keccak(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def ref_leaves(bits: np.ndarray) -> list[bytes]:
    """Spec, written out directly: BE bytes of each element, 128 per chunk, zero padded."""
    raw = bits.astype(">u4").tobytes()
    raw += b"\x00" * (-len(raw) % 512)
    return [ref_keccak(raw[i : i + 512]) for i in range(0, len(raw), 512)]


def ref_root(bits: np.ndarray) -> bytes:
    return merkle.merkle_root(ref_leaves(bits))

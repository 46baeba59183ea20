"""Proof that a multi-threaded kernel call really ran on several OS threads.

The C++ extension of each ISA records which OS threads executed at least one item of kernel work
(``probe_reset`` / ``probe_threads``). On a busy machine a worker woken for a short call may find
every item taken by the time the OS runs it, so tests switch on the pool's spread check: every
thread of a call runs at least one item and the call waits for late ones. The items and the code
that runs them are the same as without it, so the bits compared are the kernels' real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
import torch

from verde_chain.repops.backends.cpu import extension as cpu_ext

THREAD_COUNTS = (1, 2, 3, 4, 7)
T = TypeVar("T")


@contextmanager
def spread_check(isa: str) -> Iterator[None]:
    cpu_ext.set_spread_check(True, isa)
    try:
        yield
    finally:
        cpu_ext.set_spread_check(False, isa)


def as_bits(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().numpy()
    return np.ascontiguousarray(x).view(np.uint32).copy()


def engaged(isa: str, threads: int, fn: Callable[[], T]) -> T:
    """``fn()``, after asserting how many OS threads ran ``isa``'s kernel items in the call:
    exactly one at ``threads == 1``, else more than one and at most ``threads``."""
    with spread_check(isa):
        cpu_ext.probe_reset(isa)
        out = fn()
        count = len(cpu_ext.probe_threads(isa))
    if threads == 1:
        assert count == 1, f"{count} threads ran items at threads=1"
    else:
        assert 1 < count <= threads, f"threads={threads}: {count} OS threads ran items"
    return out


def run_engaged(isa: str, threads: int, fn: Callable[[], np.ndarray | torch.Tensor]) -> np.ndarray:
    """``fn()``'s bits, from a call that :func:`engaged` checked."""
    return engaged(isa, threads, lambda: as_bits(fn()))

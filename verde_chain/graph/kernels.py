"""Which RepOps implementation runs the nodes: the numpy reference, or a registered backend.

Backends are looked up in ``verde_chain.repops.ops.BACKENDS`` (engineer C's C++ kernels register
there); a backend may return None for a descriptor it does not handle, and the reference runs it.
Every backend must give the reference's bits, so the choice never changes a commitment.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from verde_chain.graph.errors import GraphError
from verde_chain.repops import reference
from verde_chain.repops.program import KernelDesc

Runner = Callable[[KernelDesc, list[np.ndarray]], np.ndarray]


def make_runner(backend: str = "reference") -> Runner:
    if backend == "reference":
        return reference.run
    from verde_chain.repops import ops

    fn = ops.BACKENDS.get(backend)
    if fn is None:
        raise GraphError(f"no RepOps backend {backend!r}; registered: {sorted(ops.BACKENDS)} and 'reference'")

    def run(desc: KernelDesc, ins: list[np.ndarray]) -> np.ndarray:
        out = fn(desc, ins)
        return reference.run(desc, ins) if out is None else np.asarray(out, dtype=np.float32)

    return run

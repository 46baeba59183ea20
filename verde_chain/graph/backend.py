"""Which RepOps backend runs the training executor's nodes: ``make_runner(name, threads)``.

    "cpp"        (default) the C++ CPU kernels (``verde_chain/repops/backend_cpu.py``): GEMM,
                 reductions and vector binaries for the nodes shaped like them, a generic
                 interpreter for every other program. If the extension cannot be built here
                 (no compiler, ...), the runner says so once on stderr and uses "reference".
    "reference"  the numpy reference (``verde_chain/repops/reference.py``).
    "cuda"       the CUDA backend (``verde_chain/repops/backend_cuda.py``): whole steps on a
                 device-resident arena; raises ``CudaUnavailable`` at the first node without CUDA.
    other names  a backend registered in ``verde_chain.repops.ops.BACKENDS``; it may return None
                 for a descriptor it does not handle, and the reference runs it.

Every backend gives the reference's bits, so the choice (and ``threads``) never changes a
tensor root or a commitment; tests check C_T across backends.
"""

from __future__ import annotations

import sys

from verde_chain.graph.errors import GraphError
from verde_chain.repops import reference
from verde_chain.repops.program import Runner

__all__ = ["DEFAULT_BACKEND", "Runner", "make_runner"]

DEFAULT_BACKEND = "cpp"
_warned: set[str] = set()


def _cpp_runner(threads: int | None) -> Runner | None:
    from verde_chain.repops.backend_cpu import BackendUnavailable, CppBackend

    try:
        return CppBackend(threads=threads)
    except BackendUnavailable as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            print(f"verde-chain: {exc}; falling back to the numpy reference backend (same bits, slower)", file=sys.stderr)
        return None


def make_runner(backend: str = DEFAULT_BACKEND, threads: int | None = None) -> Runner:
    """The node runner for ``backend``; ``threads`` (>= 1) caps the C++ kernels' workers (the
    real parallelism is ``min(threads, torch.get_num_threads())``)."""
    if threads is not None and threads < 1:
        raise GraphError(f"threads must be >= 1, got {threads}")
    if backend == "reference":
        return reference.run
    if backend == "cpp":
        return _cpp_runner(threads) or reference.run
    from verde_chain.repops import ops

    fn = ops.BACKENDS.get(backend)
    if fn is None:
        raise GraphError(
            f"no RepOps backend {backend!r}; known: 'cpp', 'reference' and registered {sorted(ops.BACKENDS)}"
        )
    return ops.BackendRunner(fn)

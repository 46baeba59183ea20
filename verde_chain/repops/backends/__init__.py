"""RepOps kernel backends: the registry (``registry.py``: one name per backend, for the executor
and the torch API alike), the planning of fast kernels (``plan.py``), what the native backends
share (``native.py``), the C++ CPU backend (``cpu/``) and the CUDA backend (``cuda/``).

The numpy reference (``repops/reference.py``) is the canonical semantics executed vectorised;
every backend here must give its bits.
"""

from verde_chain.repops.backends.registry import (
    BACKENDS,
    DEFAULT_BACKEND,
    Backend,
    BackendRunner,
    BackendUnavailable,
    Runner,
    UnknownBackend,
    lookup,
    make_runner,
    register,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "BackendRunner",
    "BackendUnavailable",
    "Runner",
    "UnknownBackend",
    "lookup",
    "make_runner",
    "register",
]

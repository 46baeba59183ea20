"""Which RepOps backend runs the executor's nodes: ``make_runner(name, threads)`` of the backend
registry (``verde_chain/repops/backends/registry.py``, which lists the names: "cpu", the default,
the C++ kernels; "reference", the numpy reference; "cuda"; or a registered one).

Every backend gives the reference's bits, so the choice (and ``threads``) never changes a
tensor root or a commitment; tests check C_T across backends. ``set_threads`` applies a
``--threads`` option (train, the bots) to every runner that reads torch's count.
"""

from verde_chain.repops.backends.registry import (
    DEFAULT_BACKEND,
    THREADS_HELP,
    Runner,
    make_runner,
    set_threads,
    thread_count,
)

__all__ = ["DEFAULT_BACKEND", "THREADS_HELP", "Runner", "make_runner", "set_threads", "thread_count"]

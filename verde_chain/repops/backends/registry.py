"""The RepOps backend registry: one name per backend, the same for the training executor
(``verde-chain train --backend``, :func:`make_runner`) and for the torch-facing API (a tensor's
``device.type`` picks the backend of that name)::

    "reference"  the numpy reference (``repops/reference.py``): the canonical semantics, vectorised
    "cpu"        the C++ kernels (``backends/cpu``): planned per node, a whole step in one call
    "cuda"       the CUDA kernels (``backends/cuda``); raises ``CudaUnavailable`` without CUDA
    others       ``register(name, fn)``

A backend is ``fn(desc, inputs: list[np.ndarray float32 flat]) -> np.ndarray | None``; ``None``
means "not handled" and the node runs on the reference, so a backend may implement only the
kernels it accelerates. Every backend must be bit-identical to ``reference.run`` for every
descriptor it accepts; the choice (and the thread count) never changes a tensor root or a
commitment (tests compare C_T across backends). A backend may also offer ``compile_step``
(whole training steps in one call), which :class:`BackendRunner` passes on to the executor.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.repops import reference
from verde_chain.repops.program import KernelDesc, Runner

Backend = Callable[[KernelDesc, list[np.ndarray]], "np.ndarray | None"]

DEFAULT_BACKEND = "cpu"
# Former names of a backend: refused with a one-line error naming the current one.
RENAMED = {"cpp": "cpu"}


class BackendUnavailable(RepOpsError):
    """A backend's kernels cannot be built or run on this machine (says why)."""


class UnknownBackend(RepOpsError):
    """No backend of that name is registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        hint = f" (it is now called {RENAMED[name]!r})" if name in RENAMED else ""
        super().__init__(f"no RepOps backend {name!r}{hint}; registered: {known}")


class _Lazy:
    """The ``backend`` of a module imported on first use (importing the registry compiles
    nothing). Other attributes the backend offers (``compile_step``) are forwarded, so whoever
    holds the registry entry sees them."""

    def __init__(self, module: str) -> None:
        self._module = module

    def _target(self) -> Backend:
        return importlib.import_module(self._module).backend  # type: ignore[no-any-return]

    def __call__(self, desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray | None:
        return self._target()(desc, inputs)

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._target(), name)


_CPU = _Lazy("verde_chain.repops.backends.cpu.backend")
BACKENDS: dict[str, Backend] = {
    "reference": reference.run,
    "cpu": _CPU,
    "cuda": _Lazy("verde_chain.repops.backends.cuda.backend"),
}


def register(name: str, fn: Backend) -> None:
    """Install ``fn`` as backend ``name`` (a torch device type for the torch API: "cpu", "cuda")."""
    BACKENDS[name] = fn


def lookup(name: str) -> Backend:
    """The backend registered as ``name``; :class:`UnknownBackend` (one line) otherwise."""
    fn = BACKENDS.get(name)
    if fn is None:
        raise UnknownBackend(name, sorted(BACKENDS))
    return fn


class BackendRunner:
    """A registered backend as a node runner: a descriptor it does not handle (``None``) runs on
    the reference, and its ``compile_step``, if it has one, is offered to the training executor
    (which then runs whole steps in one call)."""

    def __init__(self, fn: Backend) -> None:
        self.fn = fn
        step = getattr(fn, "compile_step", None)
        if step is not None:
            self.compile_step = step

    def __call__(self, desc: KernelDesc, ins: list[np.ndarray]) -> np.ndarray:
        out = self.fn(desc, ins)
        return reference.run(desc, ins) if out is None else np.asarray(out, dtype=np.float32)


_warned: set[str] = set()


THREADS_HELP = "CPU threads of the RepOps kernels (default: all cores; never changes a bit)"


def thread_count(text: str) -> int:
    """argparse ``type`` of ``--threads``: an integer >= 1 (else one line naming the option)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"want a whole number of threads >= 1, got {text!r}")
    return n


def set_threads(threads: int | None) -> None:
    """``--threads``: the process's thread count (``torch.set_num_threads``), which every
    runner built without its own count reads per call; None keeps torch's default, one thread
    per core."""
    if threads is None:
        return
    if threads < 1:
        raise RepOpsError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def make_runner(backend: str = DEFAULT_BACKEND, threads: int | None = None) -> Runner:
    """The node runner for ``backend``; the C++ kernels run on ``threads`` (>= 1) OS threads,
    else on ``torch.get_num_threads()`` read per call (see :func:`set_threads`); never changes
    a bit.

    "cpu" (while it is the C++ backend, not a re-registered one) is a :class:`CpuBackend` with
    its own thread count; if its extension cannot be built here (no compiler, ...), the runner
    says so once on stderr and is the reference (same bits, slower). Any other name runs its
    registered backend through :class:`BackendRunner`."""
    if threads is not None and threads < 1:
        raise RepOpsError(f"threads must be >= 1, got {threads}")
    if backend == "reference":
        return reference.run
    if backend == "cpu" and BACKENDS.get("cpu") is _CPU:
        from verde_chain.repops.backends.cpu.backend import CpuBackend

        try:
            return CpuBackend(threads=threads)
        except BackendUnavailable as exc:
            if str(exc) not in _warned:
                _warned.add(str(exc))
                print(f"verde-chain: {exc}; falling back to the numpy reference backend (same bits, slower)",
                      file=sys.stderr)  # fmt: skip
            return reference.run
    return BackendRunner(lookup(backend))

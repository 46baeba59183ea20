"""The RepOps backend registry: which kernels run a node, by device type.

    BACKENDS["cpu"]  = backend_cpu.backend     (C++ kernels; None -> the numpy reference)
    BACKENDS["cuda"] = backend_cuda.backend    (CUDA kernels; raises CudaUnavailable without CUDA;
                                                offers compile_step: whole steps on the device)
    BACKENDS[...]    = register_backend(...)

A backend is ``fn(desc, inputs: list[np.ndarray float32 flat]) -> np.ndarray | None``; returning
``None`` means "not handled" and the node falls back to the numpy reference, so a backend may
implement only the kernels it accelerates (GEMM, reductions). Backends must be bit-identical to
``reference.run`` for every descriptor they accept.

The torch-facing functions (``matmul``, ``softmax``, ...) live in ``torch_api.py``; they are
re-exported here under their old names (``ops.matmul``) so existing callers keep working.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops import reference
from verde_chain.repops.program import KernelDesc

Backend = Callable[[KernelDesc, list[np.ndarray]], "np.ndarray | None"]
class _Lazy:
    """The ``backend`` of a module imported on first use (importing ops compiles nothing). Other
    attributes the backend offers (``compile_step``: whole training steps in one call) are
    forwarded, so whoever holds the registry entry sees them."""

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


# "cpu": the C++ kernels (None -> the reference); "cuda": raises CudaUnavailable without CUDA
BACKENDS: dict[str, Backend] = {
    "cpu": _Lazy("verde_chain.repops.backend_cpu"),
    "cuda": _Lazy("verde_chain.repops.backend_cuda"),
}


def register_backend(device_type: str, fn: Backend) -> None:
    """Install ``fn`` for tensors on ``device_type`` ("cpu", "cuda", ...)."""
    BACKENDS[device_type] = fn


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


def device_runner(device: torch.device) -> BackendRunner:
    """The registered backend for tensors on ``device``, as a node runner."""
    backend = BACKENDS.get(device.type)
    if backend is None:
        raise RepOpsError(f"no RepOps backend for device {device.type!r}; registered: {sorted(BACKENDS)}")
    return BackendRunner(backend)


def __getattr__(name: str) -> object:
    # the torch API moved to torch_api.py; imported on first use (torch_api imports this module)
    api = importlib.import_module("verde_chain.repops.torch_api")
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

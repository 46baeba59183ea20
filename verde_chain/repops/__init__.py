"""RepOps: bitwise-reproducible operators defined by per-element scalar programs.

The canonical semantics (what every implementation must match bit for bit):

    isa             the instruction set: opcodes, instruction words
    fp32            the exact binary32 semantics of every arithmetic instruction
    program         KernelDesc (one node's program and addressing), the scalar interpreter, traces
    transcendental  exp, log, tanh, erf, sigmoid, gelu, ... as straight-line programs (via ssa)
    rng             the counter-based random number generator
    edges           the binary32 edge values tests and device checks draw operands from

Built on them:

    library/        the operator library: every operator as primitive KernelDescs and compositions
    reference       vectorised numpy execution of any KernelDesc
    backends/       the backend registry (reference, C++ "cpu", "cuda", registered ones), the
                    planning of fast kernels, and the native backends themselves
    torch_api       the torch-facing functions

The torch-facing functions are re-exported lazily (``verde_chain.repops.matmul(a, b)``,
``softmax``, ``layer_norm``, ...), so importing ``verde_chain.repops.isa`` does not import torch.
``verde_chain.repops.backends.register(name, fn)`` installs a kernel backend (backends/registry.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> torch_api name, where Python's builtins are in the way
_ALIASES = {"sum": "sum_", "abs": "abs_"}
# The names forwarded to torch_api.py (its ``__all__`` under the public names; a test checks that
# the two lists agree), so ``from verde_chain.repops import fp32`` never triggers the torch import.
_TORCH_API = frozenset({
    "add", "sub", "mul", "div", "maximum", "minimum",
    "relu", "neg", "abs", "sqrt", "exp", "log", "tanh", "erf", "sigmoid", "gelu", "relu_backward", "gelu_backward",
    "matmul", "linear",
    "sum", "mean", "amax", "amin",
    "softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
    "layer_norm", "layer_norm_with_stats", "layer_norm_backward",
    "cross_entropy", "cross_entropy_backward", "embedding", "embedding_backward",
    "permute", "transpose", "reshape",
    "sgd_step", "adam_step",
    "apply",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "backends":  # a subpackage: importable as an attribute too
        return importlib.import_module("verde_chain.repops.backends")
    if name in _TORCH_API:
        return getattr(importlib.import_module("verde_chain.repops.torch_api"), _ALIASES.get(name, name))
    raise AttributeError(f"module 'verde_chain.repops' has no attribute {name!r}")

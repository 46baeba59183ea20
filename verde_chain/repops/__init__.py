"""RepOps: bitwise-reproducible operators defined by per-element scalar programs.

Submodules: ``isa`` (instruction set), ``program`` (KernelDesc, scalar interpreter, traces),
``spec`` (operator library and compositions), ``reference`` (vectorised numpy execution),
``fp32``/``transcendental`` (instruction semantics, transcendental programs), ``rng``
(counter-based RNG), ``ops`` (torch-facing API), ``backends`` (the registry and the C++/CUDA
backends).

The torch-facing functions are re-exported lazily (``verde_chain.repops.matmul(a, b)``,
``softmax``, ``layer_norm``, ...), so importing ``verde_chain.repops.isa`` does not import torch.
``verde_chain.repops.backends.register(name, fn)`` installs a kernel backend (backends/registry.py).
"""

from __future__ import annotations

import importlib
from typing import Any

_ALIASES = {"sum": "sum_", "abs": "abs_"}
# Only these names are forwarded to ops.py (so ``from verde_chain.repops import fp32`` and other
# submodule imports never trigger the torch import).
_OPS = frozenset(
    ["add", "sub", "mul", "div", "maximum", "minimum", "relu", "neg", "abs", "sqrt", "exp", "log", "tanh", "erf", "sigmoid", "gelu", "relu_backward", "gelu_backward", "matmul", "linear", "sum", "mean", "amax", "amin", "softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "layer_norm", "layer_norm_with_stats", "layer_norm_backward", "cross_entropy", "cross_entropy_backward", "embedding", "embedding_backward", "permute", "transpose", "reshape", "sgd_step", "adam_step", "apply", "register_backend", "BACKENDS"]
)


def __getattr__(name: str) -> Any:
    if name == "backends":  # a subpackage: importable as an attribute too, like before
        return importlib.import_module("verde_chain.repops.backends")
    if name in _OPS:
        ops = importlib.import_module("verde_chain.repops.ops")
        return getattr(ops, _ALIASES.get(name, name))
    raise AttributeError(f"module 'verde_chain.repops' has no attribute {name!r}")

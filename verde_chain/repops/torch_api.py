"""The torch-facing RepOps API: ``verde_chain.repops.matmul(a, b)``, ``softmax(x)``, ...

Each function builds the operator's canonical composition (``repops/library``) and runs its
primitive nodes on the backend registered under ``tensor.device.type``
(``backends/registry.py``: "cpu" the C++ kernels, "cuda" the CUDA kernels, or one installed with
``verde_chain.repops.backends.register(name, fn)``; a node the backend does not handle runs on
the numpy reference). Outputs are on the first input's device. Only float32 tensors are
supported; anything else raises :class:`RepOpsError` naming the op.

``__all__`` is the public surface; ``verde_chain.repops`` forwards exactly these names lazily,
so importing ``verde_chain.repops.isa`` never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops import library
from verde_chain.repops.backends.registry import BackendRunner, lookup
from verde_chain.repops.program import KernelDesc

__all__ = [
    "abs_",
    "adam_step",
    "add",
    "amax",
    "amin",
    "apply",
    "cross_entropy",
    "cross_entropy_backward",
    "div",
    "embedding",
    "embedding_backward",
    "erf",
    "exp",
    "gelu",
    "gelu_backward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_with_stats",
    "linear",
    "log",
    "log_softmax",
    "log_softmax_backward",
    "matmul",
    "maximum",
    "mean",
    "minimum",
    "mul",
    "neg",
    "permute",
    "relu",
    "relu_backward",
    "reshape",
    "sgd_step",
    "sigmoid",
    "softmax",
    "softmax_backward",
    "sqrt",
    "sub",
    "sum_",
    "tanh",
    "transpose",
]  # fmt: skip


def _arrays(op: str, *ts: torch.Tensor) -> list[np.ndarray]:
    out = []
    for t in ts:
        if not isinstance(t, torch.Tensor):
            raise RepOpsError(f"{op}: expected torch tensors, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise RepOpsError(f"{op}: only torch.float32 is supported, got {t.dtype}")
        out.append(t.detach().cpu().contiguous().numpy())
    return out


def apply(comp: library.Composite, *ts: torch.Tensor) -> list[torch.Tensor]:
    """Run a composite on float32 tensors; outputs on the first tensor's device."""
    device = ts[0].device if ts and isinstance(ts[0], torch.Tensor) else torch.device("cpu")
    runner = BackendRunner(lookup(device.type))  # before any copy: a device without a backend is named
    outs = comp.run(_arrays(comp.label, *ts), runner)
    return [torch.from_numpy(np.array(o, dtype=np.float32, copy=True)).to(device) for o in outs]


def _one(desc: KernelDesc, *ts: torch.Tensor) -> torch.Tensor:
    return apply(library.single(desc, [tuple(t.shape) for t in ts]), *ts)[0]


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


# ----------------------------------------------------------------------- elementwise


def _binary(op: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _one(library.binary(op, _shape(a), _shape(b)), a, b)

    f.__name__ = op
    f.__doc__ = f"RepOps {op} with numpy broadcasting (one IEEE binary32 {op} per element)."
    return f


add, sub, mul, div = _binary("add"), _binary("sub"), _binary("mul"), _binary("div")
maximum, minimum = _binary("max"), _binary("min")


def _unary(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        return _one(library.map_unary(name, _shape(x)), x)

    f.__name__ = name
    f.__doc__ = f"RepOps {name} (see docs/repops-spec.md)."
    return f


relu, neg, abs_, sqrt = _unary("relu"), _unary("neg"), _unary("abs"), _unary("sqrt")
exp, log, tanh, erf, sigmoid = _unary("exp"), _unary("log"), _unary("tanh"), _unary("erf"), _unary("sigmoid")


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate not in ("none", "tanh"):
        raise RepOpsError(f"gelu: approximate={approximate!r}; supported 'none' (erf) and 'tanh'")
    return _one(library.gelu(_shape(x), approximate), x)


def relu_backward(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return _one(library.unary_grad("relu_grad", _shape(x)), x, g)


def gelu_backward(x: torch.Tensor, g: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    name = "gelu_tanh_grad" if approximate == "tanh" else "gelu_erf_grad"
    return _one(library.unary_grad(name, _shape(x)), x, g)


# ----------------------------------------------------------------------- linear algebra


def matmul(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False) -> torch.Tensor:
    return _one(library.matmul(_shape(a), _shape(b), trans_a, trans_b), a, b)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ bias) like torch.nn.functional.linear; 2-D x as one gemm node."""
    if x.dim() == 2:
        c = None if bias is None else _shape(bias)
        desc = library.gemm(_shape(x), _shape(w), c, trans_b=True)
        return _one(desc, x, w, *([] if bias is None else [bias]))
    y = matmul(x, w, trans_b=True)
    return y if bias is None else add(y, bias)


# ----------------------------------------------------------------------- reductions


def _reduce(kind: str, x: torch.Tensor, dim: int | Sequence[int] | None, keepdim: bool) -> torch.Tensor:
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    b = library.Builder(f"reduce_{kind}", _shape(x))
    return apply(b.build(b.reduce(kind, 0, dims, keepdim)), x)[0]


def sum_(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _reduce("sum", x, dim, keepdim)


def mean(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _reduce("mean", x, dim, keepdim)


def amax(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _reduce("max", x, dim, keepdim)


def amin(x: torch.Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _reduce("min", x, dim, keepdim)


# ----------------------------------------------------------------------- normalisation, softmax


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return apply(library.softmax(_shape(x), dim), x)[0]


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return apply(library.log_softmax(_shape(x), dim), x)[0]


def softmax_backward(y: torch.Tensor, g: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return apply(library.softmax_backward(_shape(y), dim), y, g)[0]


def log_softmax_backward(y: torch.Tensor, g: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return apply(library.log_softmax_backward(_shape(y), dim), y, g)[0]


def layer_norm(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, eps: float = 1e-5,
) -> torch.Tensor:
    return layer_norm_with_stats(x, normalized_shape, weight, bias, eps)[0]


def layer_norm_with_stats(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, inv_std) with statistics of keepdims shape."""
    axis = x.dim() - len(normalized_shape)
    if tuple(x.shape[axis:]) != tuple(normalized_shape):
        raise RepOpsError(f"layer_norm: normalized_shape {tuple(normalized_shape)} != trailing dims of {_shape(x)}")
    comp = library.layer_norm(_shape(x), axis, eps, weight is not None, bias is not None)
    ins = [x] + [t for t in (weight, bias) if t is not None]
    y, m, s = apply(comp, *ins)
    return y, m, s


def layer_norm_backward(
    x: torch.Tensor, weight: torch.Tensor, mean_: torch.Tensor, inv_std: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) given the forward's saved statistics."""
    axis = x.dim() - weight.dim()
    dx, dw, db = apply(library.layer_norm_backward(_shape(x), axis), x, weight, mean_, inv_std, g)
    return dx, dw, db


# ----------------------------------------------------------------------- loss, embedding


def _labels(op: str, labels: torch.Tensor) -> torch.Tensor:
    if labels.dtype in (torch.int64, torch.int32):
        if labels.numel() and int(labels.abs().max()) >= 2**24:
            raise RepOpsError(f"{op}: labels must be < 2**24 (exact as float32)")
        return labels.to(torch.float32)
    if labels.dtype == torch.float32:
        return labels
    raise RepOpsError(f"{op}: labels must be int32/int64/float32, got {labels.dtype}")


def cross_entropy(scores: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Softmax cross-entropy with class indices (like torch.nn.functional.cross_entropy)."""
    comp = library.softmax_cross_entropy(_shape(scores), reduction)
    return apply(comp, scores, _labels("cross_entropy", labels))[0]


def cross_entropy_backward(
    scores: torch.Tensor, labels: torch.Tensor, g: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    comp = library.softmax_cross_entropy_backward(_shape(scores), reduction)
    return apply(comp, scores, _labels("cross_entropy_backward", labels), g)[0]


def embedding(indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[indices] (Gather on axis 0 via LOADIDX)."""
    idx = _labels("embedding", indices)
    return _one(library.gather(_shape(weight), _shape(idx), 0), weight, idx)


def embedding_backward(indices: torch.Tensor, g: torch.Tensor, num_embeddings: int) -> torch.Tensor:
    """ScatterAdd: dW[v] = sum over positions p ascending of (idx[p] == v ? g[p] : 0)."""
    idx = _labels("embedding_backward", indices).reshape(-1)
    row = tuple(g.shape[indices.dim():])
    desc = library.scatter_add(idx.numel(), row, num_embeddings)
    return _one(desc, g.reshape((idx.numel(),) + row), idx)


# ----------------------------------------------------------------------- shape ops


def permute(x: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
    return _one(library.transpose(_shape(x), perm), x)


def transpose(x: torch.Tensor, d0: int = -2, d1: int = -1) -> torch.Tensor:
    perm = list(range(x.dim()))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute(x, perm)


def reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    return _one(library.reshape(_shape(x), shape), x)


# ----------------------------------------------------------------------- optimizers


def sgd_step(
    p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor, lr: float, momentum: float = 0.0,
    dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, first_step: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    comp = library.sgd(_shape(p), lr, momentum, dampening, weight_decay, nesterov, first_step)
    p2, b2 = apply(comp, p, g, buf)
    return p2, b2


def adam_step(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, lr: float, t: int,
    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
    decoupled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    comp = library.adam(_shape(p), lr, t, betas, eps, weight_decay, decoupled)
    p2, m2, v2 = apply(comp, p, g, m, v)
    return p2, m2, v2

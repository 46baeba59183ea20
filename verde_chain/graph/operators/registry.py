"""The three tables every IR operator is entered in, and the decorators that fill them.

    ONNX_IMPORTERS   ONNX op type -> handler(importer, node): checks the node, emits IR ops
    LOWERINGS        IR op -> rule(builder, op, inputs) -> Saved: the forward primitive nodes
    VJPS             IR op -> rule(builder, op, inputs, saved, g, need) -> gradients per input

The family modules of this package register their operators at import; the ONNX importer
(``graph/onnx_import.py``) and the differentiation driver (``graph/autodiff.py``) only look
operators up here, so adding one never touches them. ``ir.OPS`` is the closed list of IR ops;
``tests/test_graph_import.py`` checks that every one has its rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.ir import OpNode

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


@dataclass
class Saved:
    """What a forward rule leaves for its backward rule: the output and any named extras."""

    out: Ref
    extra: dict[str, Ref] = field(default_factory=dict)


Grads = list["Ref | None"]
OnnxImporter = Callable[["Importer", "onnx.NodeProto"], None]
Lowering = Callable[[GraphBuilder, OpNode, list[Ref]], Saved]
Vjp = Callable[[GraphBuilder, OpNode, list[Ref], Saved, Ref, Sequence[bool]], Grads]

ONNX_IMPORTERS: dict[str, OnnxImporter] = {}
LOWERINGS: dict[str, Lowering] = {}
VJPS: dict[str, Vjp] = {}

F = TypeVar("F", bound=Callable[..., Any])


def _register(table: dict[str, Any], what: str, names: tuple[str, ...]) -> Callable[[F], F]:
    def wrap(fn: F) -> F:
        for name in names:
            if name in table:
                raise RuntimeError(f"{what} {name!r} registered twice")  # a programming error
            table[name] = fn
        return fn

    return wrap


def onnx_op(*op_types: str) -> Callable[[F], F]:
    """Register the importer of these ONNX op types."""
    return _register(ONNX_IMPORTERS, "ONNX op", op_types)


def lowering(*ir_ops: str) -> Callable[[F], F]:
    """Register the forward rule of these IR ops."""
    return _register(LOWERINGS, "lowering of", ir_ops)


def vjp(*ir_ops: str) -> Callable[[F], F]:
    """Register the backward rule (vector-Jacobian product) of these IR ops."""
    return _register(VJPS, "vjp of", ir_ops)

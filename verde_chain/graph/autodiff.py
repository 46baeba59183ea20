"""Lowering of the forward IR to RepOps primitive nodes, and reverse-mode differentiation.

Every IR op has a forward rule (primitive nodes from ``repops.library``) and a backward rule
that emits the primitive nodes of its vector-Jacobian product; both live with the op in
``graph/operators`` and are looked up here. Backward rules run in reverse topological order; a
value used several times gets its gradient contributions summed with ADD nodes in the order they
arrive (that order is fixed by the op order, so it is part of the graph). Only gradients that
reach a parameter are built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError, ShapeMismatchError, UnsupportedModelError
from verde_chain.graph.ir import Model, OpNode
from verde_chain.graph.operators import LOWERINGS, VJPS, Grads, Saved


def forward(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    fn = LOWERINGS.get(op.op)
    if fn is None:
        raise UnsupportedModelError(op.name or op.output, f"IR op {op.op!r} has no lowering", sorted(LOWERINGS))
    return fn(b, op, ins)


def backward(b: GraphBuilder, op: OpNode, ins: list[Ref], saved: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    """Gradients w.r.t. each input of ``op`` (None where not needed)."""
    fn = VJPS.get(op.op)
    if fn is None:
        raise NotDifferentiableError(f"{op.name or op.output}: no backward rule for IR op {op.op!r}", op=op.op)
    return fn(b, op, ins, saved, g, need)


# ======================================================================= whole model


def lower_forward(b: GraphBuilder, model: Model, env: dict[str, Ref]) -> dict[str, Saved]:
    """Emit the forward nodes; ``env`` maps leaf names to Refs and is extended with op outputs."""
    saved: dict[str, Saved] = {}
    for op in model.ops:
        ins = [env[n] for n in op.inputs]
        sv = forward(b, op, ins)
        want = model.shape(op.output)
        if sv.out.shape != want:
            if math.prod(sv.out.shape) != math.prod(want):
                raise ShapeMismatchError(f"{op.name}: lowered shape {sv.out.shape}, model says {want}")
            sv.out = b.view(sv.out, want)
        env[op.output] = sv.out
        saved[op.output] = sv
    return saved


def differentiate(
    b: GraphBuilder, model: Model, env: dict[str, Ref], saved: dict[str, Saved], seeds: dict[str, Ref]
) -> dict[str, Ref]:
    """Reverse mode from ``seeds`` (value name -> gradient). Returns gradients of the params."""
    params = {v.name for v in model.params()}
    requires: set[str] = set(params)
    for op in model.ops:
        if any(n in requires for n in op.inputs):
            requires.add(op.output)
    grads: dict[str, Ref] = {}

    def accumulate(name: str, gr: Ref) -> None:
        have = grads.get(name)
        grads[name] = gr if have is None else b.binary("add", have, b.view(gr, have.shape))

    for name, gr in seeds.items():
        accumulate(name, gr)
    for op in reversed(model.ops):
        g = grads.get(op.output)
        if g is None or op.output not in requires:
            continue
        need = [n in requires for n in op.inputs]
        ins = [env[n] for n in op.inputs]
        res = backward(b, op, ins, saved[op.output], b.view(g, saved[op.output].out.shape), need)
        for n, r, nd in zip(op.inputs, res, need):
            if nd and r is not None:
                accumulate(n, b.view(r, env[n].shape))
    # parameters the loss does not depend on get no entry (torch leaves their .grad None and its
    # optimizers skip them; the training graph carries them unchanged)
    return {p: grads[p] for p in sorted(params, key=list(model.values).index) if p in grads}

"""Peephole rewrites of the finished primitive training graph (graph/fusion.py is the IR-level
counterpart): a node output that exactly one ADD reads is folded into a node that computes the
same instructions per element, so it is no longer written, hashed and read each step. Every
value keeps its bits by construction (the fused program runs the replaced programs' instructions
in their order); only the node list, hence C_s and the graph root, changes.

1. **Summed slice gradients** (``fuse_slice_grad_sums``): autodiff sums the gradient
   contributions of a value with a left-deep chain of same-shape ADDs in arrival order; when a
   value is split (GPT-2's c_attn output into q, k, v) each contribution is a full-size,
   zero-padded ``slice_grad``. A chain ``add(add(l0, l1), l2) ...`` with at least one leaf a
   ``slice_grad`` that only the chain reads becomes ONE map node: leaf 0's program (the
   slice_grad's own, or a LOAD) into r0, then per further leaf its program with r0 renamed to
   a spare register T and ``ADD r0 = r0 + rT``, the chain's operand order. A slice_grad's
   program reads no register before writing it, so running it after other code is the same.
   At most ``MAX_LEAVES`` leaves per node (a longer chain is cut into nodes, each reading the
   previous one's sum as its first leaf: the same left-deep order).
2. **ADD into a dot epilogue** (``fuse_dot_addends``): ``add(dot, X)`` (either side) where the
   dot node (a matmul or gemm the GEMM or row-dot kernel runs, ``backends/plan.py``) has no other
   reader becomes the dot with X as one more input and Gemm's ``+ C`` epilogue
   (``library.addend_epilogue``) appended: ``ADD(dot, X)`` then runs in the epilogue; ADD is
   commutative bit for bit (round to nearest even; any NaN is the canonical NaN). A 2-D matmul
   becomes exactly ``library.gemm(A, B, C=X)``. The node must keep its fast kernel (checked with
   ``plan.classify``): no ADD moves onto the interpreter. On GPT-2 this takes the tied
   embedding's gradient (LM head ``dW`` + the embedding's scatter-add), attention's scores + mask
   and the residual sums after the projection gemms.

3. **A state update into a windowed gradient** (``fuse_state_updates``): a windowed dot chain
   (a convolution's weight gradient, ``repops/windowed.py``) whose output exactly one node loads,
   a K = 1 map that reads every input element for element and produces a carried state (the
   optimizer's momentum update ``sgd_buf``), becomes that chain with the map's program as its
   epilogue: ``MOV rT = r0`` (the chain's result into a register the map does not use), then
   the map's instructions, its LOAD of the gradient a ``MOV`` from rT, its other inputs appended
   (read element for element in the chain's coordinates: the same elements). The fused node
   stands where the chain stood (its other inputs are the previous step's state, so nothing it
   reads comes later, and the chain's inputs are not kept alive until the optimizer runs) and
   produces the state in the map's place. A node that lists the gradient without loading it
   (``sgd_param`` without Nesterov) drops it. The epilogue loads plain inputs only, so the
   chain keeps its windowed GEMM (``windowed.plan``). On resnet18 this takes the 20 convolution
   weight gradients, 44.7 of the 171 MB of node outputs a step writes and hashes.

``peephole(graph)`` runs the three and renumbers (sources, state producers, named outputs, shard
blocks); ``build_training_graph(..., peephole=False)`` builds the graph without it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import cast

from verde_chain.graph.structure import GraphNode, Source, SourceKind, TrainingGraph
from verde_chain.repops import library, windowed
from verde_chain.repops.backends.plan import classify, is_identity, live_in
from verde_chain.repops.isa import NUM_REGS, REG_READS, THREE_REG_OPS, Instr, Op
from verde_chain.repops.library.shapes import c_strides
from verde_chain.repops.program import InputMap, KernelDesc

MAX_LEAVES = 8  # operands of one fused sum: its one-step proof's calldata grows with them
FAST_KINDS = ("dot", "rowdot")  # fast kernels that run an epilogue after the chain
_NODE = SourceKind.NODE_OUTPUT


class _Graph:
    """The node list being rewritten: ``descs[i]`` None once node i is folded into another."""

    def __init__(self, g: TrainingGraph) -> None:
        self.g = g
        self.descs: list[KernelDesc | None] = [n.desc for n in g.nodes]
        self.srcs: list[tuple[Source, ...]] = [n.inputs for n in g.nodes]
        self.labels: list[str] = [n.label for n in g.nodes]
        self.uses = Counter(s.index for n in g.nodes for s in n.inputs if s.kind == _NODE)
        self.named = dict(g.named)
        self.pinned = set(g.named.values()) | {s.producer for s in g.states}
        self.reader: dict[int, int] = {}
        self.moved: dict[int, int] = {}  # a removed node whose output another node now produces
        for n in g.nodes:
            for s in n.inputs:
                if s.kind == _NODE:
                    self.reader[s.index] = n.index

    def single_use(self, s: Source) -> bool:
        """``s`` is a node output read once, by one node of this step, and nowhere else."""
        return s.kind == _NODE and self.uses[s.index] == 1 and s.index not in self.pinned

    def finish(self) -> TrainingGraph:
        keep = [i for i, d in enumerate(self.descs) if d is not None]
        new = {old: i for i, old in enumerate(keep)}
        new.update({old: new[at] for old, at in self.moved.items()})

        def src(s: Source) -> Source:
            return s if s.kind == SourceKind.BATCH else Source(s.kind, new[s.index])

        nodes = []
        for old in keep:
            d = self.descs[old]
            assert d is not None
            same = d is self.g.nodes[old].desc
            h = self.g.nodes[old].desc_hash if same else d.hash()
            nodes.append(GraphNode(new[old], d, h, tuple(src(s) for s in self.srcs[old]), self.labels[old]))
        states = tuple(dataclasses.replace(s, producer=new[s.producer]) for s in self.g.states)

        def shift(i: int) -> int:  # kept nodes before old index i
            return sum(1 for k in keep if k < i)

        return dataclasses.replace(
            self.g, nodes=tuple(nodes), states=states, named={k: new[v] for k, v in self.named.items()},
            shard_blocks=tuple((shift(lo), shift(hi)) for lo, hi in self.g.shard_blocks))


def _identity(shape: Sequence[int]) -> InputMap:
    return InputMap(math.prod(shape), c_strides(tuple(shape)))


def _is_add(d: KernelDesc | None) -> bool:
    """A map node running exactly ``ADD r0 = in0 + in1`` (broadcast maps allowed)."""
    return (d is not None and d.K == 1 and not d.body and not d.epilogue and not d.extended
            and d.prologue == library.binary("add", (), ()).prologue)


def _is_plain_add(d: KernelDesc | None) -> bool:
    """``library.binary("add", s, s)``: both operands read element for element."""
    return d is not None and d == library.binary("add", d.out_shape, d.out_shape)


def _regs(code: Sequence[Instr]) -> set[int]:
    out = set()
    for i in code:
        out.add(i.dst)
        out.update(getattr(i, f) for f in REG_READS[i.op])
    return out


def _rename(code: Sequence[Instr], regs: dict[int, int], slot0: int) -> list[Instr]:
    """``code`` with registers renamed by ``regs`` and input slots shifted by ``slot0``."""
    out = []
    for i in code:
        r = {f: regs.get(getattr(i, f), getattr(i, f)) for f in ("dst", "a", "b")}
        if i.op in THREE_REG_OPS:
            imm = regs.get(i.imm, i.imm)
        elif i.op in (Op.LOAD, Op.LOADIDX):
            imm = i.imm + slot0
        else:
            imm = i.imm
        out.append(Instr(i.op, r["dst"], r["a"], r["b"], imm))
    return out


def _inlinable(gr: _Graph, s: Source, shape: Sequence[int]) -> bool:
    """A slice_grad leaf only the chain reads, in the chain's coordinates, whose program reads no
    register before writing it (so it computes the same wherever it runs)."""
    if not gr.single_use(s):
        return False
    d = gr.descs[s.index]
    return (d is not None and d.label == "slice_grad" and d.K == 1 and not d.body and not d.epilogue
            and not d.extended and d.out_shape == tuple(shape) and not live_in(d.prologue))


def sum_desc(shape: Sequence[int], leaves: Sequence[KernelDesc | None]) -> KernelDesc | None:
    """One map node summing ``leaves`` left to right (``((l0 + l1) + l2) ...``): a KernelDesc
    leaf is inlined (its program, its inputs), None is read element for element from one input.
    None if the programs leave no spare register."""
    progs = [(d.prologue, d.inputs) if d is not None else ((library.load(0, 0),), (_identity(shape),))
             for d in leaves]
    spare = max(max(_regs(p)) for p, _ in progs) + 1
    if spare >= NUM_REGS:
        return None
    code: list[Instr] = []
    inputs: list[InputMap] = []
    for j, (prog, maps) in enumerate(progs):
        code += _rename(prog, {0: spare} if j else {}, len(inputs))
        inputs += maps
        if j:
            code.append(Instr(Op.ADD, 0, 0, spare))  # the chain's add(sum so far, leaf j)
    return KernelDesc(tuple(shape), 1, tuple(inputs), tuple(code), label="slice_grad_sum")


def fuse_slice_grad_sums(gr: _Graph) -> int:
    """Rewrite 1 of the module docstring; returns the number of nodes removed."""
    absorbed = set()
    for i, d in enumerate(gr.descs):
        if _is_plain_add(d) and gr.single_use(Source(_NODE, i)):
            c = gr.reader[i]
            if gr.descs[c] == d and gr.srcs[c][0] == Source(_NODE, i) and gr.srcs[c][1] != Source(_NODE, i):
                absorbed.add(i)
    removed = 0
    for r, d in enumerate(gr.descs):
        if not _is_plain_add(d) or r in absorbed:
            continue
        assert d is not None
        spine = [r]
        while gr.srcs[spine[0]][0].kind == _NODE and gr.srcs[spine[0]][0].index in absorbed:
            spine.insert(0, gr.srcs[spine[0]][0].index)
        leaves = [gr.srcs[spine[0]][0]] + [gr.srcs[a][1] for a in spine]
        inline = [_inlinable(gr, s, d.out_shape) for s in leaves]
        if not any(inline):
            continue
        # cut into nodes of <= MAX_LEAVES leaves, each after the first reading the previous sum
        j, first, prev_at = 0, True, -1
        while j < len(leaves):
            n = MAX_LEAVES if first else MAX_LEAVES - 1
            part, flags = leaves[j:j + n], inline[j:j + n]
            at = spine[j + len(part) - 2]  # the chain's ADD of the part's last leaf
            srcs = [] if first else [Source(_NODE, prev_at)]
            descs: list[KernelDesc | None] = [] if first else [None]
            for s, f in zip(part, flags):
                leaf = gr.descs[s.index] if f else None
                descs.append(leaf)
                srcs += list(gr.srcs[s.index]) if f else [s]
            fused = sum_desc(d.out_shape, descs)
            if fused is None:
                break
            for s, f in zip(part, flags):
                if f:
                    gr.descs[s.index] = None
                    removed += 1
            for a in spine[max(j - 1, 0):j + len(part) - 2]:  # the ADDs of the part's other leaves
                gr.descs[a] = None
                removed += 1
            gr.descs[at], gr.srcs[at], gr.labels[at] = fused, tuple(srcs), "slice_grad_sum"
            j += len(part)
            first, prev_at = False, at
    return removed


def fuse_dot_addends(gr: _Graph) -> int:
    """Rewrite 2 of the module docstring; returns the number of nodes removed."""
    removed = 0
    for i, d in enumerate(gr.descs):
        if not _is_add(d):
            continue
        assert d is not None
        for t in (0, 1):
            s, other = gr.srcs[i][t], gr.srcs[i][1 - t]
            dot = gr.descs[s.index] if gr.single_use(s) else None
            if dot is None or s == other or d.inputs[t] != _identity(d.out_shape):
                continue
            kind = classify(dot).kind
            if kind not in FAST_KINDS:
                continue
            if dot.out_shape == d.out_shape:
                cmap = d.inputs[1 - t]
            elif d.inputs[1 - t] == _identity(d.out_shape):
                cmap = _identity(dot.out_shape)  # the same elements in the dot's coordinates
            else:
                continue
            new = dataclasses.replace(dot, inputs=(*dot.inputs, cmap),
                                      epilogue=(*dot.epilogue, *library.addend_epilogue(len(dot.inputs))))
            if classify(new).kind != kind:
                continue
            gr.descs[i], gr.srcs[i] = new, (*gr.srcs[s.index], other)
            gr.labels[i] = f"{gr.labels[s.index]}+add"
            gr.descs[s.index] = None
            removed += 1
            break
    return removed


_LOADS = (Op.LOAD, Op.LOADIDX)


def _live(code: Sequence[Instr]) -> tuple[Instr, ...]:
    """A K = 1 map's program without the instructions whose result never reaches r0 (the
    value; a LOAD reads in range by validation, so dropping one changes nothing)."""
    live, keep = {0}, []
    for i in reversed(code):
        if i.dst in live:
            live.discard(i.dst)
            live.update(getattr(i, f) for f in REG_READS[i.op])
            keep.append(i)
    return tuple(reversed(keep))


def _is_map(d: KernelDesc) -> bool:
    return d.K == 1 and not d.body and not d.epilogue and not d.extended


def _uses(d: KernelDesc, slot: int) -> bool:
    """Whether ``d``'s value depends on its input ``slot`` (a map's dead loads do not count)."""
    code = _live(d.prologue) if _is_map(d) else (*d.prologue, *d.body, *d.epilogue)
    return any(i.op in _LOADS and i.imm == slot for i in code)


def _without_inputs(d: KernelDesc, slots: set[int]) -> KernelDesc:
    """``d`` without the input ``slots``, which its value does not depend on (a map loses its
    dead instructions first), later slots renumbered."""
    if _is_map(d):
        d = dataclasses.replace(d, prologue=_live(d.prologue))

    def fix(code: Sequence[Instr]) -> tuple[Instr, ...]:
        return tuple(Instr(i.op, i.dst, i.a, i.b, i.imm - sum(1 for t in slots if t < i.imm)) if i.op in _LOADS else i
                     for i in code)
    return dataclasses.replace(d, inputs=tuple(m for t, m in enumerate(d.inputs) if t not in slots),
                               prologue=fix(d.prologue), body=fix(d.body), epilogue=fix(d.epilogue))


def update_epilogue(chain: KernelDesc, update: KernelDesc, slot: int) -> KernelDesc | None:
    """``chain`` with the K = 1 map ``update`` (which reads its input ``slot``, the chain's output,
    and every input element for element) run as its epilogue; the update's other inputs appended
    in order. None when the update uses every register or loads by index."""
    if any(i.op == Op.LOADIDX for i in update.prologue):
        return None
    spare = max(_regs(update.prologue) | {0}) + 1
    if spare >= NUM_REGS:
        return None
    others = [t for t in range(len(update.inputs)) if t != slot]
    at = {t: len(chain.inputs) + j for j, t in enumerate(others)}
    code = [Instr(Op.MOV, spare, 0)]
    for i in update.prologue:
        if i.op == Op.LOAD:
            i = Instr(Op.MOV, i.dst, spare) if i.imm == slot else Instr(Op.LOAD, i.dst, imm=at[i.imm])
        code.append(i)
    own = _identity(chain.out_shape)  # the same elements, in the chain's coordinates
    return dataclasses.replace(chain, inputs=(*chain.inputs, *(own for _ in others)),
                               epilogue=(*chain.epilogue, *code))


def fuse_state_updates(gr: _Graph) -> int:
    """Rewrite 3 of the module docstring; returns the number of nodes removed. Runs last: it
    leaves ``uses`` and ``reader`` stale."""
    readers: dict[int, list[tuple[int, int]]] = {}
    for n, srcs in enumerate(gr.srcs):
        if gr.descs[n] is not None:
            for t, s in enumerate(srcs):
                if s.kind == _NODE:
                    readers.setdefault(s.index, []).append((n, t))
    producers = {s.producer for s in gr.g.states}
    states = producers - set(gr.named.values())
    names: dict[int, list[str]] = {}
    for k, v in gr.named.items():
        names.setdefault(v, []).append(k)
    removed = 0
    for i, d in enumerate(gr.descs):
        # the chain may be named only as a gradient (``grad:<param>``, for tests and debugging)
        grad_names = names.get(i, [])
        if (d is None or not d.extended or i in producers or not all(k.startswith("grad:") for k in grad_names)
                or windowed.plan(d) is None):
            continue
        rs = readers.get(i, [])
        loading = [(n, t) for n, t in rs if _uses(cast(KernelDesc, gr.descs[n]), t)]
        if len(loading) != 1:
            continue
        m, t = loading[0]
        u = gr.descs[m]
        if (u is None or m not in states or sum(1 for n, _ in rs if n == m) != 1 or u.K != 1 or u.body
                or u.epilogue or u.extended or u.numel != d.numel or live_in(u.prologue)
                or not all(is_identity(mp, u.out_shape) for mp in u.inputs)
                or any(s.kind == _NODE and s.index >= i for k, s in enumerate(gr.srcs[m]) if k != t)):
            continue
        fused = update_epilogue(d, u, t)
        if fused is None or windowed.plan(fused) is None:
            continue
        for n in {n for n, _ in rs if n != m}:  # readers that list the gradient without loading it
            dead = {k for k, s in enumerate(gr.srcs[n]) if s == Source(_NODE, i)}
            gr.descs[n] = _without_inputs(cast(KernelDesc, gr.descs[n]), dead)
            gr.srcs[n] = tuple(s for k, s in enumerate(gr.srcs[n]) if k not in dead)
        for k in grad_names:  # the gradient is no longer a tensor of the step
            del gr.named[k]
        gr.descs[i] = fused
        gr.srcs[i] = (*gr.srcs[i], *(s for k, s in enumerate(gr.srcs[m]) if k != t))
        gr.labels[i] = f"{gr.labels[i]}+{gr.labels[m].rsplit('/', 1)[-1]}"
        gr.descs[m] = None
        gr.moved[m] = i
        removed += 1
    return removed


def peephole(graph: TrainingGraph) -> TrainingGraph:
    """The three rewrites of the module docstring over a finished training graph."""
    gr = _Graph(graph)
    fuse_slice_grad_sums(gr)
    fuse_dot_addends(gr)
    fuse_state_updates(gr)
    return gr.finish()

"""Which fast kernel runs a node: every node is classified by the STRUCTURE of its program (the
CPU and CUDA backends plan with this one module, each taking the kinds it has kernels for)::

    dot    prologue  LOAD x<-A; LOAD y<-B; MUL r0 = x*y          -> GEMM, then the epilogue
           body      LOAD x<-A; LOAD y<-B; FMA r0 = x*y + r0        (alpha, +C*beta ...) on the
                                                                    interpreter
    fold   prologue  LOAD r0<-X                                  -> a reduction over the last axis
           body      LOAD x<-X; ADD|MAX|MIN r0 = r0 (op) x          (sum/max/min), then the
                                                                    epilogue (mean's /K)
    binary LOAD r0<-A; LOAD r1<-B; ADD|SUB|MUL|DIV|MAX|MIN       -> a vector binary kernel
           (K = 1, both inputs laid out exactly like the output)
    scatter exactly library.scatter_add's program and maps        -> bucketed scatter-add, O(P*R +
           (embedding backward; at most 2^24 rows)                  V*R) instead of O(P*V*R)
    rowdot a dot (or a square: LOAD x<-X; MUL r0 = x*x, FMA)     -> per-row dot chains (the norms'
           whose output is not GEMM-shaped, rows read linearly     variance, mean square and
                                                                   backward sums), then the epilogue
    program anything else                                        -> the interpreter (the CPU
                                                                    backend compiles long maps,
                                                                    backends/cpu/jit.py)

Why match the program rather than the label or the shapes: the label is not part of the hash,
so a node could carry any label; and regenerating ``library.matmul``/``library.gemm`` descs for
guessed shapes would miss squeezed vectors, broadcast batches and gemm epilogues. The program plus the
input maps ARE the semantics: a dot program with affine maps computes
``out[c] = chain_k A[offA + c.sA + k*kA] * B[offB + c.sB + k*kB]`` whatever produced it, and
the strided views below are built from those very maps, so the fast kernel reads exactly the
addresses the spec reads. A fast kernel only takes the prologue and body; an epilogue runs on the
interpreter with r0 preset, and only if it reads no register but r0 before writing it (so the
registers the fast kernel does not model cannot matter).

Cases deliberately left to the interpreter (the fast kernels would differ or gain nothing):
K = 1 folds (the spec returns the raw loaded bits, including non-canonical NaN payloads, while
the reduce kernel canonicalises), dots without a GEMM-shaped output whose rows are not read
linearly (the rowdot kernel takes reduce_dot and GEMV shapes otherwise), negative strides (torch views
cannot express them), binaries with broadcast inputs (compiled maps read them in place).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from verde_chain.repops.backends.cpu.codes import BinOp, ReduceOp
from verde_chain.repops.isa import REG_READS, Instr, Op
from verde_chain.repops.program import InputMap, KernelDesc

_FOLD_OPS = {Op.ADD: ReduceOp.SUM, Op.MAX: ReduceOp.MAX, Op.MIN: ReduceOp.MIN}
_BINARY_OPS = {Op.ADD: BinOp.ADD, Op.SUB: BinOp.SUB, Op.MUL: BinOp.MUL, Op.DIV: BinOp.DIV, Op.MAX: BinOp.MAX,
               Op.MIN: BinOp.MIN}  # fmt: skip
# Rows a scatter-add kernel handles: row v is matched by EQ(idx, fl32(v)), exact up to 2^24.
MAX_SCATTER_ROWS = 1 << 24
ALL_KINDS = frozenset({"dot", "fold", "binary", "scatter", "rowdot"})


def live_in(program: Sequence[Instr]) -> frozenset[int]:
    """Registers ``program`` reads before writing them (its inputs from earlier phases)."""
    written: set[int] = set()
    reads: set[int] = set()
    for ins in program:
        for field in REG_READS[ins.op]:
            r = getattr(ins, field)
            if r not in written:
                reads.add(r)
        written.add(ins.dst)
    return frozenset(reads)


def _is_load(ins: Instr, dst: int | None = None) -> bool:
    return ins.op == Op.LOAD and (dst is None or ins.dst == dst)


@dataclass(frozen=True)
class Plan:
    kind: str  # "dot" | "fold" | "binary" | "scatter" | "rowdot" | "program"
    slots: tuple[int, ...] = ()  # input slots the fast kernel reads
    op: ReduceOp | BinOp | None = None  # fold: the reduction; binary: the instruction
    # dot / fold: torch views (size, stride, offset) of the fast kernel's operands, built from
    # the input maps: dot (batch, M, K) and (batch, K, N) after reshape; fold and rowdot (rows, K)
    views: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()  # the 3-D / 2-D shapes the views are reshaped to


def _match_dot(desc: KernelDesc) -> tuple[int, int] | None:
    """(slot A, slot B) if the prologue/body are the spec's dot chain (any registers)."""
    pro, body = desc.prologue, desc.body
    if len(pro) != 3 or not (_is_load(pro[0]) and _is_load(pro[1])):
        return None
    x, y, sa, sb = pro[0].dst, pro[1].dst, pro[0].imm, pro[1].imm
    if len({x, y, 0}) != 3 or pro[2] != Instr(Op.MUL, 0, x, y):
        return None
    if desc.K > 1 and body != (Instr(Op.LOAD, x, imm=sa), Instr(Op.LOAD, y, imm=sb), Instr(Op.FMA, 0, x, y, 0)):
        return None
    return sa, sb


def _dot_plan(desc: KernelDesc, sa: int, sb: int) -> Plan | None:
    """GEMM geometry of a dot node: N = last output dim if A is constant along it (and B is
    not), M = the dim before it (or the last) where B is constant (and A is not), the dims in
    front of them are batch dims. None (interpreter) when the output is not GEMM-shaped: no M
    and no N (reduce_dot), or M = 1 or N = 1 (a GEMV pads the GEMM's 12 x 32 tile: the row
    kernel takes it). Batch dims may have any (non-negative) strides, 0 included."""
    am, bm = desc.inputs[sa], desc.inputs[sb]
    shape, K = desc.out_shape, desc.K
    d = len(shape) - 1
    n_dim = m_dim = None
    if d >= 0 and am.strides[d] == 0 and bm.strides[d] != 0:
        n_dim, d = d, d - 1
    if d >= 0 and bm.strides[d] == 0 and am.strides[d] != 0:
        m_dim, d = d, d - 1
    if m_dim is None or n_dim is None or shape[m_dim] == 1 or shape[n_dim] == 1:
        return None
    batch = list(range(d + 1))
    M, N = shape[m_dim], shape[n_dim]
    bsize = tuple(shape[i] for i in batch)
    nb = math.prod(bsize)
    a_view = ((*bsize, M, K), (*(am.strides[i] for i in batch), am.strides[m_dim], am.kstride), am.offset)
    b_view = ((*bsize, K, N), (*(bm.strides[i] for i in batch), bm.kstride, bm.strides[n_dim]), bm.offset)
    return Plan("dot", (sa, sb), views=(a_view, b_view), shapes=((nb, M, K), (nb, K, N)))


def _match_square(desc: KernelDesc) -> int | None:
    """The input slot if the prologue/body are the spec's sum-of-squares chain (reduce_meansq,
    sumsq): ``LOAD x<-t; MUL r0 = x*x`` then ``LOAD x<-t; FMA r0 = x*x + r0`` (x != r0)."""
    pro, body = desc.prologue, desc.body
    if len(pro) != 2 or not _is_load(pro[0]) or pro[0].dst == 0 or pro[1] != Instr(Op.MUL, 0, pro[0].dst, pro[0].dst):
        return None
    x = pro[0].dst
    if desc.K > 1 and body != (pro[0], Instr(Op.FMA, 0, x, x, 0)):
        return None
    return pro[0].imm


def _rowdot_plan(desc: KernelDesc, sa: int, sb: int) -> Plan | None:
    """Rows of a dot chain read linearly (address offset + r*sr + k*kstride for flat output r):
    the row kernel's (rows, K) views; None when a map is not linear in the output."""
    views = []
    for slot in (sa, sb):
        m = desc.inputs[slot]
        sr = linear_stride(m, desc.out_shape)
        if sr is None:
            return None
        views.append(((desc.numel, desc.K), (sr, m.kstride), m.offset))
    return Plan("rowdot", (sa, sb), views=tuple(views), shapes=((desc.numel, desc.K),) * 2)


def _is_scatter_add(desc: KernelDesc) -> bool:
    """The node is ``library.scatter_add`` with no leading block (embedding backward) exactly:
    the program and maps the library builds for its shape, so the scatter kernel computes the
    very same chain (a leading block, Gather's backward on a later axis, runs as a program)."""
    if len(desc.out_shape) < 1 or len(desc.inputs) != 2 or not 1 <= desc.out_shape[0] <= MAX_SCATTER_ROWS:
        return False
    from verde_chain.repops import library

    ref = library.scatter_add(desc.K, desc.out_shape[1:], desc.out_shape[0])
    return (ref.out_shape, ref.K, ref.inputs, ref.prologue, ref.body, ref.epilogue) == (
        desc.out_shape, desc.K, desc.inputs, desc.prologue, desc.body, desc.epilogue
    )



def classify(desc: KernelDesc, kinds: frozenset[str] = ALL_KINDS) -> Plan:
    """The fast kernel for ``desc`` among ``kinds`` (a backend's), else ``Plan("program")``."""
    if any(s < 0 for m in desc.inputs for s in (*m.strides, m.kstride)):
        return Plan("program")
    if "scatter" in kinds and _is_scatter_add(desc):
        return Plan("scatter", (0, 1))
    epi_ok = live_in(desc.epilogue) <= {0}
    dot = _match_dot(desc) if "dot" in kinds else None
    if dot is not None and epi_ok:
        plan = _dot_plan(desc, *dot)
        if plan is not None:
            return plan
    if "rowdot" in kinds and epi_ok:
        pair = dot if dot is not None else _match_dot(desc)
        square = _match_square(desc) if pair is None else None
        if square is not None:
            pair = (square, square)
        plan = None if pair is None else _rowdot_plan(desc, *pair)
        if plan is not None:
            return plan
    pro, body = desc.prologue, desc.body
    if (
        "fold" in kinds
        and desc.K > 1
        and epi_ok
        and len(pro) == 1
        and _is_load(pro[0], 0)
        and len(body) == 2
        and _is_load(body[0])
        and body[0].imm == pro[0].imm
        and body[0].dst != 0
        and body[1].op in _FOLD_OPS
        and body[1].dst == 0
        and {body[1].a, body[1].b} == {0, body[0].dst}
    ):
        m = desc.inputs[pro[0].imm]
        view = ((*desc.out_shape, desc.K), (*m.strides, m.kstride), m.offset)
        return Plan("fold", (pro[0].imm,), _FOLD_OPS[body[1].op], (view,), ((desc.numel, desc.K),))
    if (
        "binary" in kinds
        and desc.K == 1
        and not desc.epilogue
        and len(pro) == 3
        and pro[0] == Instr(Op.LOAD, 0, imm=0)
        and pro[1] == Instr(Op.LOAD, 1, imm=1)
        and pro[2].op in _BINARY_OPS
        and (pro[2].dst, pro[2].a, pro[2].b) == (0, 0, 1)
        and all(is_identity(m, desc.out_shape) for m in desc.inputs)
    ):
        return Plan("binary", (0, 1), _BINARY_OPS[pro[2].op])
    return Plan("program")


def is_identity(m: InputMap, shape: tuple[int, ...]) -> bool:
    """The map reads a C-contiguous tensor of exactly the output's shape, element for element
    (the stride of a size-1 dim is never used, so it may be anything)."""
    acc, ok = 1, m.offset == 0 and m.numel == math.prod(shape)
    for d in reversed(range(len(shape))):
        ok = ok and (shape[d] == 1 or m.strides[d] == acc)
        acc *= shape[d]
    return ok




def linear_stride(m: InputMap, shape: tuple[int, ...]) -> int | None:
    """s if the map reads address offset + e*s for flat output element e, else None."""
    live = [d for d in range(len(shape)) if shape[d] > 1]
    if not live:
        return 0
    s, acc = m.strides[live[-1]], 1
    for d in reversed(range(len(shape))):
        if shape[d] > 1 and m.strides[d] != s * acc:
            return None
        acc *= shape[d]
    return s


def periodic_map(m: InputMap, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(s, q, p) if the map reads address ``offset + ((e // q) % p) * s`` for flat output element
    e, else None: the output dims (size-1 dims ignored) split, innermost first, into a block the
    map is constant along (q elements: a statistic broadcast along its row), a block it reads
    linearly with stride s (p elements), and an outer block it is constant along again (a row
    of scale or bias broadcast over the rows). linear_stride's maps are (s, 1, numel)."""
    live = [d for d in reversed(range(len(shape))) if shape[d] > 1]
    i, q = 0, 1
    while i < len(live) and m.strides[live[i]] == 0:
        q *= shape[live[i]]
        i += 1
    if i == len(live):
        return 0, 1, 1  # one address: a scalar broadcast
    s, p = m.strides[live[i]], 1
    while i < len(live) and m.strides[live[i]] == s * p:
        p *= shape[live[i]]
        i += 1
    if any(m.strides[d] != 0 for d in live[i:]):
        return None
    return s, q, p


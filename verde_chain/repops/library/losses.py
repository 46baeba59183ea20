"""Losses as compositions: ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, forward
and backward.

Labels are float32 integral values (class ids) read with LOADIDX, so a label out of range gives
NaN rather than reading another class. Shapes follow ONNX: scores (N, C, d..), labels (N, d..),
optional class weights (C,).
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, coord, load, loadidx
from verde_chain.repops.library.composite import Builder, Composite
from verde_chain.repops.library.nn import log_softmax_code, log_softmax_terms, softmax_terms
from verde_chain.repops.library.shapes import Shape, as_shape, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc

REDUCTIONS = ("mean", "sum", "none")

# softmax_cross_entropy's nll node reads the scores, m and log(s) (no log_softmax node unless
# its log_prob output is wanted). Off only to build the composite as it was before (nll reading
# the log_softmax node), so tests can compare the two bit for bit.
NLL_FROM_SCORES = True


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise RepOpsError(f"{op}: reduction {reduction!r} not in mean/sum/none")


def _weights(b: Builder, lab: int, wts: int | None, lshape: Shape, C: int, ignore_index: int | None) -> int:
    """The ``ce_weight`` node: w[n, d] = W[label] (or 1), +0 where ignored, the weights the mean
    divides by (their sum). The backward's count of the positions not ignored is the same node
    (no weights), so a training graph builds it once."""
    lmap0 = InputMap(numel(lshape), c_strides(lshape))
    wmaps: tuple[InputMap, ...]
    if wts is not None:
        wmaps = (lmap0, InputMap(C, (0,) * len(lshape), 0, 0, 1))
        wcode: list[Instr] = [load(0, 0), loadidx(1, 0, 1)]  # r1 = W[label]
    else:
        wmaps = (lmap0,)
        wcode = [load(0, 0), const(1, 1.0)]
    if ignore_index is not None:
        wcode += [
            const(7, float(ignore_index)),
            I(Op.EQ, 7, 0, 7),  # r7 = label == ignore_index
            const(6, 0.0),
            I(Op.SELECT, 1, 7, 6, 1),  # ignored: +0
        ]
    wcode.append(I(Op.MOV, 0, 1))
    wdesc = KernelDesc(lshape, 1, wmaps, tuple(wcode), label="ce_weight")
    return b.node(wdesc, lab, wts) if wts is not None else b.node(wdesc, lab)


def _nll_tail(
    b: Builder, src: int, lab: int, wts: int | None, ss: Shape, reduction: str, ignore_index: int | None,
    lse: tuple[int, int] | None = None,
) -> int:
    """Append the NLL nodes; returns the loss value. ``src`` (N, C, d..) holds log-probabilities,
    or with ``lse`` = (m, log(s)) of the softmax over axis 1 the scores themselves: then the
    ``nll`` node computes the label's log-probability ``(x[label] - m) - log(s)`` (the
    log_softmax node's instructions on that one element, so the same bits) and no full-size
    log_softmax output is needed."""
    _check_reduction("nll", reduction)
    C = ss[1]
    lshape = (ss[0],) + ss[2:]
    inner = c_strides(ss)
    rest = numel(ss[2:])
    # nll[n, d] = -src[n, label[n,d], d] : data map strides (N: C*rest, d..: inner) ; idx stride rest
    dmap = InputMap(numel(ss), (inner[0],) + inner[2:], 0, 0, rest)
    lmap = InputMap(numel(lshape), c_strides(lshape))
    maps = [dmap, lmap]
    args = [src, lab]
    # registers: r1 = label (kept to the end for the weight lookup), r0 = -lsm[label] (* W[label]),
    # r2 = W[label], r3 = m, r4 = log(s); r7 = "label is ignored" and r6 = +0, high enough to
    # stay clear of all of them
    code: list[Instr] = [load(1, 1)]
    if ignore_index is not None:
        code += [const(7, float(ignore_index)), I(Op.EQ, 7, 1, 7)]  # r7 = label == ignore_index
    code.append(loadidx(0, 1, 0))  # r0 = src[n, label, d]
    if lse is not None:  # m and log(s) (N, 1, d..): one value per position, read like the labels
        maps += [lmap, lmap]
        args += list(lse)
        code += [load(3, 2), load(4, 3), *log_softmax_code(0, 3, 4)]  # r0 = lsm[n, label, d]
    code.append(I(Op.NEG, 0, 0))
    if wts is not None:
        code += [loadidx(2, 1, len(maps)), I(Op.MUL, 0, 0, 2)]  # r0 *= W[label]
        maps.append(InputMap(C, (0,) * len(lshape), 0, 0, 1))
        args.append(wts)
    if ignore_index is not None:
        code += [const(6, 0.0), I(Op.SELECT, 0, 7, 6, 0)]  # ignored: +0
    nll = b.node(KernelDesc(lshape, 1, tuple(maps), tuple(code), label="nll"), *args)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return b.reduce("sum", nll, None, keepdims=False)
    if wts is None and ignore_index is None:
        return b.reduce("mean", nll, None, keepdims=False)
    w = _weights(b, lab, wts, lshape, C, ignore_index)
    num = b.reduce("sum", nll, None, keepdims=False)
    den = b.reduce("sum", w, None, keepdims=False)
    return b.binary("div", num, den)


def nll_loss(
    logp_shape: Sequence[int], reduction: str = "mean", weights: bool = False, ignore_index: int | None = None
) -> Composite:
    """ONNX NegativeLogLikelihoodLoss. inputs (log_prob (N,C,d..), labels (N,d..) as float32
    integral values[, weights (C,)]) -> loss. The nodes are those ``softmax_cross_entropy``
    appends after its softmax terms, its ``nll`` reading log-probabilities instead of scores."""
    ss = as_shape(logp_shape)
    if len(ss) < 2:
        raise RepOpsError(f"nll_loss: log-probabilities must be (N, C, ...), got {ss}")
    lshape = (ss[0],) + ss[2:]
    b = Builder("nll_loss", ss, lshape, *([(ss[1],)] if weights else []))
    return b.build(_nll_tail(b, 0, 1, 2 if weights else None, ss, reduction, ignore_index))


def softmax_cross_entropy(
    scores_shape: Sequence[int],
    reduction: str = "mean",
    weights: bool = False,
    ignore_index: int | None = None,
) -> Composite:
    """ONNX SoftmaxCrossEntropyLoss. inputs (scores (N,C,d..), labels (N,d..) as float32
    integral values[, weights (C,)]); outputs (loss, log_prob).

    lsm = log_softmax over axis 1; nll = -lsm[n, label, d..], computed in the nll node from
    the label's score (LOADIDX), m and log(s) (``_nll_tail``): a graph that wants only the loss
    (training: ``want=[0]``) builds no full-size log_softmax node. With weights w = W[label]
    (LOADIDX), nll *= w; ignored labels give nll = +0 and w = +0. mean = sum(nll) / sum(w), or
    reduce_mean(nll) when neither weights nor ignore_index are given.
    """
    ss = as_shape(scores_shape)
    if len(ss) < 2:
        raise RepOpsError(f"softmax_cross_entropy: scores must be (N, C, ...), got {ss}")
    _check_reduction("softmax_cross_entropy", reduction)
    C = ss[1]
    lshape = (ss[0],) + ss[2:]
    ins = [ss, lshape] + ([(C,)] if weights else [])
    b = Builder("softmax_cross_entropy", *ins)
    x, lab = 0, 1
    m, logs = log_softmax_terms(b, x, (1,))
    lsm = b.map("log_softmax", log_softmax_code(0, 1, 2), x, m, logs)  # as nn.log_softmax's last node
    lse = (m, logs) if NLL_FROM_SCORES else None
    loss = _nll_tail(b, x if lse else lsm, lab, 2 if weights else None, ss, reduction, ignore_index, lse)
    return b.build(loss, lsm)


def softmax_cross_entropy_backward(
    scores_shape: Sequence[int], reduction: str = "mean", ignore_index: int | None = None
) -> Composite:
    """inputs (scores, labels, g (scalar, or per-sample for 'none')) -> dscores.

    p = softmax(scores) = e / s (the softmax's terms, ``nn.softmax_terms``); dx = (p - onehot) *
    g [/ fl32(N*d..) for mean], onehot = EQ(label, COORD(axis 1)). The softmax's last division
    is the first instruction of the one map node, so p is never stored (the same bits as the
    softmax composition's div node). With ``ignore_index``: ignored positions get +0, and the
    mean divides by the number of the others (the sum of the forward's weights w without class
    weights: the same nodes, so a training graph builds them once) instead of fl32(N*d..).
    """
    ss = as_shape(scores_shape)
    lshape = (ss[0],) + ss[2:]
    gshape = lshape if reduction == "none" else ()
    b = Builder("softmax_cross_entropy_backward", ss, lshape, gshape)
    x, lab, g = b.inputs()
    _, e, s = softmax_terms(b, x, (1,))
    code = [
        load(0, 0),  # r0 = e
        load(1, 1),  # r1 = s
        I(Op.DIV, 0, 0, 1),  # r0 = p = e / s
        load(1, 2),  # r1 = label
        load(2, 3),  # r2 = g
        coord(3, 1),  # r3 = this element's class c
        I(Op.EQ, 4, 1, 3),  # r4 = onehot = (label == c)
        I(Op.SUB, 0, 0, 4),
        I(Op.MUL, 0, 0, 2),  # (p - onehot) * g
    ]
    # s (N, 1, d..) and the labels (N, d..): one value per position, broadcast over the classes
    row_map = InputMap(numel(lshape), (c_strides(lshape)[0], 0) + c_strides(lshape)[1:])
    g_map = InputMap(1, (0,) * len(ss)) if reduction != "none" else row_map
    maps = [InputMap(numel(ss), c_strides(ss)), row_map, row_map, g_map]
    args = [e, s, lab, g]
    if ignore_index is None:
        if reduction == "mean":
            code += [const(5, float(numel(lshape))), I(Op.DIV, 0, 0, 5)]  # / fl32(N*d..)
    else:
        if reduction == "mean":  # r5 = the count of positions not ignored: the forward's sum(w)
            kept = _weights(b, lab, None, lshape, ss[1], ignore_index)
            args.append(b.reduce("sum", kept, None, keepdims=False))
            maps.append(InputMap(1, (0,) * len(ss)))
            code += [load(5, 4), I(Op.DIV, 0, 0, 5)]
        code += [const(6, float(ignore_index)), I(Op.EQ, 7, 1, 6), const(6, 0.0), I(Op.SELECT, 0, 7, 6, 0)]
    desc = KernelDesc(ss, 1, tuple(maps), tuple(code), label="ce_bwd")
    return b.build(b.node(desc, *args))

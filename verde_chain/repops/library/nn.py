"""Normalisation layers as compositions: softmax, log-softmax, layer norm, and their backward.

Each forward is the node sequence a training graph commits to (max-subtracted softmax, two-pass
layer norm with the variance as a mean of squares in dot order); each ``*_backward`` is the
vector-Jacobian product from the forward's saved outputs (RMSNorm likewise). A new
normalisation (BatchNorm) belongs here, as a forward and backward pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, transcendental
from verde_chain.repops.library.composite import Builder, Composite
from verde_chain.repops.library.conv import channel_centered_meansq, channel_dot_xhat, channel_mean, channel_sum
from verde_chain.repops.library.shapes import Shape, as_shape, normalize_axes


def _norm_axes(shape: Shape, axis: int | Sequence[int]) -> tuple[int, ...]:
    return normalize_axes("axis", [axis] if isinstance(axis, int) else axis, len(shape))


def softmax_terms(b: Builder, x: int, axes: tuple[int, ...]) -> tuple[int, int, int]:
    """m = max(x); e = exp(x - m) (one node: x - m is never stored); s = sum(e). Returns (m, e, s)."""
    m = b.reduce("max", x, axes)
    e = b.map("sub_exp", (I(Op.SUB, 0, 0, 1),) + transcendental("exp"), x, m)
    return m, e, b.reduce("sum", e, axes)


def softmax(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """m = max; e = exp(x - m) (one node); s = sum(e); y = e / s."""
    b = Builder("softmax", shape)
    (x,) = b.inputs()
    _, e, s = softmax_terms(b, x, _norm_axes(b.shape(x), axis))
    return b.build(b.binary("div", e, s))


def log_softmax_terms(b: Builder, x: int, axes: tuple[int, ...]) -> tuple[int, int]:
    """The softmax's terms (``softmax_terms``) and log(s): returns (m, log(s))."""
    m, _, s = softmax_terms(b, x, axes)
    return m, b.unary("log", s)


def log_softmax_code(x: int, m: int, logs: int) -> tuple[Instr, ...]:
    """``r_x = (r_x - r_m) - r_logs``: one element of log_softmax from the registers holding x,
    m and log(s). The cross-entropy's ``nll`` node runs it on the label's score only."""
    return (I(Op.SUB, x, x, m), I(Op.SUB, x, x, logs))


def log_softmax(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """m = max; s = sum(exp(x - m)); y = (x - m) - log(s). ``x - m`` is computed twice (in the
    sub_exp node and in the last one) rather than stored: the same bits as a stored difference
    would give, and one full-size node output less."""
    b = Builder("log_softmax", shape)
    (x,) = b.inputs()
    m, logs = log_softmax_terms(b, x, _norm_axes(b.shape(x), axis))
    return b.build(b.map("log_softmax", log_softmax_code(0, 1, 2), x, m, logs))  # r0 = x, r1 = m, r2 = log(s)


def softmax_backward(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """inputs (y, g): s = sum(g*y) (dot order), dx = y * (g - s)."""
    b = Builder("softmax_backward", shape, shape)
    y, g = b.inputs()
    s = b.reduce_dot(g, y, _norm_axes(b.shape(y), axis))
    # r0 = y, r1 = g, r2 = s
    return b.build(b.map("softmax_bwd", (I(Op.SUB, 1, 1, 2), I(Op.MUL, 0, 0, 1)), y, g, s))


def log_softmax_backward(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """inputs (y, g): s = sum(g); dx = g - exp(y) * s."""
    b = Builder("log_softmax_backward", shape, shape)
    y, g = b.inputs()
    s = b.reduce("sum", g, _norm_axes(b.shape(y), axis))
    e = b.unary("exp", y)
    # r0 = exp(y), r1 = g, r2 = s
    return b.build(b.map("log_softmax_bwd", (I(Op.MUL, 0, 0, 2), I(Op.SUB, 0, 1, 0)), e, g, s))


def _inv_sqrt_code(eps: float) -> tuple[Instr, ...]:
    """r0 = 1 / sqrt(r0 + eps): the statistic of layer norm (variance) and RMS norm (mean square)."""
    return (
        const(1, eps),
        I(Op.ADD, 0, 0, 1),  # var + eps
        I(Op.SQRT, 0, 0),
        const(1, 1.0),
        I(Op.DIV, 0, 1, 0),  # 1 / sqrt(var + eps)
    )


def layer_norm(
    shape: Sequence[int], axis: int = -1, eps: float = 1e-5, scale: bool = True, bias: bool = True
) -> Composite:
    """inputs (x[, scale][, bias]); outputs (y, mean, inv_std), all statistics keepdims.

    mean = reduce_mean(x); c = x - mean; var = reduce_meansq(c) (MUL/FMA chain, / fl32(K));
    inv_std = 1 / sqrt(var + eps); y = ((c * inv_std) * scale) + bias.
    """
    shp = as_shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    nshape = shp[ax0:]
    ins = [shp] + ([nshape] if scale else []) + ([nshape] if bias else [])
    b = Builder("layer_norm", *ins)
    x = 0
    ax = tuple(range(ax0, len(shp)))
    mean = b.reduce("mean", x, ax)
    c = b.binary("sub", x, mean)
    var = b.reduce("meansq", c, ax)
    istd = b.map("inv_std", _inv_sqrt_code(eps), var)
    # ln_affine reads c (r0), inv_std (r1), then scale and bias in the next registers if present
    args = [c, istd]
    code = [I(Op.MUL, 0, 0, 1)]
    if scale:
        args.append(1)
        code.append(I(Op.MUL, 0, 0, 2))
    if bias:
        args.append(2 if scale else 1)
        code.append(I(Op.ADD, 0, 0, len(args) - 1))
    y = b.map("ln_affine", code, *args)
    return b.build(y, mean, istd)


def layer_norm_backward(shape: Sequence[int], axis: int = -1) -> Composite:
    """inputs (x, scale, mean, inv_std, g) -> (dx, dscale, dbias).

    xhat = (x - mean) * inv_std; gs = g * scale; a = mean(gs); bb = mean(gs * xhat) (dot order);
    dx = ((gs - a) - xhat * bb) * inv_std; dscale = sum_batch(g * xhat) (dot); dbias = sum_batch(g).
    """
    shp = as_shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    nshape = shp[ax0:]
    stat = shp[:ax0] + (1,) * (len(shp) - ax0)
    b = Builder("layer_norm_backward", shp, nshape, stat, stat, shp)
    x, sc, mean, istd, g = b.inputs()
    nax = tuple(range(ax0, len(shp)))
    bax = tuple(range(ax0))
    xhat = b.map("xhat", (I(Op.SUB, 0, 0, 1), I(Op.MUL, 0, 0, 2)), x, mean, istd)
    gs = b.binary("mul", g, sc)
    a = b.reduce("mean", gs, nax)
    bb = b.reduce_dot(gs, xhat, nax, mean=True)
    dx_code: tuple[Instr, ...] = (  # r0 = gs, r1 = a, r2 = xhat, r3 = bb, r4 = inv_std
        I(Op.SUB, 0, 0, 1),  # gs - a
        I(Op.MUL, 5, 2, 3),  # r5 = xhat * bb (r5: the first register above the inputs)
        I(Op.SUB, 0, 0, 5),
        I(Op.MUL, 0, 0, 4),  # * inv_std
    )
    dx = b.map("ln_dx", dx_code, gs, a, xhat, bb, istd)
    if bax:
        dscale = b.view(b.reduce_dot(g, xhat, bax, keepdims=False), nshape)
        dbias = b.view(b.reduce("sum", g, bax, keepdims=False), nshape)
    else:
        dscale = b.binary("mul", g, xhat)
        dbias = b.unary("identity", g)
    return b.build(dx, dscale, dbias)


def rms_norm(shape: Sequence[int], axis: int = -1, eps: float = 1e-6, scale: bool = True) -> Composite:
    """RMSNorm (ONNX RMSNormalization, Llama's LlamaRMSNorm): inputs (x[, scale]); outputs
    (y, inv_rms), the statistic keepdims.

    ms = reduce_meansq(x) over the axes from ``axis`` on (MUL/FMA chain, / fl32(K));
    inv_rms = 1 / sqrt(ms + eps); y = (x * inv_rms) * scale (one node).
    """
    shp = as_shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    b = Builder("rms_norm", shp, *([shp[ax0:]] if scale else []))
    x = 0
    inv = b.map("inv_rms", _inv_sqrt_code(eps), b.reduce("meansq", x, tuple(range(ax0, len(shp)))))
    code = [I(Op.MUL, 0, 0, 1)] + ([I(Op.MUL, 0, 0, 2)] if scale else [])
    y = b.map("rms_affine", code, *([x, inv, 1] if scale else [x, inv]))
    return b.build(y, inv)


def rms_norm_backward(shape: Sequence[int], axis: int = -1) -> Composite:
    """inputs (x, scale, inv_rms, g) -> (dx, dscale).

    xhat = x * inv_rms; gs = g * scale; a = mean(gs * xhat) (dot order);
    dx = (gs - xhat * a) * inv_rms; dscale = sum_batch(g * xhat) (dot).
    """
    shp = as_shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    nshape = shp[ax0:]
    stat = shp[:ax0] + (1,) * (len(shp) - ax0)
    b = Builder("rms_norm_backward", shp, nshape, stat, shp)
    x, sc, inv, g = b.inputs()
    nax = tuple(range(ax0, len(shp)))
    bax = tuple(range(ax0))
    xhat = b.binary("mul", x, inv)
    gs = b.binary("mul", g, sc)
    a = b.reduce_dot(gs, xhat, nax, mean=True)
    dx_code: tuple[Instr, ...] = (  # r0 = gs, r1 = xhat, r2 = a, r3 = inv_rms
        I(Op.MUL, 4, 1, 2),  # r4 = xhat * a
        I(Op.SUB, 0, 0, 4),
        I(Op.MUL, 0, 0, 3),  # * inv_rms
    )
    dx = b.map("rms_dx", dx_code, gs, xhat, a, inv)
    dscale = b.view(b.reduce_dot(g, xhat, bax, keepdims=False), nshape) if bax else b.binary("mul", g, xhat)
    return b.build(dx, dscale)


# ------------------------------------------------------------------------ batch normalisation
def _channel_shape(shape: Shape) -> Shape:
    """The per-channel statistics of ``(N, C, *S)`` broadcast against it: ``(C, 1, ..., 1)``."""
    return (shape[1],) + (1,) * (len(shape) - 2)


@dataclass(frozen=True)
class BnTail:
    """What a fused batch norm does per element after its affine (``graph/fusion.py``): ADD a
    residual input (``residual`` is the side the normalised value took in the exported Add:
    0 for ``y + r``, 1 for ``r + y``), then an activation's code on r0 (which may use r1 as
    scratch: the mean's register, dead by then). The instructions are those the separate nodes
    ran, in the same order, so every value is the same; only the intermediates are not outputs."""

    residual: int | None = None
    act: tuple[Instr, ...] = ()
    name: str = ""  # the activation's name, for the node label

    @property
    def label(self) -> str:
        return "bn_normalise" + ("_add" if self.residual is not None else "") + (f"_{self.name}" if self.name else "")


def _bn_normalise(b: Builder, x: int, mean: int, istd: int, scale: int, bias: int, tail: BnTail,
                  residual: Sequence[int]) -> int:
    """``y = ((x - mean) * inv_std) * scale + bias`` (one node; per-channel operands broadcast),
    then ``tail`` (the residual in r5)."""
    c = _channel_shape(b.shape(x))
    code = [I(Op.SUB, 0, 0, 1), I(Op.MUL, 0, 0, 2), I(Op.MUL, 0, 0, 3), I(Op.ADD, 0, 0, 4)]
    args = [x, *(b.view(v, c) for v in (mean, istd, scale, bias))]
    if tail.residual is not None:
        code.append(I(Op.ADD, 0, 0, 5) if tail.residual == 0 else I(Op.ADD, 0, 5, 0))
        args += residual
    return b.map(tail.label, [*code, *tail.act], *args)


def _bn_inputs(name: str, shp: Shape, tail: BnTail) -> Builder:
    """The batch norm's builder: (x, scale, bias, mean, var[, residual])."""
    C = shp[1]
    return Builder(name, shp, (C,), (C,), (C,), (C,), *([shp] if tail.residual is not None else []))


def batch_norm_training(shape: Sequence[int], eps: float = 1e-5, momentum: float = 0.9,
                        tail: BnTail = BnTail()) -> Composite:
    """ONNX BatchNormalization, training mode: inputs (x, scale, bias, running_mean,
    running_var[, residual]) -> (y, mean, inv_std, running_mean', running_var'), statistics ``(C,)``.

    ``mean = channel_mean(x)``, ``var = channel_centered_meansq(x, mean)`` (the population
    variance, as ONNX; k = (n, s) ascending, ``conv.channel_map``); ``inv_std = 1/sqrt(var + eps)``;
    ``y = ((x - mean) * inv_std) * scale + bias`` (then ``tail``); running statistics ONNX's way,
    ``r' = ADD(MUL(r, momentum), MUL(stat, fl32(1 - momentum)))``."""
    shp = as_shape(shape)
    b = _bn_inputs("batch_norm", shp, tail)
    x, scale, bias, rmean, rvar, *res = b.inputs()
    mean = b.node(channel_mean(shp), x)
    var = b.node(channel_centered_meansq(shp), x, mean)
    istd = b.map("inv_std", _inv_sqrt_code(eps), var)
    y = _bn_normalise(b, x, mean, istd, scale, bias, tail, res)
    m = float(np.float32(momentum))
    update = (const(2, m), I(Op.MUL, 0, 0, 2), const(2, 1.0 - m), I(Op.MUL, 1, 1, 2), I(Op.ADD, 0, 0, 1))
    rmean2 = b.map("bn_running", update, rmean, mean)
    rvar2 = b.map("bn_running", update, rvar, var)
    return b.build(y, mean, istd, rmean2, rvar2)


def batch_norm_inference(shape: Sequence[int], eps: float = 1e-5, tail: BnTail = BnTail()) -> Composite:
    """ONNX BatchNormalization from running statistics: inputs (x, scale, bias, mean, var[,
    residual]) -> (y, inv_std); ``y`` as in training with (mean, var) the given ones."""
    shp = as_shape(shape)
    b = _bn_inputs("batch_norm_inference", shp, tail)
    x, scale, bias, mean, var, *res = b.inputs()
    istd = b.map("inv_std", _inv_sqrt_code(eps), var)
    return b.build(_bn_normalise(b, x, mean, istd, scale, bias, tail, res), istd)


def batch_norm_backward(shape: Sequence[int], training: bool = True) -> Composite:
    """inputs (x, scale, mean, inv_std, g) -> (dx, dscale, dbias), per channel over (n, s).

    ``dbias = channel_sum(g)``; ``dscale = sum(g * xhat)`` with ``xhat = (x - mean) * inv_std``
    recomputed in the chain (k = (n, s) ascending, ``conv.channel_dot_xhat``). Training:
    ``a = (dbias * scale) / K``, ``b = (dscale * scale) / K``,
    ``dx = (((g * scale) - a) - xhat * b) * inv_std``; inference (constant statistics):
    ``dx = (g * scale) * inv_std``."""
    shp = as_shape(shape)
    C = shp[1]
    c = _channel_shape(shp)
    b = Builder("batch_norm_backward", shp, (C,), (C,), (C,), shp)
    x, scale, mean, istd, g = b.inputs()
    dbias = b.node(channel_sum(shp), g)
    dscale = b.node(channel_dot_xhat(shp), g, x, mean, istd)
    sc, ist = b.view(scale, c), b.view(istd, c)
    if not training:
        return b.build(b.map("bn_dx", (I(Op.MUL, 0, 0, 1), I(Op.MUL, 0, 0, 2)), g, sc, ist), dscale, dbias)
    K = float(shp[0] * math.prod(shp[2:]))
    dx_code = (  # r0 = g, r1 = x, r2 = mean, r3 = inv_std, r4 = scale, r5 = dbias, r6 = dscale
        I(Op.SUB, 1, 1, 2),
        I(Op.MUL, 1, 1, 3),  # r1 = xhat
        I(Op.MUL, 0, 0, 4),  # r0 = g * scale
        const(7, K),
        I(Op.MUL, 5, 5, 4),
        I(Op.DIV, 5, 5, 7),  # r5 = a = dbias * scale / K
        I(Op.MUL, 6, 6, 4),
        I(Op.DIV, 6, 6, 7),  # r6 = b = dscale * scale / K
        I(Op.SUB, 0, 0, 5),
        I(Op.MUL, 1, 1, 6),
        I(Op.SUB, 0, 0, 1),
        I(Op.MUL, 0, 0, 3),  # dx
    )
    args = (g, x, *(b.view(v, c) for v in (mean, istd, scale, dbias, dscale)))
    return b.build(b.map("bn_dx", dx_code, *args), dscale, dbias)

"""Optimizer steps as compositions: torch SGD / Adam / AdamW and ONNX (preview.training)
Momentum / Adam, one node per updated tensor.

Every hyper-parameter is rounded to binary32 first; constants derived from several of them
(``1 - dampening``, Adam's bias corrections) are computed exactly and rounded once
(``exact.py``), so no implementation has to agree on float64 intermediate rounding.

Register use (each update is one elementwise kernel, inputs in r0, r1, r2[, r3]): the weight
decay prefix rewrites the gradient in r1 in place (g' = g + wd*p), because every later
instruction wants g' where g was; products go to r8/r9, clear of the inputs of every optimizer
kernel, so the parameter (r0) and state (r2) are still intact when they are read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const
from verde_chain.repops.library.composite import Builder, Composite
from verde_chain.repops.library.exact import f32_of_fraction, f32_of_sqrt_fraction, f32q, rounded_at_powers
from verde_chain.repops.library.shapes import as_shape


def _decayed_grad(coefficient: float, grad_first: bool) -> list[Instr]:
    """r1 = g + coefficient * p (r0 = p, r1 = g), with the ADD's operands in the order the
    optimizer's reference states it (``grad_first``: ADD(g, wd*p), else ADD(wd*p, g))."""
    return [
        const(8, coefficient),
        I(Op.MUL, 8, 8, 0),  # r8 = coefficient * p
        I(Op.ADD, 1, 1, 8) if grad_first else I(Op.ADD, 1, 8, 1),
    ]


def _ema(decay: float, keep_reg: int, weight: float, term: Sequence[Instr]) -> list[Instr]:
    """r0 = ADD(MUL(decay, r_keep), MUL(weight, ...)): an exponential moving average; ``term``
    multiplies the new term into r9, which holds ``weight`` when it starts."""
    return [
        const(8, decay),
        I(Op.MUL, 8, 8, keep_reg),  # r8 = decay * state
        const(9, weight),
        *term,  # r9 = weight * new term
        I(Op.ADD, 0, 8, 9),
    ]


def _minus_lr_times(lr: float, reg: int) -> list[Instr]:
    """r0 = SUB(r0, MUL(lr, r_reg)): the parameter step."""
    return [const(9, lr), I(Op.MUL, 9, 9, reg), I(Op.SUB, 0, 0, 9)]


def sgd(
    shape: Sequence[int],
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    first_step: bool = False,
) -> Composite:
    """torch.optim.SGD step. inputs (p, g, buf) -> (p_new, buf_new). All hyper-parameters are
    rounded to binary32 first; (1 - dampening) is computed exactly and rounded once.

    g' = g + wd*p (ADD(g, MUL(wd, p)), when wd != 0)
    buf' = g' on the first step, else ADD(MUL(momentum, buf), MUL(1-dampening, g'))
    d = nesterov ? ADD(g', MUL(momentum, buf')) : buf'      (d = g' when momentum == 0)
    p' = SUB(p, MUL(lr, d))
    """
    shp = as_shape(shape)
    b = Builder("sgd", shp, shp, shp)
    p, g, buf = b.inputs()
    greg = _decayed_grad(weight_decay, True) if weight_decay != 0.0 else []  # r1 = g'
    if momentum == 0.0:
        new_buf = b.unary("identity", buf)
        return b.build(b.map("sgd_param", greg + _minus_lr_times(lr, 1), p, g), new_buf)
    one_m_d = f32_of_fraction(1 - f32q(dampening))
    if first_step:
        bcode = greg + [I(Op.MOV, 0, 1)]
    else:  # r0 = p, r1 = g', r2 = buf
        damp = [const(9, one_m_d), I(Op.MUL, 1, 9, 1)] if dampening != 0.0 else []  # r1 = (1-d) * g'
        bcode = greg + [const(8, momentum), I(Op.MUL, 8, 8, 2), *damp, I(Op.ADD, 0, 8, 1)]
    nb = b.map("sgd_buf", bcode, p, g, buf)
    if nesterov:  # r0 = p, r1 = g, r2 = buf'
        look_ahead = [const(8, momentum), I(Op.MUL, 8, 8, 2), I(Op.ADD, 1, 1, 8)]  # r1 = g' + m * buf'
        pcode = greg + look_ahead + _minus_lr_times(lr, 1)
    else:
        pcode = _minus_lr_times(lr, 2)  # d = buf'
    return b.build(b.map("sgd_param", pcode, p, g, nb), nb)


@dataclass(frozen=True)
class AdamConstants:
    """Per-step constants, computed exactly from binary32 hyper-parameters, rounded once."""

    one_minus_b1: float  # fl32(1 - b1)
    one_minus_b2: float  # fl32(1 - b2)
    step_size: float  # fl32(lr / (1 - b1**t))
    bc2_sqrt: float  # fl32(sqrt(1 - b2**t))
    decay: float  # fl32(1 - lr*wd) (AdamW)


def adam_constants(lr: float, b1: float, b2: float, wd: float, t: int) -> AdamConstants:
    if t < 1:
        raise RepOpsError(f"adam: step t={t} must be >= 1")
    L, B1, B2, W = f32q(lr), f32q(b1), f32q(b2), f32q(wd)
    return AdamConstants(
        one_minus_b1=f32_of_fraction(1 - B1),
        one_minus_b2=f32_of_fraction(1 - B2),
        step_size=rounded_at_powers(lambda p: f32_of_fraction(L / (1 - p)), [(B1, t)]),
        bc2_sqrt=rounded_at_powers(lambda p: f32_of_sqrt_fraction(1 - p), [(B2, t)]),
        decay=f32_of_fraction(1 - L * W) if wd else 1.0,
    )


def adam(
    shape: Sequence[int],
    lr: float,
    t: int,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Composite:
    """torch Adam (decoupled=False, wd as L2) / AdamW (decoupled=True) at step t >= 1.

    inputs (p, g, m, v) -> (p_new, m_new, v_new), one node per output:
      g' = ADD(g, MUL(wd, p)) (Adam with wd only)
      m' = ADD(MUL(b1, m), MUL(1-b1, g'));  v' = ADD(MUL(b2, v), MUL(MUL(1-b2, g'), g'))
      denom = ADD(DIV(SQRT(v'), bc2_sqrt), eps);  p1 = decoupled ? MUL(p, 1 - lr*wd) : p
      p' = SUB(p1, MUL(step_size, DIV(m', denom)))
    """
    k = adam_constants(lr, betas[0], betas[1], weight_decay if decoupled else 0.0, t)
    shp = as_shape(shape)
    b = Builder("adamw" if decoupled else "adam", shp, shp, shp, shp)
    p, g, m, v = b.inputs()
    # inputs r0 = p, r1 = g (-> g'), r2 = m or v
    greg = _decayed_grad(weight_decay, True) if weight_decay != 0.0 and not decoupled else []
    mcode = greg + _ema(betas[0], 2, k.one_minus_b1, [I(Op.MUL, 9, 9, 1)])
    vcode = greg + _ema(betas[1], 2, k.one_minus_b2, [I(Op.MUL, 9, 9, 1), I(Op.MUL, 9, 9, 1)])
    mn = b.map("adam_m", mcode, p, g, m)
    vn = b.map("adam_v", vcode, p, g, v)
    pcode: list[Instr] = [  # r0 = p, r1 = m', r2 = v'; r3 = the step, r4 = each constant in turn
        I(Op.SQRT, 3, 2),
        const(4, k.bc2_sqrt),
        I(Op.DIV, 3, 3, 4),
        const(4, eps),
        I(Op.ADD, 3, 3, 4),  # r3 = denom
        I(Op.DIV, 3, 1, 3),
        const(4, k.step_size),
        I(Op.MUL, 3, 4, 3),  # r3 = step_size * m' / denom
    ]
    if decoupled and weight_decay != 0.0:
        pcode += [const(4, k.decay), I(Op.MUL, 0, 0, 4)]  # p1 = p * (1 - lr*wd)
    pcode += [I(Op.SUB, 0, 0, 3)]
    pn = b.map("adam_param", pcode, p, mn, vn)
    return b.build(pn, mn, vn)


def onnx_momentum(
    shape: Sequence[int], r: float, t: int, alpha: float, beta: float, norm_coefficient: float, mode: str
) -> Composite:
    """ONNX ai.onnx.preview.training Momentum with R, T baked in. inputs (x, g, v) -> (x', v').

    gr = ADD(MUL(norm, x), g); v' = ADD(MUL(alpha, v), MUL(beta_t, gr)) with beta_t = beta if t > 0
    else 1; standard: x' = SUB(x, MUL(r, v')); nesterov: x' = SUB(x, MUL(r, ADD(gr, MUL(alpha, v')))).
    """
    shp = as_shape(shape)
    b = Builder("momentum", shp, shp, shp)
    x, g, v = b.inputs()
    greg = _decayed_grad(norm_coefficient, False)  # r1 = gr
    bt = beta if t > 0 else 1.0
    vn = b.map("momentum_v", greg + _ema(alpha, 2, bt, [I(Op.MUL, 9, 9, 1)]), x, g, v)
    if mode == "standard":  # r2 = v'
        xcode = _minus_lr_times(r, 2)
    elif mode == "nesterov":
        look_ahead = [const(8, alpha), I(Op.MUL, 8, 8, 2), I(Op.ADD, 8, 1, 8)]  # r8 = gr + alpha * v'
        xcode = greg + look_ahead + _minus_lr_times(r, 8)
    else:
        raise RepOpsError(f"momentum: mode {mode!r} not in standard/nesterov")
    return b.build(b.map("momentum_x", xcode, x, g, vn), vn)


def onnx_adam(
    shape: Sequence[int],
    r: float,
    t: int,
    alpha: float,
    beta: float,
    epsilon: float,
    norm_coefficient: float,
    norm_coefficient_post: float,
) -> Composite:
    """ONNX ai.onnx.preview.training Adam with R, T baked in. inputs (x, g, v, h) -> (x', v', h').

    gr = ADD(MUL(norm, x), g); v' = ADD(MUL(alpha, v), MUL(1-alpha, gr));
    h' = ADD(MUL(beta, h), MUL(1-beta, MUL(gr, gr))); r_adj = fl32(r*sqrt(1-beta^t)/(1-alpha^t))
    (exact, rounded once; r if t == 0); x' = MUL(1-norm_post, SUB(x, MUL(r_adj, DIV(v', ADD(SQRT(h'), eps))))).
    """
    R, A, Bt = f32q(r), f32q(alpha), f32q(beta)
    if t > 0:
        # exact: r * sqrt(1-b^t) / (1-a^t) = sqrt(r^2 (1-b^t) / (1-a^t)^2) for r >= 0
        r_adj = (math.copysign(rounded_at_powers(lambda a, b: f32_of_sqrt_fraction(R * R * (1 - b) / (1 - a) ** 2),
                                                 [(A, t), (Bt, t)]), float(R)) if R != 0 else 0.0)
    else:
        r_adj = float(R)
    shp = as_shape(shape)
    b = Builder("onnx_adam", shp, shp, shp, shp)
    x, g, v, h = b.inputs()
    greg = _decayed_grad(norm_coefficient, False)  # r1 = gr
    one_m_a = f32_of_fraction(1 - A) if A != 1 else 0.0
    one_m_b = f32_of_fraction(1 - Bt) if Bt != 1 else 0.0
    vn = b.map("adam_v", greg + _ema(alpha, 2, one_m_a, [I(Op.MUL, 9, 9, 1)]), x, g, v)
    # h's term is (1-beta) * gr*gr with gr*gr rounded first: r10, the register after r8/r9
    gr_sq = [I(Op.MUL, 10, 1, 1)]
    hcode = greg + [
        const(8, beta),
        I(Op.MUL, 8, 8, 2),  # r8 = beta * h
        *gr_sq,
        const(9, one_m_b),
        I(Op.MUL, 9, 9, 10),  # r9 = (1 - beta) * gr*gr
        I(Op.ADD, 0, 8, 9),
    ]
    hn = b.map("adam_h", hcode, x, g, h)
    xcode = [  # r0 = x, r1 = v', r2 = h'; r3 = the step, r4 = each constant in turn
        I(Op.SQRT, 3, 2),
        const(4, epsilon),
        I(Op.ADD, 3, 3, 4),
        I(Op.DIV, 3, 1, 3),  # v' / (sqrt(h') + eps)
        const(4, r_adj),
        I(Op.MUL, 3, 4, 3),
        I(Op.SUB, 0, 0, 3),
    ]
    if norm_coefficient_post != 0.0:
        xcode += [const(4, f32_of_fraction(1 - f32q(norm_coefficient_post))), I(Op.MUL, 0, 4, 0)]
    return b.build(b.map("adam_x", xcode, x, vn, hn), vn, hn)

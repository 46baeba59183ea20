"""Convolution and the per-channel reductions of vision models: windowed dot chains.

Every kernel here reads its inputs through windows (``program.Window``): a bounded input axis
whose position comes from an output coordinate and a digit of the loop index k, reading the
input's fill (+0.0: zero padding) when it falls outside the tensor. That is implicit im2col:
no padded or unfolded copy exists anywhere, and a padded tap contributes exactly what a zero in
an explicit im2col matrix would.

The three convolution kernels (docs/repops-spec.md §4, "Convolution") and their ONE reduction
order each, for spatial rank r (1, 2 or 3), groups G, ``Cg = C/G``, ``Mg = M/G``::

    forward       y[n, g, mg, o...]   k = (ci, kh, kw)   ascending   x[n, g*Cg+ci, o*s + kh*d - p] * w[g*Mg+mg, ci, kh, kw]
    grad input    dx[n, g, ci, i...]  k = (mg, kh, kw)   ascending   dy[n, g*Mg+mg, (i + p - kh*d)/s] * w[g*Mg+mg, ci, kh, kw]
    grad weight   dw[g, mg, ci, t...] k = (n, oh, ow)    ascending   dy[n, g*Mg+mg, o] * x[n, g*Cg+ci, o*s + t*d - p]

each the dot chain ``acc = MUL(a_0, b_0)``, ``acc = FMA(a_k, b_k, acc)`` with r1 = a_k (the first
operand above), r2 = b_k, r0 = acc; a tap outside the input (padding, or a non-integral
``(i + p - kh*d)/s``) reads +0.0. Outputs split the channel axis by group (``(N, G, Mg, ...)``;
the graph views them as ``(N, M, ...)`` for free), so a group's offset is a plain stride.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import CANONICAL_NAN, Op
from verde_chain.repops.library.asm import I, const, coord, load
from verde_chain.repops.library.shapes import Shape, as_shape, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc, Window

AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")

DOT_PROLOGUE = (load(1, 0), load(2, 1), I(Op.MUL, 0, 1, 2))  # r0 = a_0 * b_0
DOT_BODY = (load(1, 0), load(2, 1), I(Op.FMA, 0, 1, 2, 0))  # r0 = FMA(a_k, b_k, r0)


def digit_window(digit: int, size: int, stride: int) -> Window:
    """A k digit that walks a whole input axis (always in range): ``digit * stride``."""
    return Window(digit=digit, k_mul=1, size=size, stride=stride)


@dataclass(frozen=True)
class ConvGeometry:
    """An N-D window over ``(N, C, *S)``: kernel, strides, dilations and ONNX pads (begins then
    ends), as for Conv and the pools; ``ceil_mode`` (pools only) rounds the output size up."""

    x_shape: Shape
    kernel: Shape
    strides: Shape
    dilations: Shape
    pads: Shape
    ceil_mode: bool = False

    @classmethod
    def make(
        cls,
        x_shape: Sequence[int],
        kernel: Sequence[int],
        strides: Sequence[int] | None = None,
        dilations: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        ceil_mode: bool = False,
    ) -> ConvGeometry:
        x, ks = as_shape(x_shape), as_shape(kernel)
        r = len(ks)
        if len(x) != r + 2 or not 1 <= r <= 3:
            raise RepOpsError(f"conv: input {x} and kernel {ks} need rank 2 + (1..3) and spatial rank {r}")
        g = cls(
            x,
            ks,
            as_shape(strides or (1,) * r),
            as_shape(dilations or (1,) * r),
            as_shape(pads or (0,) * (2 * r)),
            ceil_mode,
        )
        if len(g.strides) != r or len(g.dilations) != r or len(g.pads) != 2 * r:
            raise RepOpsError(f"conv: strides {g.strides} / dilations {g.dilations} / pads {g.pads} for rank {r}")
        if min(g.strides + g.dilations + g.kernel) < 1 or min(g.pads) < 0:
            raise RepOpsError(f"conv: strides, dilations and kernel must be >= 1 and pads >= 0: {g}")
        if min(g.out_spatial) < 1:
            raise RepOpsError(f"conv: window {ks} (dilations {g.dilations}) does not fit the padded input {x}")
        return g

    @classmethod
    def from_onnx(cls, x_shape: Sequence[int], kernel: Sequence[int], attrs: dict[str, Any]) -> ConvGeometry:
        """The geometry of an ONNX Conv / MaxPool / AveragePool node's attributes (``strides``,
        ``dilations``, ``pads``, ``auto_pad``, ``ceil_mode``; missing ones at their defaults).
        ``auto_pad`` SAME_UPPER / SAME_LOWER pads to ``ceil(S / s)`` outputs, the odd pad at the
        end / the beginning; VALID pads nothing."""
        r = len(kernel)
        spatial = tuple(x_shape[2:])
        strides = tuple(attrs.get("strides") or (1,) * r)
        dilations = tuple(attrs.get("dilations") or (1,) * r)
        auto = attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        if auto not in AUTO_PADS:
            raise RepOpsError(f"auto_pad={auto!r}; supported: {AUTO_PADS}")
        if auto == "NOTSET":
            pads = tuple(attrs.get("pads") or (0,) * (2 * r))
        elif auto == "VALID":
            pads = (0,) * (2 * r)
        else:
            begins, ends = [], []
            for S, k, st, d in zip(spatial, kernel, strides, dilations):
                total = max((-(-S // st) - 1) * st + (k - 1) * d + 1 - S, 0)
                begins.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
                ends.append(total - begins[-1])
            pads = tuple(begins + ends)
        return cls.make(x_shape, kernel, strides, dilations, pads, bool(attrs.get("ceil_mode", 0)))

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def spatial(self) -> Shape:
        return self.x_shape[2:]

    @property
    def pads_begin(self) -> Shape:
        return self.pads[: self.rank]

    @property
    def out_spatial(self) -> Shape:
        out = []
        for S, k, s, d, pb, pe in zip(self.spatial, self.kernel, self.strides, self.dilations,
                                      self.pads_begin, self.pads[self.rank:]):
            span = S + pb + pe - d * (k - 1) - 1
            o = (-(-span // s) if self.ceil_mode else span // s) + 1
            # ONNX / torch: the last window must start inside the input or its left padding
            if self.ceil_mode and (o - 1) * s >= S + pb:
                o -= 1
            out.append(o)
        return tuple(out)

    def window_of_output(self, axis: int, digit: int, i: int, stride: int) -> Window:
        """Input position ``o*s + t*d - p`` of spatial axis i: o at output ``axis``, t = k ``digit``."""
        return Window(axis, self.strides[i], digit, self.dilations[i], -self.pads_begin[i], 1,
                      self.spatial[i], stride)

    def window_of_input(self, axis: int, digit: int, i: int, stride: int) -> Window:
        """Output position ``(x + p - t*d) / s`` of spatial axis i seen from input position x at
        output ``axis`` and tap t = k ``digit`` (in range only where the division is exact)."""
        return Window(axis, 1, digit, -self.dilations[i], self.pads_begin[i], self.strides[i],
                      self.out_spatial[i], stride)

    def window_of_tap(self, axis: int, digit: int, i: int, stride: int) -> Window:
        """Input position ``o*s + t*d - p`` with the tap t at output ``axis``, o = k ``digit``."""
        return Window(axis, self.dilations[i], digit, self.strides[i], -self.pads_begin[i], 1,
                      self.spatial[i], stride)


def _conv_shapes(geo: ConvGeometry, w_shape: Sequence[int], groups: int) -> tuple[int, int, int, int]:
    """(N, M, Cg, Mg), checked."""
    w = as_shape(w_shape)
    N, C = geo.x_shape[:2]
    if len(w) != geo.rank + 2 or w[2:] != geo.kernel:
        raise RepOpsError(f"conv: weight {w} does not match kernel {geo.kernel}")
    M, Cg = w[:2]
    if groups < 1 or C % groups or M % groups or Cg != C // groups:
        raise RepOpsError(f"conv: {C} input / {M} output channels, weight {w}, groups {groups} do not fit")
    return N, M, Cg, M // groups


def convolution(geo: ConvGeometry, w_shape: Sequence[int], groups: int = 1, bias: bool = False) -> KernelDesc:
    """ONNX Conv (NC + spatial): output ``(N, G, Mg, *O)``; inputs x, w[, b]; bias added last."""
    N, M, Cg, Mg = _conv_shapes(geo, w_shape, groups)
    r, O = geo.rank, geo.out_spatial
    xs, ws = c_strides(geo.x_shape), c_strides(w_shape)
    xmap = InputMap(
        numel(geo.x_shape),
        (xs[0], Cg * xs[1], 0) + (0,) * r,
        windows=(digit_window(0, Cg, xs[1]),)
        + tuple(geo.window_of_output(3 + i, 1 + i, i, xs[2 + i]) for i in range(r)),
    )
    wmap = InputMap(numel(w_shape), (0, Mg * ws[0], ws[0]) + (0,) * r, kstride=1)
    maps = [xmap, wmap]
    epi: tuple = ()
    if bias:
        maps.append(InputMap(M, (0, Mg, 1) + (0,) * r))
        epi = (load(1, 2), I(Op.ADD, 0, 0, 1))  # r0 = acc + b[m]
    K = Cg * math.prod(geo.kernel)
    return KernelDesc((N, groups, Mg, *O), K, tuple(maps), DOT_PROLOGUE, DOT_BODY if K > 1 else (), epi,
                      kdims=(Cg, *geo.kernel), label="conv")


def conv_grad_input(geo: ConvGeometry, w_shape: Sequence[int], groups: int = 1) -> KernelDesc:
    """dL/dx of :func:`convolution`: output ``(N, G, Cg, *S)``; inputs dy ``(N, M, *O)``, w."""
    N, M, Cg, Mg = _conv_shapes(geo, w_shape, groups)
    r, S, O = geo.rank, geo.spatial, geo.out_spatial
    ys, ws = c_strides((N, M, *O)), c_strides(w_shape)
    ymap = InputMap(
        N * M * math.prod(O),
        (ys[0], Mg * ys[1], 0) + (0,) * r,
        windows=(digit_window(0, Mg, ys[1]),)
        + tuple(geo.window_of_input(3 + i, 1 + i, i, ys[2 + i]) for i in range(r)),
    )
    wmap = InputMap(
        numel(w_shape),
        (0, Mg * ws[0], ws[1]) + (0,) * r,
        windows=(digit_window(0, Mg, ws[0]),) + tuple(digit_window(1 + i, geo.kernel[i], ws[2 + i]) for i in range(r)),
    )
    K = Mg * math.prod(geo.kernel)
    return KernelDesc((N, groups, Cg, *S), K, (ymap, wmap), DOT_PROLOGUE, DOT_BODY if K > 1 else (),
                      kdims=(Mg, *geo.kernel), label="conv_grad_input")


def conv_grad_weight(geo: ConvGeometry, w_shape: Sequence[int], groups: int = 1) -> KernelDesc:
    """dL/dw of :func:`convolution`: output ``(G, Mg, Cg, *kernel)``; inputs dy ``(N, M, *O)``, x."""
    N, M, Cg, Mg = _conv_shapes(geo, w_shape, groups)
    r, O = geo.rank, geo.out_spatial
    ys, xs = c_strides((N, M, *O)), c_strides(geo.x_shape)
    ymap = InputMap(
        N * M * math.prod(O),
        (Mg * ys[1], ys[1], 0) + (0,) * r,
        windows=(digit_window(0, N, ys[0]),) + tuple(digit_window(1 + i, O[i], ys[2 + i]) for i in range(r)),
    )
    xmap = InputMap(
        numel(geo.x_shape),
        (Cg * xs[1], 0, xs[1]) + (0,) * r,
        windows=(digit_window(0, N, xs[0]),)
        + tuple(geo.window_of_tap(3 + i, 1 + i, i, xs[2 + i]) for i in range(r)),
    )
    K = N * math.prod(O)
    return KernelDesc((groups, Mg, Cg, *geo.kernel), K, (ymap, xmap), DOT_PROLOGUE, DOT_BODY if K > 1 else (),
                      kdims=(N, *O), label="conv_grad_weight")


def channel_map(shape: Sequence[int]) -> InputMap:
    """Read ``(N, C, *S)`` as ``(C,)`` outputs with k = (n, s) digits: the per-channel
    reductions' input map (batch norm statistics, a conv's bias gradient)."""
    shp = as_shape(shape)
    if len(shp) < 2:
        raise RepOpsError(f"per-channel reduction needs (N, C, ...), got {shp}")
    N, C, P = shp[0], shp[1], numel(shp[2:])
    return InputMap(numel(shp), (P,), windows=(digit_window(0, N, C * P), digit_window(1, P, 1)))


def channel_kdims(shape: Sequence[int]) -> tuple[int, int]:
    """k = (n, s): batch, then the flattened spatial position, both ascending."""
    return shape[0], numel(shape[2:])


def channel_sum(shape: Sequence[int]) -> KernelDesc:
    """``out[c] = sum over (n, s) of x[n, c, s]``, k = (n, s) ascending (a conv's bias gradient)."""
    N, P = channel_kdims(shape)
    body = (load(1, 0), I(Op.ADD, 0, 0, 1))  # r0 += x_k
    return KernelDesc((shape[1],), N * P, (channel_map(shape),), (load(0, 0),), body if N * P > 1 else (),
                      kdims=(N, P), label="channel_sum")


def channel_mean(shape: Sequence[int]) -> KernelDesc:
    """:func:`channel_sum`, then ``DIV`` by ``fl32(N * S)`` (batch norm's mean)."""
    d = channel_sum(shape)
    epi = (const(1, float(d.K)), I(Op.DIV, 0, 0, 1))
    return KernelDesc(d.out_shape, d.K, d.inputs, d.prologue, d.body, epi, kdims=d.kdims, label="channel_mean")


def _per_channel(C: int) -> InputMap:
    """A ``(C,)`` tensor read at this output channel, the same for every k."""
    return InputMap(C, (1,))


def channel_centered_meansq(shape: Sequence[int]) -> KernelDesc:
    """Batch norm's (population) variance: inputs (x, mean ``(C,)``); ``r2 = mean`` once, then the
    sumsq chain of ``d = x - mean`` (``r0 = MUL(d_0, d_0)``, ``r0 = FMA(d_k, d_k, r0)``), k = (n, s)
    ascending, ``DIV fl32(N * S)``."""
    N, P = channel_kdims(shape)
    pro = (load(2, 1), load(1, 0), I(Op.SUB, 1, 1, 2), I(Op.MUL, 0, 1, 1))
    body = (load(1, 0), I(Op.SUB, 1, 1, 2), I(Op.FMA, 0, 1, 1, 0))
    epi = (const(1, float(N * P)), I(Op.DIV, 0, 0, 1))
    maps = (channel_map(shape), _per_channel(shape[1]))
    return KernelDesc((shape[1],), N * P, maps, pro, body if N * P > 1 else (), epi, kdims=(N, P),
                      label="channel_var")


def channel_dot_xhat(shape: Sequence[int]) -> KernelDesc:
    """Batch norm's dscale: inputs (g, x, mean, inv_std); the dot chain of ``g_k`` and
    ``xhat_k = (x_k - mean) * inv_std`` (recomputed per k), k = (n, s) ascending."""
    N, P = channel_kdims(shape)
    C = shape[1]
    xhat = (load(2, 1), I(Op.SUB, 2, 2, 3), I(Op.MUL, 2, 2, 4))  # r2 = (x - mean) * inv_std
    pro = (load(3, 2), load(4, 3), load(1, 0), *xhat, I(Op.MUL, 0, 1, 2))
    body = (load(1, 0), *xhat, I(Op.FMA, 0, 1, 2, 0))
    maps = (channel_map(shape), channel_map(shape), _per_channel(C), _per_channel(C))
    return KernelDesc((C,), N * P, maps, pro, body if N * P > 1 else (), kdims=(N, P), label="channel_dot_xhat")


# ----------------------------------------------------------------------------------- pooling
NEG_INF = 0xFF800000  # max pooling's fill: a padded tap never wins


def _pool_map(geo: ConvGeometry, fill: int = 0) -> InputMap:
    """x ``(N, C, *S)`` read at the window of output ``(N, C, *O)``, tap digits ``(t_1 .. t_r)``."""
    xs = c_strides(geo.x_shape)
    return InputMap(
        numel(geo.x_shape),
        (xs[0], xs[1]) + (0,) * geo.rank,
        windows=tuple(geo.window_of_output(2 + i, i, i, xs[2 + i]) for i in range(geo.rank)),
        fill=fill,
    )


def _pool_grad_map(geo: ConvGeometry, fill: int = 0) -> InputMap:
    """dy ``(N, C, *O)`` read from input position ``(N, C, *S)`` at tap t: ``(x + p - t*d)/s``."""
    out = geo.x_shape[:2] + geo.out_spatial
    ys = c_strides(out)
    return InputMap(
        numel(out),
        (ys[0], ys[1]) + (0,) * geo.rank,
        windows=tuple(geo.window_of_input(2 + i, i, i, ys[2 + i]) for i in range(geo.rank)),
        fill=fill,
    )


def _pool_desc(geo: ConvGeometry, out: Shape, maps: tuple[InputMap, ...], pro: tuple, body: tuple,
               epi: tuple, label: str) -> KernelDesc:
    K = math.prod(geo.kernel)
    return KernelDesc(out, K, maps, pro, body if K > 1 else (), epi, kdims=geo.kernel, label=label)


def max_pool(geo: ConvGeometry) -> KernelDesc:
    """MaxPool: ``r0 = x_0``, ``r0 = MAX(r0, x_t)`` for taps t ascending; padding reads -inf."""
    out = geo.x_shape[:2] + geo.out_spatial
    body = (load(1, 0), I(Op.MAX, 0, 0, 1))
    return _pool_desc(geo, out, (_pool_map(geo, NEG_INF),), (load(0, 0),), body, (), "max_pool")


def max_pool_argmax(geo: ConvGeometry) -> KernelDesc:
    """The tap (flat index t over the kernel, as a float) MaxPool took: the first maximum in
    ascending t (a later tap wins only if strictly greater; a NaN never wins, and after a NaN
    nothing does: ``LT`` is false on NaN)."""
    out = geo.x_shape[:2] + geo.out_spatial
    pro = (
        load(0, 0),  # r0 = best = x_0 (r1 = its tap, r2 = t: both +0.0)
        const(3, 1.0),  # r3 = 1.0
    )
    body = (
        load(4, 0),  # r4 = x_t
        I(Op.ADD, 2, 2, 3),  # r2 = t
        I(Op.LT, 5, 0, 4),  # r5 = best < x_t
        I(Op.SELECT, 1, 5, 2, 1),  # r1 = r5 ? t : r1
        I(Op.MAX, 0, 0, 4),  # r0 = best
    )
    return _pool_desc(geo, out, (_pool_map(geo, NEG_INF),), pro, body, (I(Op.MOV, 0, 1),), "max_pool_argmax")


# max_pool_backward's program (inputs: 0 = the argmax tap, 1 = dy, both read at the output o the
# input position takes at tap t): the one definition, which backends match to run its scatter form
# (repops/windowed.py max_pool_backward_plan).
MAX_POOL_BACKWARD_PROLOGUE = (
    const(3, 1.0),  # r3 = 1.0 (r4 = t = +0.0, r5 = +0.0)
    load(1, 0),  # r1 = arg[o(x, t)]
    load(2, 1),  # r2 = dy[o(x, t)]
    I(Op.EQ, 6, 1, 4),  # r6 = arg == t
    I(Op.SELECT, 0, 6, 2, 5),  # r0 = r6 ? dy : +0
)
MAX_POOL_BACKWARD_BODY = (
    I(Op.ADD, 4, 4, 3),  # r4 = t
    load(1, 0),
    load(2, 1),
    I(Op.EQ, 6, 1, 4),
    I(Op.SELECT, 6, 6, 2, 5),  # r6 = arg == t ? dy : +0
    I(Op.ADD, 0, 0, 6),
)


def max_pool_backward(geo: ConvGeometry) -> KernelDesc:
    """dx ``(N, C, *S)`` from (argmax tap, dy) of ``(N, C, *O)``: the sum over taps t ascending of
    ``dy[o]`` where output o = ``(x + p - t*d)/s`` exists and took tap t (``SELECT(EQ(arg, t),
    dy, +0)``; the first term starts the chain, the others are ADDed). The argmax reads NaN
    outside (never equal to a tap)."""
    maps = (_pool_grad_map(geo, CANONICAL_NAN), _pool_grad_map(geo))
    return _pool_desc(geo, geo.x_shape, maps, MAX_POOL_BACKWARD_PROLOGUE, MAX_POOL_BACKWARD_BODY, (),
                      "max_pool_backward")


def _window_count(geo: ConvGeometry, include_pad: bool) -> tuple:
    """Epilogue code leaving in r1 the number of taps of this output's window that count
    (inside the input, or inside the padded input with ``include_pad``), from COORD: per axis
    ``#{t in [0, k): lo <= o*s - pb + t*d < hi}``, exact integer arithmetic in binary32; the
    product over axes in r1. Uses r1..r5."""
    code: list = [const(1, 1.0)]
    for i in range(geo.rank):
        S, k, s, d, pb = geo.spatial[i], geo.kernel[i], geo.strides[i], geo.dilations[i], geo.pads_begin[i]
        pe = geo.pads[geo.rank + i]
        lo, hi = (-pb, S + pe) if include_pad else (0, S)
        code += [
            coord(2, 2 + i),  # r2 = o
            const(3, float(s)),
            I(Op.MUL, 2, 2, 3),
            const(3, float(-pb)),
            I(Op.ADD, 2, 2, 3),  # r2 = start = o*s - pb
        ]
        if d == 1:
            code += [
                const(3, float(k)),
                I(Op.ADD, 3, 2, 3),  # r3 = start + k
                const(4, float(hi)),
                I(Op.MIN, 3, 3, 4),  # r3 = min(start + k, hi)
                const(4, float(lo)),
                I(Op.MAX, 2, 2, 4),  # r2 = max(start, lo)
                I(Op.SUB, 2, 3, 2),  # r2 = count
            ]
        else:
            code += [
                const(3, float(lo)),
                I(Op.SUB, 3, 3, 2),  # r3 = lo - start
                I(Op.NEG, 3, 3),
                const(4, float(d)),
                I(Op.DIV, 3, 3, 4),
                I(Op.FLOOR, 3, 3),
                I(Op.NEG, 3, 3),  # r3 = ceil((lo - start)/d)
                const(5, 0.0),
                I(Op.MAX, 3, 3, 5),  # r3 = t_lo
                const(5, float(hi - 1)),
                I(Op.SUB, 2, 5, 2),  # r2 = hi - 1 - start
                I(Op.DIV, 2, 2, 4),
                I(Op.FLOOR, 2, 2),
                const(5, float(k - 1)),
                I(Op.MIN, 2, 2, 5),  # r2 = t_hi
                I(Op.SUB, 2, 2, 3),
                const(5, 1.0),
                I(Op.ADD, 2, 2, 5),  # r2 = t_hi - t_lo + 1
            ]
        code.append(I(Op.MUL, 1, 1, 2))
    return tuple(code)


def avg_pool(geo: ConvGeometry, count_include_pad: bool = False) -> KernelDesc:
    """AveragePool: the sum over taps t ascending (padding reads +0), then ``DIV`` by the
    window's count (``_window_count``)."""
    out = geo.x_shape[:2] + geo.out_spatial
    body = (load(1, 0), I(Op.ADD, 0, 0, 1))
    epi = _window_count(geo, count_include_pad) + (I(Op.DIV, 0, 0, 1),)
    return _pool_desc(geo, out, (_pool_map(geo),), (load(0, 0),), body, epi, "avg_pool")


def avg_pool_grad_scale(geo: ConvGeometry, count_include_pad: bool = False) -> KernelDesc:
    """``dy / count`` over ``(N, C, *O)``: the first node of AveragePool's backward."""
    out = geo.x_shape[:2] + geo.out_spatial
    code = (load(0, 0),) + _window_count(geo, count_include_pad) + (I(Op.DIV, 0, 0, 1),)
    return KernelDesc(out, 1, (InputMap(numel(out), c_strides(out)),), code, label="avg_pool_grad_scale")


def window_sum_backward(geo: ConvGeometry) -> KernelDesc:
    """dx ``(N, C, *S)`` = the sum over taps t ascending of ``dy[(x + p - t*d)/s]`` (+0 where no
    output took x at tap t): AveragePool's backward after ``avg_pool_grad_scale``."""
    body = (load(1, 0), I(Op.ADD, 0, 0, 1))
    return _pool_desc(geo, geo.x_shape, (_pool_grad_map(geo),), (load(0, 0),), body, (), "window_sum_backward")

"""The vision operators (convolution, pooling, batch norm, activations, concat, pad): the spec
interpreter equals the reference bit for bit, and both agree with torch forward and backward
(tolerances of docs/repops-spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from verde_chain.repops import library, program, reference
from verde_chain.repops.edges import EDGE_BITS
from verde_chain.repops.library import ConvGeometry
from verde_chain.repops.program import KernelDesc

RNG = np.random.default_rng(15)


def _same_bits(desc: KernelDesc, ins: Sequence[np.ndarray]) -> np.ndarray:
    """reference.run, after checking run_spec gives the same bits (small outputs only)."""
    ref = reference.run(desc, ins)
    if desc.numel * desc.num_steps <= 60_000:
        spec = program.run_spec(desc, ins)
        assert (spec.view(np.uint32) == ref.view(np.uint32)).all(), desc.label
    return ref


def _edgy(shape: Sequence[int]) -> np.ndarray:
    """Normal values with a sprinkle of edge bit patterns (±0, subnormals, inf, NaN, ...)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1).view(np.uint32)
    pick = RNG.random(flat.size) < 0.1
    flat[pick] = RNG.choice(np.array(EDGE_BITS, dtype=np.uint32), int(pick.sum()))
    return x


CONV_CASES = [  # x shape, w shape, strides, dilations, pads, groups, bias
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
    ((2, 4, 9, 8), (6, 2, 3, 2), (2, 3), (1, 2), (2, 0, 1, 3), 2, True),
    ((1, 4, 5, 5), (4, 1, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 4, False),  # depthwise
    ((2, 3, 11), (2, 3, 4), (3,), (2,), (2, 1), 1, True),  # 1-D, asymmetric pads
    ((1, 2, 4, 5), (3, 2, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, False),  # K = Cg
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"x{c[0]}w{c[1]}s{c[2]}g{c[5]}")
def test_conv_forward_and_gradients_match_torch(case: tuple) -> None:  # type: ignore[type-arg]
    xs, ws, stride, dil, pads, groups, bias = case
    r = len(xs) - 2
    geo = ConvGeometry.make(xs, ws[2:], stride, dil, pads)
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    y = _same_bits(library.convolution(geo, ws, groups, bias), [x, w, b] if bias else [x, w])
    y = y.reshape(xs[0], ws[0], *geo.out_spatial)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch_pads = [p for i in reversed(range(r)) for p in (pads[i], pads[r + i])]
    conv = (F.conv1d, F.conv2d, F.conv3d)[r - 1]
    yt = conv(F.pad(xt, torch_pads), wt, torch.tensor(b) if bias else None, stride, 0, dil, groups)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    g = RNG.standard_normal(y.shape).astype(np.float32)
    yt.backward(torch.tensor(g))
    dx = _same_bits(library.conv_grad_input(geo, ws, groups), [g, w]).reshape(xs)
    dw = _same_bits(library.conv_grad_weight(geo, ws, groups), [g, x]).reshape(ws)
    db = _same_bits(library.channel_sum(g.shape), [g])
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, wt.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, g.sum(axis=(0, *range(2, 2 + r))), rtol=1e-4, atol=1e-4)


def test_conv_padding_taps_stay_in_the_chain() -> None:
    """A padded tap is FMA(+0, w, acc): an all -0 product chain turns +0 at the first padded
    tap with w > 0 (a kernel that skipped padding would keep -0)."""
    geo = ConvGeometry.make((1, 1, 1, 2), (1, 2), pads=(0, 0, 0, 1))
    x = np.array([[[[-0.0, 1.0]]]], np.float32)
    w = np.array([[[[1.0, 1.0]]]], np.float32)
    y = _same_bits(library.convolution(geo, w.shape), [x, w]).reshape(-1)
    # y[0] = MUL(-0, 1) = -0, then FMA(1, 1, -0) = 1; y[1] = MUL(1, 1) = 1, FMA(+0 (pad), 1, 1) = 1
    assert y.tolist() == [1.0, 1.0]
    x2 = np.array([[[[-0.0, -0.0]]]], np.float32)
    y2 = _same_bits(library.convolution(geo, w.shape), [x2, w]).reshape(-1).view(np.uint32)
    assert y2.tolist() == [0x80000000, 0]  # -0 + -0 = -0; -0 + (+0 * 1) = +0


POOL_CASES = [  # x shape, kernel, strides, pads (one side), ceil, count_include_pad, dilations
    ((2, 3, 8, 8), (3, 3), (2, 2), (1, 1), False, True, None),
    ((2, 3, 7, 9), (3, 2), (2, 2), (1, 0), True, False, None),
    ((2, 3, 7, 9), (3, 2), (2, 2), (1, 1), True, True, None),
    ((1, 2, 10), (3,), (2,), (1,), True, False, None),
    ((1, 2, 9, 9), (2, 2), (1, 1), (0, 0), False, True, (2, 2)),
    ((1, 2, 9, 9), (3, 3), (3, 3), (1, 1), True, False, (2, 1)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"x{c[0]}k{c[1]}s{c[2]}c{int(c[4])}")
def test_pools_match_torch(case: tuple) -> None:  # type: ignore[type-arg]
    xs, k, s, p, ceil, inc, dil = case
    r = len(k)
    dil = dil or (1,) * r
    geo = ConvGeometry.make(xs, k, s, dil, p + p, ceil)
    x = RNG.standard_normal(xs).astype(np.float32)
    x[0, 0].flat[:3] = 1.0  # ties: the first maximum takes the gradient
    xt = torch.tensor(x, requires_grad=True)
    yt = (F.max_pool1d, F.max_pool2d)[r - 1](xt, k, s, p, dil, ceil_mode=ceil)
    y = _same_bits(library.max_pool(geo), [x])
    assert y.shape == tuple(yt.shape) and (y == yt.detach().numpy()).all()
    g = RNG.standard_normal(y.shape).astype(np.float32)
    yt.backward(torch.tensor(g))
    arg = _same_bits(library.max_pool_argmax(geo), [x])
    dx = _same_bits(library.max_pool_backward(geo), [arg, g])
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-6, atol=1e-6)
    if dil == (1,) * r:
        xt2 = torch.tensor(x, requires_grad=True)
        at = (F.avg_pool1d, F.avg_pool2d)[r - 1](xt2, k, s, p, ceil_mode=ceil, count_include_pad=inc)
        a = _same_bits(library.avg_pool(geo, inc), [x])
        np.testing.assert_allclose(a, at.detach().numpy(), rtol=1e-5, atol=1e-6)
        at.backward(torch.tensor(g))
        gd = _same_bits(library.avg_pool_grad_scale(geo, inc), [g])
        np.testing.assert_allclose(_same_bits(library.window_sum_backward(geo), [gd]), xt2.grad.numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_pools_on_edge_values_spec_equals_reference() -> None:
    geo = ConvGeometry.make((2, 2, 5, 5), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True)
    x = _edgy((2, 2, 5, 5))
    for desc in (library.max_pool(geo), library.max_pool_argmax(geo), library.avg_pool(geo, True)):
        _same_bits(desc, [x])
    arg = reference.run(library.max_pool_argmax(geo), [x])
    _same_bits(library.max_pool_backward(geo), [arg, _edgy(arg.shape)])


@pytest.mark.parametrize("xs", [(4, 3, 5, 5), (3, 2, 7), (5, 4)])
def test_batch_norm_matches_torch(xs: tuple[int, ...]) -> None:
    C = xs[1]
    x = RNG.standard_normal(xs).astype(np.float32) * 2 + 1
    sc, bi, rm = (RNG.standard_normal(C).astype(np.float32) for _ in range(3))
    rv = RNG.random(C).astype(np.float32) + 0.5
    comp = library.batch_norm_training(xs, 1e-5, 0.9)
    y, mean, istd, rm2, rv2 = comp.run([x, sc, bi, rm, rv])
    xt, st, bt = (torch.tensor(v, requires_grad=True) for v in (x, sc, bi))
    rmt, rvt = torch.tensor(rm), torch.tensor(rv)
    yt = F.batch_norm(xt, rmt, rvt, st, bt, True, 0.1, 1e-5)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm2, rmt.numpy(), rtol=1e-5, atol=1e-6)
    # ONNX's running variance is the population variance (torch keeps the unbiased one)
    pop = x.swapaxes(0, 1).reshape(C, -1).var(1)
    np.testing.assert_allclose(rv2, rv * np.float32(0.9) + pop * np.float32(0.1), rtol=1e-5)
    g = RNG.standard_normal(xs).astype(np.float32)
    yt.backward(torch.tensor(g))
    dx, ds, db = library.batch_norm_backward(xs).run([x, sc, mean, istd, g])
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(ds, st.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, bt.grad.numpy(), rtol=1e-4, atol=1e-4)
    y2, _ = library.batch_norm_inference(xs).run([x, sc, bi, rm, rv])
    ref = F.batch_norm(*(torch.tensor(v) for v in (x, rm, rv, sc, bi)), False, 0.1, 1e-5)
    np.testing.assert_allclose(y2, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_batch_norm_nodes_spec_equals_reference() -> None:
    xs = (3, 2, 2, 3)
    x, g = _edgy(xs), _edgy(xs)
    C = xs[1]
    st = [_edgy((C,)) for _ in range(4)]
    comp = library.batch_norm_training(xs)
    outs = comp.run([x, *st], runner=_same_bits)
    library.batch_norm_backward(xs).run([x, st[0], outs[1], outs[2], g], runner=_same_bits)


def test_activations_match_torch() -> None:
    x = (RNG.standard_normal(300) * 6).astype(np.float32)
    x[:8] = [-3, 3, 0, -0.0, 25, -30, 20, -16]
    g = RNG.standard_normal(300).astype(np.float32)
    shp = x.shape

    def torch_grad(fn) -> np.ndarray:  # type: ignore[no-untyped-def]
        xt = torch.tensor(x, requires_grad=True)
        fn(xt).backward(torch.tensor(g))
        assert xt.grad is not None
        return xt.grad.numpy()

    xt = torch.tensor(x)
    np.testing.assert_allclose(_same_bits(library.hard_sigmoid(shp, 1 / 6, 0.5), [x]), F.hardsigmoid(xt), atol=1e-6)
    np.testing.assert_allclose(_same_bits(library.hard_swish(shp), [x]), F.hardswish(xt), atol=1e-5)
    np.testing.assert_allclose(_same_bits(library.hard_swish_grad(shp), [x, g]), torch_grad(F.hardswish), atol=1e-5)
    np.testing.assert_allclose(_same_bits(library.hard_sigmoid_grad(shp, 1 / 6, 0.5), [x, g]),
                               torch_grad(F.hardsigmoid), atol=1e-6)
    assert (_same_bits(library.clip_grad(shp, 0.0, 6.0), [x, g]) == torch_grad(F.relu6)).all()
    t = _same_bits(library.map_unary("exp", shp), [x])
    lg = _same_bits(library.log1p_exp_log(shp), [t])
    sp = _same_bits(library.softplus_tail(shp), [x, t, lg])
    np.testing.assert_allclose(sp, F.softplus(xt).numpy(), rtol=3e-6, atol=0)
    np.testing.assert_allclose(_same_bits(library.sigmoid_times(shp), [x, g]), torch_grad(F.softplus),
                               rtol=1e-5, atol=1e-7)
    e = _edgy((64,))
    for desc, ins in ((library.hard_swish_grad((64,)), [e, e[::-1].copy()]), (library.softplus_tail((64,)), [e, e, e])):
        _same_bits(desc, ins)


def test_concat_and_pad() -> None:
    a, b, c = (_edgy(s) for s in ((2, 3, 4), (2, 1, 4), (2, 2, 4)))
    got = _same_bits(library.concat([a.shape, b.shape, c.shape], 1), [a, b, c])
    ref = np.concatenate([a, b, c], 1)
    # SELECT passes a NaN on canonicalised; every other bit is the input's
    assert (got.view(np.uint32) == np.where(np.isnan(ref), np.uint32(0x7FC00000), ref.view(np.uint32))).all()
    p = _same_bits(library.pad(a.shape, (0, 1, 2, 0, -1, 1), 1.5), [a])
    ref = np.pad(a, ((0, 0), (1, 0), (2, 1)), constant_values=1.5)[:, :-1, :]
    assert (p.view(np.uint32) == ref.view(np.uint32)).all()  # raw bits: a pad copies NaN payloads
    back = _same_bits(library.pad(p.shape, (0, -1, -2, 0, 1, -1)), [p])
    assert back.shape == a.shape and (back[:, :2].view(np.uint32) == a[:, :2].view(np.uint32)).all()
    assert (back[:, 2] == 0).all()  # the cropped row comes back as zeros


def test_dropout_apply_scales_kept_elements() -> None:
    x = RNG.standard_normal(100).astype(np.float32)
    mask = (RNG.random(100) > 0.3).astype(np.float32)
    y = _same_bits(library.dropout_apply(x.shape, 0.3), [x, mask])
    scale = np.float32(1 / (1 - np.float32(0.3)))
    assert (y == (x * mask) * scale).all()

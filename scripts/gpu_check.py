"""One-shot GPU check of the RepOps CUDA backend: build, bitwise comparisons with the CPU
kernels, a short training run on both backends, and a GEMM benchmark against cuBLAS FP32.
Prints ONE JSON summary line (and writes it to --out).

Usage (on a machine with a CUDA-enabled torch and nvcc):
    python scripts/gpu_check.py [--out summary.json] [--sizes 1024 4096] [--quick]

Steps, each timed and recorded (a failing step is reported, later steps still run if they can):
  1. JIT-build kernels/cuda/repops_cuda.cu + kernels/cuda/repops_cuda_binding.cpp with
     torch.utils.cpp_extension.load (verde_chain.repops.backends.cuda.extension.build_extension:
     --fmad=false -ftz=false -prec-div=true -prec-sqrt=true, no fast math; arch = the device's
     compute capability), cached under build/native/. If that fails (say nvcc's CUDA major
     version differs from torch's), the .cu alone is built with nvcc as a shared library and
     called through ctypes ("build_mode" in the summary).
  2. "compare": GEMMs on random, edge-value (±0, subnormal, ±inf, NaN, max finite,
     cancellation), transposed, batched and broadcast inputs; bits vs
     verde_chain.repops.backends.cpu.extension.matmul (the CPU kernels, themselves tested against
     the spec).
  3. "families": the CUDA backend (GEMM + program interpreter) on every RepOps op family
     (family_cases(): every instruction on all edge pairs, maps, transcendentals, grads,
     binaries, matmul/gemm epilogues, reductions, softmax, layer_norm, losses, gather/scatter,
     optimizers, ...), node by node, bits vs the CPU C++ backend; plus larger shapes.
  4. "training": the digits example, 5 steps, make_runner("cuda") vs make_runner("cpu"):
     every step commitment C_0..C_T must agree. Both run whole steps (compile_step): on CUDA
     every node of a step works in one device arena, one upload / one download per step.
  5. "vision": the CNN jobs of issue #15 (digits_cnn, resnet18, mobilenet_v2: conv, batch norm,
     pooling, ...), 2 steps each, every commitment on make_runner("cuda") vs ("cpu").
  6. "step_timing": seconds per training step (median of --reps plain steps after warm-up)
     of a digits-wide MLP (hidden 512, batch 256) and the tiny transformer, the CUDA whole-step
     kernel vs the C++ CPU one, and the committed step after them compared (C_s identical).
  7. "bench": square GEMMs vs torch.matmul (cuBLAS, TF32 disabled) with CUDA events.
The summary is rewritten to --out after every step, so a run cut short still reports the steps
it finished. Exit status 0 iff every comparison is bit-identical. Without CUDA it prints the
summary with the reason and exits 1 (no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import torch

from verde_chain.repops import library, program, reference
from verde_chain.repops.backends.cuda import backend as cuda_backend
from verde_chain.repops.backends.cuda.backend import CudaBackend
from verde_chain.repops.backends.cuda.extension import CUDA_FLAGS, CtypesCuda, build_extension, cuda_status  # noqa: F401
from verde_chain.repops.backends.cuda.step import CudaStepKernel
from verde_chain.repops.edges import EDGE_BITS, edge_array, edge_floats
from verde_chain.repops.isa import THREE_REG_OPS, Instr, Op

EDGE = edge_floats()  # the project's one list of binary32 edge values
CtypesGemm = CtypesCuda  # the old name of the fallback (it now also runs programs)
Runner = Callable[[program.KernelDesc, list[np.ndarray]], np.ndarray]


def cuda_matmul(
    ext: Any, a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False
) -> torch.Tensor:
    a2 = a.transpose(-1, -2) if trans_a else a
    b2 = b.transpose(-1, -2) if trans_b else b
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = a2.expand(*batch, m, k).reshape(-1, m, k)
    b3 = b2.expand(*batch, k, n).reshape(-1, k, n)
    return ext.matmul3(a3, b3).reshape(*batch, m, n)


def edge(shape: tuple[int, ...], seed: int, frac: float) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < frac
    x[mask] = rng.choice(EDGE, size=int(mask.sum()))
    return torch.from_numpy(x)


def subnormal(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    mant = rng.integers(-(2**23) + 1, 2**23, size=shape).astype(np.float64)
    return torch.from_numpy((mant * 2.0**-149 * 2.0 ** rng.integers(0, 4, size=shape)).astype(np.float32))


def cases(quick: bool) -> list[tuple[str, torch.Tensor, torch.Tensor, bool, bool]]:
    g = torch.Generator().manual_seed(0)
    out = [
        ("1x1x1", torch.randn(1, 1, generator=g), torch.randn(1, 1, generator=g), False, False),
        ("7x13x5", torch.randn(7, 13, generator=g), torch.randn(13, 5, generator=g), False, False),
        ("129x257x65", torch.randn(129, 257, generator=g), torch.randn(257, 65, generator=g), False, False),
        ("trans_a", torch.randn(70, 130, generator=g), torch.randn(70, 33, generator=g), True, False),
        ("trans_b", torch.randn(130, 70, generator=g), torch.randn(33, 70, generator=g), False, True),
        ("trans_ab", torch.randn(70, 130, generator=g), torch.randn(33, 70, generator=g), True, True),
        ("batched", torch.randn(4, 65, 33, generator=g), torch.randn(4, 33, 70, generator=g), False, False),
        ("broadcast", torch.randn(3, 1, 20, 40, generator=g), torch.randn(5, 40, 17, generator=g), False, False),
        ("edge", edge((140, 300), 1, 0.3), edge((300, 150), 2, 0.3), False, False),
        ("edge_dense", edge((64, 40), 3, 0.8), edge((40, 64), 4, 0.8), False, False),
        ("subnormal", subnormal((130, 100), 5), torch.empty(100, 140).uniform_(-2, 2, generator=g), False, False),
        (
            "cancel",
            torch.ones(8, 64),
            torch.tensor([3.0, -3.0]).repeat(32).reshape(64, 1).expand(64, 9).contiguous(),
            False,
            False,
        ),
        ("1024", torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g), False, False),
    ]
    if not quick:
        out.append(
            ("777x2049x1000", torch.randn(777, 2049, generator=g), torch.randn(2049, 1000, generator=g), False, False)
        )
    return out


def compare(ext: Any, quick: bool) -> list[dict[str, Any]]:
    from verde_chain.repops.backends.cpu import extension as cpu_ext

    rows = []
    threads = max(1, len(os.sched_getaffinity(0)))
    for name, a, b, ta, tb in cases(quick):
        row: dict[str, Any] = {"case": name, "shape_a": list(a.shape), "shape_b": list(b.shape), "trans": [ta, tb]}
        try:
            want = cpu_ext.matmul(a, b, ta, tb, threads=threads).numpy().view(np.uint32)
            got = cuda_matmul(ext, a.cuda(), b.cuda(), ta, tb).cpu().numpy().view(np.uint32)
            diff = np.flatnonzero(want.reshape(-1) != got.reshape(-1))
            row["mismatches"] = int(diff.size)
            row["elements"] = int(want.size)
            if diff.size:
                i = int(diff[0])
                row["first_mismatch"] = {
                    "index": i,
                    "cpu": f"0x{int(want.reshape(-1)[i]):08x}",
                    "gpu": f"0x{int(got.reshape(-1)[i]):08x}",
                }
        except Exception as exc:  # noqa: BLE001 - one failing case must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def bench(ext: Any, sizes: list[int]) -> list[dict[str, Any]]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        iters = 20 if n <= 2048 else 5

        def timed(fn: Any, iters: int = iters) -> float:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters

        t_cublas = timed(lambda a=a, b=b: torch.matmul(a, b))
        t_repops = timed(lambda a=a, b=b: ext.matmul3(a[None], b[None]))
        flops = 2.0 * n**3
        rows.append(
            {
                "n": n,
                "cublas_ms": round(t_cublas, 3),
                "repops_ms": round(t_repops, 3),
                "cublas_tflops": round(flops / t_cublas / 1e9, 2),
                "repops_tflops": round(flops / t_repops / 1e9, 2),
                "ratio": round(t_repops / t_cublas, 3),
            }
        )
    return rows


# ======================================================================= op families
#
# The same cases run here on the GPU (CUDA backend vs the CPU C++ backend) and on the host in
# tests/repops/test_cuda_program.py (the interpreter header compiled by g++ vs reference.run), so the
# GPU run checks exactly the descriptors whose host twin is already proven.

Case = tuple[str, library.Composite, list[np.ndarray]]
EDGE_U32 = np.array(EDGE_BITS, dtype=np.uint32)
# Operands where the integer ops and LDEXP change behaviour, added to the edge list in the
# instruction grid: ties of RINT (even and odd neighbours), exponents around the subnormal
# and overflow thresholds and the LDEXP clamp, non-integral exponents, the largest ints.
EXTRA_VALUES = (
    2.5, -2.5, 4.5, -0.5, 0.75, -1.25, 8388606.5, -8388605.5, 7.0, -7.0, 24.0, -24.0, 126.0, -126.0,
    127.0, 128.0, -149.0, -150.0, 149.0, 254.0, -277.0, 300.0, -399.0, 400.0, 401.0, -1000.0,
    1e6, 16777215.0, 2.0**-130, -(2.0**-140),
)  # fmt: skip
EXTRA_U32 = np.concatenate(
    [np.array(EXTRA_VALUES, np.float32).view(np.uint32), np.array([0x00000003, 0x80000100, 0x00200001], np.uint32)]
)


def _one(desc: program.KernelDesc, *ins: np.ndarray) -> Case:
    return (desc.label or "node", library.single(desc, [x.shape for x in ins]), list(ins))


def family_cases(seed: int = 0, big: bool = False) -> list[Case]:
    """Every RepOps op family on small shapes with edge values (``big``: larger shapes as well,
    for the GPU: many blocks, grid-stride loops, long K)."""
    rng = np.random.default_rng(seed)
    s = seed * 1000
    cases: list[Case] = []
    # every arithmetic instruction on the full grid of edge operand pairs (c: random edges)
    operands = np.concatenate([EDGE_U32, EXTRA_U32])
    a, b = (g.reshape(-1) for g in np.meshgrid(operands, operands))
    c = rng.choice(operands, a.size)
    grid = [x.view(np.float32) for x in (a, b, c)]
    for op in Op:
        if op in (Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX):
            continue
        instr = Instr(op, 0, 0, 1, 2 if op in THREE_REG_OPS else 0)
        cases.append((f"instr_{op.name}", library.single(library.elementwise(op.name, [(a.size,)] * 3, (instr,))), grid))
    # NaN payloads through chains; raw CONST/LOAD bits kept; MOV canonical; COORD exact
    chain = (
        Instr(Op.SUB, 3, 0, 1), Instr(Op.NEG, 4, 3), Instr(Op.ABS, 5, 4), Instr(Op.SELECT, 6, 5, 3, 1),
        Instr(Op.MAX, 7, 6, 0), Instr(Op.LT, 8, 3, 0), Instr(Op.FMA, 9, 6, 8, 5), Instr(Op.MIN, 10, 9, 2),
        Instr(Op.LDEXP, 11, 10, 8), Instr(Op.EQ, 12, 11, 11), Instr(Op.GETEXP, 13, 10), Instr(Op.GETMANT, 14, 10),
    )  # fmt: skip
    for tail_name, tail in [
        ("select", (Instr(Op.SELECT, 0, 12, 9, 6),)),
        ("mov", (Instr(Op.MOV, 0, 2),)),
        ("load", (library.load(0, 1),)),
        ("const", (Instr(Op.CONST, 0, imm=0xFFC00001),)),
        ("ldexp", (Instr(Op.LDEXP, 0, 14, 13),)),
    ]:
        cases.append(
            (f"chain_{tail_name}", library.single(library.elementwise("chain", [(a.size,)] * 3, chain + tail)), grid)
        )
    x57 = edge_array((5, 7), s + 1, 0.6)
    raw = (
        library.load(0, 0), Instr(Op.COORD, 3, imm=0), Instr(Op.COORD, 4, imm=1), Instr(Op.CONST, 5, imm=0xFFC00001),
        Instr(Op.MOV, 6, 0), Instr(Op.SELECT, 0, 3, 0, 5),
    )  # fmt: skip
    cases.append(_one(program.KernelDesc((5, 7), 1, (program.InputMap(35, (7, 1)),), raw, label="raw_bits"), x57))
    cases.append(_one(library.elementwise("coord", [(5, 7)], (Instr(Op.COORD, 0, imm=1), Instr(Op.MUL, 0, 0, 0))), x57))
    # registers start at +0; a body register carried across k
    x = edge_array((300, 6), s + 4, 0.3)
    m = program.InputMap(x.size, (6,), 1)
    carried = program.KernelDesc(
        (300,), 6, (m,), (library.load(1, 0), Instr(Op.ADD, 0, 1, 7)),
        (library.load(1, 0), Instr(Op.ADD, 9, 9, 1), Instr(Op.MUL, 0, 9, 9)), (Instr(Op.ADD, 0, 0, 11),), label="carried",
    )  # fmt: skip
    cases.append(_one(carried, x))
    # unary maps (incl. every transcendental), on edges plus a wide range
    xu = np.concatenate(
        [EDGE, EXTRA_U32.view(np.float32), edge_array((2000,), s + 71, 0.1, 10.0), edge_array((300,), s + 72, 0, 200.0)]
    )
    for name in sorted(library.UNARY_CODE) + list(library.TRANSCENDENTAL_UNARY):
        cases.append(_one(library.map_unary(name, xu.shape), xu))
    for approx in ("none", "tanh"):
        cases.append(_one(library.gelu(xu.shape, approx), xu))
    xg, gg = edge_array((20, 30), s + 81, 0.2), edge_array((20, 30), s + 82, 0.2)
    for name in sorted(library.GRAD_CODE) + ["gelu_erf_grad", "gelu_tanh_grad"]:
        cases.append(_one(library.unary_grad(name, xg.shape), xg, gg))
    # binaries, same shape and broadcast; other maps
    ba, bb, bc = edge_array((4, 8), s + 61, 0.4), edge_array((4, 8), s + 62, 0.4), edge_array((3, 1, 8), s + 63, 0.4)
    for bop in sorted(library.BINARY_CODE):
        cases.append(_one(library.binary(bop, ba.shape, bb.shape), ba, bb))
        cases.append(_one(library.binary(bop, bc.shape, bb.shape), bc, bb))
    xm = edge_array((9, 13), s + 91, 0.3)
    cases.append(_one(library.map_affine(xm.shape, 0.3, -1.25), xm))
    cases.append(_one(library.clip(xm.shape, -1.0, 2.0), xm))
    cases.append(_one(library.leaky_relu(xm.shape, 0.01), xm))
    cond = edge_array((9, 1), s + 92, 0.5)
    cases.append(_one(library.where(cond.shape, xm.shape, (13,)), cond, xm, edge_array((13,), s + 93)))
    # matmul / gemm: GEMM-shaped (dot path), GEMV shapes and squeezed vectors (interpreter),
    # transposes, broadcast batches, K = 1, gemm epilogues (alpha, beta, bias broadcast)
    mm = [
        ((6, 9), (9, 5), False, False), ((9, 6), (5, 9), True, True), ((2, 4, 7), (7, 3), False, False),
        ((7,), (7, 4), False, False), ((2, 4, 7), (7,), False, False), ((1, 30), (30, 9), False, False),
        ((3, 1, 4, 7), (2, 7, 5), False, False), ((5, 1), (1, 6), False, False), ((64, 33), (64, 17), True, False),
        ((40, 70), (90, 70), False, True),
    ]  # fmt: skip
    for i, (sa, sb, ta, tb) in enumerate(mm):
        cases.append(
            _one(library.matmul(sa, sb, ta, tb), edge_array(sa, s + 110 + i, 0.1), edge_array(sb, s + 130 + i, 0.1))
        )
    for i, (cs, alpha, beta, ta, tb) in enumerate(
        [(None, 1.0, 1.0, False, False), ((5,), 0.5, 1.0, False, True), ((6, 5), 1.0, -2.0, True, False),
         ((6, 1), 0.1, 0.3, True, True), ((6, 5), 2.0, 0.0, False, False)]
    ):  # fmt: skip
        ga = edge_array((9, 6) if ta else (6, 9), s + 150 + i, 0.2)
        gb = edge_array((5, 9) if tb else (9, 5), s + 160 + i, 0.2)
        ins = [ga, gb] + ([edge_array(cs, s + 170 + i, 0.3)] if cs is not None and beta != 0.0 else [])
        cases.append(
            (
                f"gemm_{i}",
                library.single(library.gemm(ga.shape, gb.shape, cs, alpha, beta, ta, tb), [t.shape for t in ins]),
                ins,
            )
        )
    # an epilogue reading a body register (must not take the GEMM path)
    mmd = library.matmul((4, 6), (6, 3))
    odd = program.KernelDesc(
        mmd.out_shape, mmd.K, mmd.inputs, mmd.prologue, mmd.body, (Instr(Op.ADD, 0, 0, 1),), label="matmul_odd_epilogue"
    )
    cases.append(_one(odd, edge_array((4, 6), s + 31), edge_array((6, 3), s + 32)))
    # reductions: every kind, several axes; reduce_dot; log_sum_exp
    xr = edge_array((6, 11, 4), s + 51, 0.2)
    for kind in library.REDUCE_KINDS:
        for axes, keep in [((1, 2), False), ((2,), True), ((0,), False), (None, True)]:
            cases.append((f"reduce_{kind}", library.reduce_composite(kind, xr.shape, axes, keep), [xr]))
    xk1 = np.array([[0x7F800001], [0xFFC12345], [0x80000000]], np.uint32).view(np.float32)
    cases.append(_one(library.reduce("sum", xk1.shape, (1,), False), xk1))  # K = 1: raw payloads
    xd, yd = edge_array((5, 7, 3), s + 41), edge_array((5, 7, 3), s + 42)
    for axes, mean in [((1,), False), ((2,), True), (None, False)]:
        cases.append(_one(library.reduce_dot(xd.shape, axes, keepdims=True, mean=mean), xd, yd))
    xs = edge_array((6, 10), s + 111, 0.05)
    gs = edge_array((6, 10), s + 112, 0.05)
    cases.append(("log_sum_exp", library.reduce_composite("log_sum_exp", xs.shape, (1,), False), [xs]))
    # data movement: transpose, reshape, expand, slices (negative strides), gather (every kind
    # of bad index), gather_elements, scatter_add
    xt = edge_array((3, 4, 5), s + 101)
    cases.append(_one(library.transpose(xt.shape, (2, 0, 1)), xt))
    cases.append(_one(library.reshape(xt.shape, (5, 12)), xt))
    cases.append(_one(library.expand((4, 1), (3, 4, 6)), edge_array((4, 1), s + 102)))
    ends: list[Any] = [None, 4, None]  # None: to the end (negative steps included)
    cases.append(_one(library.slice_(xt.shape, [2, 0, 4], ends, [-1, 2, -2]), xt))
    data = edge_array((10, 4), s + 2)
    idx = np.array(
        [0, 3, -1, -10, -11, 10, 2.5, -0.0, np.nan, np.inf, -np.inf, 9, 1e9, -1e9, 2.0**31, -(2.0**31)], np.float32
    )
    cases.append(_one(library.gather((10, 4), idx.shape, 0), data, idx))
    cases.append(_one(library.gather((10, 4), (4,), 1), data, np.array([3, -4, 0, 4], np.float32)))
    ie = np.array([[0, 3, 1], [-1, 7, 2]], np.float32)
    cases.append(_one(library.gather_elements((2, 4), (2, 3), 1), edge_array((2, 4), s + 3), ie))
    cases.append(
        _one(library.scatter_add(7, (3,), 5), edge_array((7, 3), s + 103), np.array([0, 4, 4, 2, 0, 1, 4], np.float32))
    )
    # the language models' operators: concat, trilu, slice and gather backward (a leading block),
    # gather_elements backward, pow by a constant, max/min and where gradients, rms_norm
    cases.append(_one(library.concat([(3, 2, 5), (3, 4, 5)], 1), edge_array((3, 2, 5), s + 140), edge_array((3, 4, 5), s + 141)))
    cases.append(_one(library.trilu((2, 5, 6), 1, True), edge_array((2, 5, 6), s + 142)))
    cases.append(_one(library.trilu((5, 6), -1, False), edge_array((5, 6), s + 143)))
    sliced = library.slice_(xt.shape, [2, 0, 4], ends, [-1, 2, -2]).out_shape
    cases.append(_one(library.slice_grad(xt.shape, [2, 0, 4], ends, [-1, 2, -2]), edge_array(sliced, s + 144)))
    ig = np.array([3, 0, -1, 2.5, 7], np.float32)
    cases.append(_one(library.gather_grad((3, 4, 5), ig.shape, 1), edge_array((3, 5, 5), s + 145), ig))
    cases.append(_one(library.gather_elements_grad((2, 4), (2, 3), 1), edge_array((2, 3), s + 146), ie))
    for exponent in (2.0, 3.0, 0.5, -0.5, -2.0, 1.5):
        cases.append(_one(library.pow_const(xt.shape, exponent), xt))
    xa, xb, xg = edge_array((6, 10), s + 147, 0.3), edge_array((1, 10), s + 148, 0.3), edge_array((6, 10), s + 149)
    xb[0, :3] = xa[0, :3]  # ties: the gradient is split
    for op in ("max", "min"):
        for wrt in (0, 1):
            cases.append(_one(library.minmax_grad(op, xa.shape, xb.shape, wrt), xa, xb, xg))
    cw = edge_array((6, 1), s + 150, 0.5)
    for branch in (1, 2):
        cases.append(_one(library.where_grad(cw.shape, xg.shape, branch), cw, xg))
    xn, sn = edge_array((6, 10), s + 151, 0.05), edge_array((10,), s + 152, 0.05)
    cases.append(("rms_norm", library.rms_norm(xn.shape, -1, 1e-6, True), [xn, sn]))
    _, inv_rms = library.rms_norm(xn.shape, -1, 1e-6, False).run([xn])
    cases.append(("rms_norm_backward", library.rms_norm_backward(xn.shape, -1), [xn, sn, inv_rms, xg]))
    # compositions: softmax family, layer norm, losses, optimizers, backward passes
    cases.append(("softmax", library.softmax(xs.shape, -1), [xs]))
    cases.append(("log_softmax", library.log_softmax(xs.shape, 0), [xs]))
    cases.append(("softmax_backward", library.softmax_backward(xs.shape, -1), [xs, gs]))
    cases.append(("log_softmax_backward", library.log_softmax_backward(xs.shape, -1), [xs, gs]))
    cases.append(
        (
            "layer_norm",
            library.layer_norm(xs.shape, 1, 1e-5, True, True),
            [xs, edge_array((10,), s + 113), edge_array((10,), s + 114)],
        )
    )
    _, mean_, istd = library.layer_norm(xs.shape, 1, 1e-5, False, False).run([xs])
    cases.append(
        (
            "layer_norm_backward",
            library.layer_norm_backward(xs.shape, 1),
            [xs, edge_array((10,), s + 115), mean_, istd, gs],
        )
    )
    labels = np.array([0, 3, 9, 2, 2, 7], np.float32)
    for red in ("mean", "sum", "none"):
        cases.append((f"sce_{red}", library.softmax_cross_entropy(xs.shape, red), [xs, labels]))
    gl = np.ones(1, np.float32)
    cases.append(("sce_backward", library.softmax_cross_entropy_backward(xs.shape, "mean"), [xs, labels, gl]))
    p, buf = edge_array((5, 4), s + 116, 0.1), edge_array((5, 4), s + 117, 0.1)
    g54 = gs[:5, :4].copy()
    v = np.abs(edge_array((5, 4), s + 118, 0.1))
    cases.append(("sgd_nesterov", library.sgd(p.shape, 0.1, 0.9, 0.0, 1e-4, True, False), [p, g54, buf]))
    cases.append(("sgd_first", library.sgd(p.shape, 0.05, 0.9, 0.1, 0.0, False, True), [p, g54, buf]))
    cases.append(("adamw", library.adam(p.shape, 1e-3, 3, (0.9, 0.999), 1e-8, 0.01, True), [p, g54, buf, v]))
    cases.append(("adam_l2", library.adam(p.shape, 1e-3, 1, (0.9, 0.999), 1e-8, 0.01, False), [p, g54, buf, v]))
    cases.append(("onnx_momentum", library.onnx_momentum(p.shape, 0.1, 2, 0.9, 1.0, 0.01, "nesterov"), [p, g54, buf]))
    cases.append(("onnx_adam", library.onnx_adam(p.shape, 0.1, 2, 0.9, 0.999, 1e-6, 0.01, 0.0), [p, g54, buf, v]))
    cases.append(
        (
            "matmul_backward",
            library.matmul_backward((6, 10), (10, 3)),
            [xs, edge_array((10, 3), s + 119), edge_array((6, 3), s + 120)],
        )
    )
    for bop in ("add", "sub", "mul", "div"):
        cases.append(
            (f"{bop}_backward", library.binary_backward(bop, (6, 10), (1, 10)), [xs, edge_array((1, 10), s + 121), gs])
        )
    if big:
        xb = edge_array(((1 << 20) + 3,), s + 200, 0.01, 10.0)
        for name in ("exp", "tanh", "erf", "gelu_tanh"):
            cases.append((f"big_{name}", library.single(library.map_unary(name, xb.shape)), [xb]))
        xw = edge_array((300, 257), s + 201, 0.01)
        for kind in ("sum", "max", "l2"):
            cases.append((f"big_reduce_{kind}", library.reduce_composite(kind, xw.shape, (1,), False), [xw]))
        xl = edge_array((64, 4096), s + 202, 0.001)
        cases.append(("big_softmax", library.softmax(xl.shape, -1), [xl]))
        cases.append(("big_layer_norm", library.layer_norm(xl.shape, 1, 1e-5, False, False), [xl]))
        cases.append(
            (
                "big_gemm",
                library.single(library.gemm((300, 513), (200, 513), (200,), 1.0, 1.0, False, True)),
                [
                    edge_array((300, 513), s + 203, 0.01),
                    edge_array((200, 513), s + 204, 0.01),
                    edge_array((200,), s + 205),
                ],
            )
        )
        cases.append(
            (
                "long_k_reduce_dot",
                library.single(library.reduce_dot((4, 100000), (1,), True)),
                [edge_array((4, 100000), s + 206, 0.0), edge_array((4, 100000), s + 207, 0.0)],
            )
        )
    return cases


CONV_CASES = [  # x shape, w shape, strides, dilations, pads, groups
    ((2, 4, 9, 8), (6, 2, 3, 2), (2, 3), (1, 2), (2, 0, 1, 3), 2),
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),
    ((1, 4, 5, 5), (4, 1, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 4),
    ((2, 3, 11), (2, 3, 4), (3,), (2,), (2, 1), 1),
]


def conv_descs(convs: list[tuple[Any, ...]]) -> list[program.KernelDesc]:
    """Forward (with bias), grad-input and grad-weight of each conv case."""
    out = []
    for xs, ws, st, dil, pads, groups in convs:
        geo = library.ConvGeometry.make(xs, ws[2:], st, dil, pads)
        out += [library.convolution(geo, ws, groups, True), library.conv_grad_input(geo, ws, groups),
                library.conv_grad_weight(geo, ws, groups)]
    return out


def conv_cases(seed: int = 0, big: bool = False) -> list[Case]:
    """Convolution forward and both gradients (the windowed GEMM: padding, strides, dilations,
    groups, depthwise, 1-D; ``big``: a resnet-sized 64 -> 64 3x3 layer)."""
    s = seed * 1000
    cases: list[Case] = []
    convs: list[tuple[Any, ...]] = list(CONV_CASES)
    if big:
        convs.append(((8, 64, 32, 32), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1))
    for i, desc in enumerate(conv_descs(convs)):
        ins = [edge_array((m.numel,), s + 300 + 10 * i + t, 0.05) for t, m in enumerate(desc.inputs)]
        cases.append(_one(desc, *ins))
    return cases


class NodeChecker:
    """A runner that runs every node on both backends, records nodes whose bits differ and hands
    the EXPECTED result on (so one bad node does not cascade into the next ones)."""

    def __init__(self, candidate: Runner, expected: Runner) -> None:
        self.candidate, self.expected = candidate, expected
        self.nodes = 0
        self.elements = 0
        self.mismatches: list[dict[str, Any]] = []

    def __call__(self, desc: program.KernelDesc, ins: list[np.ndarray]) -> np.ndarray:
        want = np.asarray(self.expected(desc, ins), dtype=np.float32)
        got = np.asarray(self.candidate(desc, ins), dtype=np.float32)
        self.nodes += 1
        self.elements += int(want.size)
        w, g = want.reshape(-1).view(np.uint32), got.reshape(-1).view(np.uint32)
        if g.shape != w.shape:
            self.mismatches.append({"node": desc.label, "error": f"shape {got.shape} != {want.shape}"})
        else:
            bad = np.flatnonzero(g != w)
            if bad.size:
                i = int(bad[0])
                self.mismatches.append(
                    {
                        "node": desc.label,
                        "count": int(bad.size),
                        "index": i,
                        "want": f"0x{int(w[i]):08x}",
                        "got": f"0x{int(g[i]):08x}",
                    }
                )
        return want


def check_families(candidate: Runner, expected: Runner, cases: list[Case]) -> list[dict[str, Any]]:
    """One row per case: nodes and elements compared, mismatching nodes (first element each)."""
    rows = []
    for name, comp, ins in cases:
        chk = NodeChecker(candidate, expected)
        row: dict[str, Any] = {"case": name}
        try:
            comp.run(ins, chk)
        except Exception as exc:  # noqa: BLE001 - one failing case must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
        row.update(nodes=chk.nodes, elements=chk.elements, mismatches=chk.mismatches)
        rows.append(row)
    return rows


def families(cuda: Runner, quick: bool) -> dict[str, Any]:
    """The CUDA backend vs the CPU C++ backend (the numpy reference if that cannot build)."""
    from verde_chain.repops.backends import BackendUnavailable
    from verde_chain.repops.backends.cpu.backend import CpuBackend

    try:
        expected: Runner = CpuBackend()
        against = "cpu"
    except BackendUnavailable:
        expected, against = reference.run, "reference"
    cases = family_cases(0, big=not quick) + family_cases(1) + conv_cases(0, big=not quick) + conv_cases(1)
    rows = check_families(cuda, expected, cases)
    bad = [r for r in rows if r.get("error") or r["mismatches"]]
    return {
        "against": against, "cases": len(rows), "nodes": sum(r["nodes"] for r in rows),
        "elements": sum(r["elements"] for r in rows), "failed": bad,
    }  # fmt: skip


def training(example: str = "digits", steps: int = 5) -> dict[str, Any]:
    """`example`, `steps` steps: every commitment C_0..C_T on make_runner("cuda") vs ("cpu")."""
    from verde_chain.examples import EXAMPLES
    from verde_chain.graph.backend import make_runner

    job = EXAMPLES[example](steps=steps)
    out: dict[str, Any] = {"example": example, "steps": steps, "nodes": len(job.program.graph.nodes)}
    commits = {}
    for name in ("cuda", "cpu"):
        t0 = time.perf_counter()
        run = job.make_run(None, 0, make_runner(name), steps)
        out[f"C_T_{name}"] = "0x" + run.run().hex()
        out[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        commits[name] = [run.commitments[s].hex() for s in range(steps + 1)]
        if name == "cuda":
            out["cuda_whole_step"] = isinstance(run.exec.step_kernel(), CudaStepKernel)
    out["identical"] = out["C_T_cuda"] == out["C_T_cpu"] and commits["cuda"] == commits["cpu"]
    return out


VISION_JOBS = ("digits_cnn", "resnet18", "mobilenet_v2")


def vision(steps: int = 2) -> dict[str, Any]:
    """The convolutional example jobs, each on its own (one failing job does not hide the others)."""
    out: dict[str, Any] = {}
    for example in VISION_JOBS:
        try:
            out[example] = training(example, steps)
        except Exception:  # noqa: BLE001 - the summary reports every failure
            out[example] = {"identical": False, "error": traceback.format_exc()[-2000:]}
    return out


def step_timing(cuda: Runner, reps: int = 20) -> dict[str, Any]:
    """Seconds per plain training step, CUDA whole-step kernel vs the C++ CPU one (all cores),
    for a digits-wide MLP and the tiny transformer; then one committed step on each, whose C_s
    must agree. One entry per model."""
    from verde_chain.examples import EXAMPLES
    from verde_chain.graph.backend import make_runner
    from verde_chain.graph.executor import PlainState, StepExecutor

    models = {
        "digits_wide": lambda: EXAMPLES["digits"](steps=reps + 3, hidden=512, batch_size=256),
        "transformer": lambda: EXAMPLES["transformer"](steps=reps + 3),
    }
    out: dict[str, Any] = {}
    for model, make_job in models.items():
        job = make_job()
        row: dict[str, Any] = {}
        commits = {}
        for name, runner in (("cuda", cuda), ("cpu", make_runner("cpu"))):
            ex = StepExecutor(job.program.graph, runner)
            if name == "cuda":
                row["whole_step"] = isinstance(ex.step_kernel(), CudaStepKernel)
            st: PlainState = ex.initial_state(job.init_state)
            times = []
            for s in range(1, reps + 3):
                t0 = time.perf_counter()
                st = ex.run_plain(st, job.batch(s)).state
                times.append(time.perf_counter() - t0)
            commits[name] = ex.run_step(st, job.batch(reps + 3)).commitment
            row[f"{name}_ms"] = round(1e3 * float(np.median(times[2:])), 3)  # the first two warm up
        row["speedup"] = round(row["cpu_ms"] / row["cuda_ms"], 2)
        row["nodes"] = len(job.program.graph.nodes)
        row["identical"] = commits["cuda"] == commits["cpu"]
        out[model] = row
    return out


def _timed_step(summary: dict[str, Any], name: str, fn: Callable[[], Any], out: str | None) -> None:
    """summary[name] = fn(), its seconds in summary[name + "_s"]; a failure goes to the errors.
    The summary so far is then written to `out` (a run cut short keeps what it finished)."""
    t0 = time.perf_counter()
    try:
        summary[name] = fn()
    except Exception:  # noqa: BLE001 - the summary reports every failure
        summary["errors"].append(f"{name}: " + traceback.format_exc()[-3000:])
    summary[f"{name}_s"] = round(time.perf_counter() - t0, 1)
    print(f"gpu_check: {name} done in {summary[f'{name}_s']} s", file=sys.stderr, flush=True)
    if out:
        Path(out).write_text(json.dumps(summary) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="also write the JSON summary here")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--quick", action="store_true", help="skip the largest comparison cases")
    ap.add_argument("--steps", type=int, default=5, help="training steps of the digits comparison")
    ap.add_argument("--vision-steps", type=int, default=2, help="training steps of each CNN job compared")
    ap.add_argument("--reps", type=int, default=20, help="timed steps per model in step_timing")
    args = ap.parse_args()

    summary: dict[str, Any] = {"ok": False, "errors": []}
    reason = cuda_status()
    if reason is not None:
        summary["errors"].append(reason)
        print(f"gpu_check: {reason}; nothing to check here", file=sys.stderr)
    else:
        summary["device"] = torch.cuda.get_device_name()
        summary["capability"] = list(torch.cuda.get_device_capability())
        summary["torch"] = torch.__version__
        summary["torch_cuda"] = torch.version.cuda
        ext: Any = None
        t0 = time.perf_counter()
        try:
            ext = build_extension()
            summary["build_mode"] = "cpp_extension"
        except Exception:  # noqa: BLE001 - the summary reports every failure
            summary["build_warning"] = "cpp_extension: " + traceback.format_exc()[-3000:]
            try:
                ext = CtypesCuda()
                summary["build_mode"] = "nvcc+ctypes"
            except Exception:  # noqa: BLE001
                summary["errors"].append("build: " + traceback.format_exc()[-3000:])
        summary["build_s"] = round(time.perf_counter() - t0, 1)
        if ext is not None:
            _timed_step(summary, "compare", lambda: compare(ext, args.quick), args.out)
            cuda_be = CudaBackend(ext=ext)
            # make_runner("cuda") reaches the backend through cuda_backend.default_backend: point
            # it at the extension built above (whichever build mode succeeded).
            cuda_backend.default_backend = lambda: cuda_be  # type: ignore[assignment]
            _timed_step(summary, "families", lambda: families(cuda_be, args.quick), args.out)
            _timed_step(summary, "training", lambda: training("digits", args.steps), args.out)
            _timed_step(summary, "vision", lambda: vision(args.vision_steps), args.out)
            _timed_step(summary, "step_timing", lambda: step_timing(cuda_backend.CudaRunner(), args.reps), args.out)
            _timed_step(summary, "bench", lambda: bench(ext, args.sizes), args.out)
        rows = summary.get("compare", [])
        fam = summary.get("families", {})
        summary["ok"] = (
            bool(rows)
            and all(r.get("mismatches") == 0 for r in rows)
            and bool(fam) and not fam.get("failed")
            and summary.get("training", {}).get("identical", False)
            and bool(summary.get("vision"))
            and all(r.get("identical", False) for r in summary.get("vision", {}).values())
            and bool(summary.get("step_timing"))
            and all(r["identical"] for r in summary.get("step_timing", {}).values())
            and not summary["errors"]
        )  # fmt: skip
    line = json.dumps(summary)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

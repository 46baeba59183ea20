"""Vectorised numpy reference of the RepOps canonical semantics.

The same execution model as ``program.run_spec`` (see ``program.py``), but every register is a
uint32 array with one lane per output element: the order-free dimension (output elements) is
vectorised, the order-critical one (k) runs serially, ascending. Arithmetic goes through
``fp32.execute`` — the exact binary32 instruction semantics — so results are bit-identical to the
scalar interpreter and to the on-chain VM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verde_chain.repops.isa import CANONICAL_NAN, NUM_REGS, Instr, Op
from verde_chain.repops.program import KernelDesc, check_inputs


def _coords(desc: KernelDesc) -> list[np.ndarray]:
    """Per-axis coordinate arrays (int64, one lane per output element, C order)."""
    if not desc.out_shape:
        return []
    grids = np.indices(desc.out_shape, dtype=np.int64)
    return [g.reshape(-1) for g in grids]


def _index_values(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(valid, int64 index) for LOADIDX: valid where the float is integral and in int32 range."""
    x = bits.view(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(x) & (np.floor(x) == x) & (x >= -(2.0**31)) & (x < 2.0**31)
    idx = np.where(valid, x, 0).astype(np.int64)
    return valid, idx


def run_bits(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Execute ``desc``; returns the flat uint32 bit patterns of the output."""
    from verde_chain.repops import fp32

    fp32.require_ieee_env()  # also guards the float conversions of LOADIDX below
    flat = check_inputs(desc, inputs)
    n = desc.numel
    coords = _coords(desc)
    bases: list[np.ndarray] = []
    for m in desc.inputs:
        base = np.full(n, m.offset, dtype=np.int64)
        for c, s in zip(coords, m.strides):
            if s:
                base += c * s
        bases.append(base)
    coord_bits = [c.astype(np.float32).view(np.uint32) for c in coords]
    zero = np.zeros(n, dtype=np.uint32)
    regs = [zero.copy() for _ in range(NUM_REGS)]

    def run(instrs: Sequence[Instr], k: int) -> None:
        for ins in instrs:
            op = ins.op
            if op == Op.CONST:
                val = np.full(n, ins.imm, dtype=np.uint32)
            elif op == Op.COORD:
                val = coord_bits[ins.imm].copy()
            elif op == Op.LOAD:
                m = desc.inputs[ins.imm]
                val = flat[ins.imm][bases[ins.imm] + k * m.kstride]
            elif op == Op.LOADIDX:
                m = desc.inputs[ins.imm]
                valid, idx = _index_values(regs[ins.a])
                addr = bases[ins.imm] + k * m.kstride + idx * m.idx_stride
                ok = valid & (addr >= 0) & (addr < m.numel)
                val = np.full(n, CANONICAL_NAN, dtype=np.uint32)
                val[ok] = flat[ins.imm][addr[ok]]
            else:
                val = np.asarray(
                    fp32.execute(op, regs[ins.a], regs[ins.b], regs[ins.c]), dtype=np.uint32
                ).reshape(n)
            regs[ins.dst] = val

    run(desc.prologue, 0)
    for k in range(1, desc.K):
        run(desc.body, k)
    run(desc.epilogue, desc.K - 1)
    return regs[0]


def run(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Execute ``desc`` on float32 inputs (flat C order, any shape); float32 output of out_shape."""
    return run_bits(desc, inputs).view(np.float32).reshape(desc.out_shape)

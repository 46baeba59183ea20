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
from verde_chain.repops.program import InputMap, KernelDesc, check_inputs


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


class _Windows:
    """The windows of one input, vectorised: per k, the address term and the in-range lanes."""

    def __init__(self, desc: KernelDesc, m: InputMap, coords: list[np.ndarray]) -> None:
        self.desc, self.windows = desc, m.windows
        # the part of each window's v that depends on the output coordinate
        self.out_v = [w.offset + (coords[w.axis] * w.out_mul if w.out_mul else 0) for w in m.windows]

    def at(self, k: int) -> tuple[np.ndarray | int, np.ndarray | bool]:
        """(address term, lanes whose windows are all in range) at loop index k."""
        kd = self.desc.kdigits(k)
        term: np.ndarray | int = 0
        ok: np.ndarray | bool = True
        for w, ov in zip(self.windows, self.out_v):
            v = ov + (w.k_mul * kd[w.digit] if w.k_mul else 0)
            q = v // w.div
            ok = ok & (v >= 0) & (v - q * w.div == 0) & (q < w.size)
            term = term + q * w.stride
        return term, ok


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
    windows = [_Windows(desc, m, coords) if m.windows else None for m in desc.inputs]

    def windowed(t: int, k: int, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray | bool]:
        """Addresses with the windows' terms (0 where out of range) and the in-range lanes."""
        w = windows[t]
        if w is None:
            return addr, True
        term, ok = w.at(k)
        return np.where(ok, addr + term, 0), ok
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
                addr, inside = windowed(ins.imm, k, bases[ins.imm] + k * m.kstride)
                val = flat[ins.imm][addr]
                if inside is not True:
                    val = np.where(inside, val, np.uint32(m.fill))
            elif op == Op.LOADIDX:
                m = desc.inputs[ins.imm]
                valid, idx = _index_values(regs[ins.a])
                addr, inside = windowed(ins.imm, k, bases[ins.imm] + k * m.kstride)
                addr = addr + idx * m.idx_stride
                ok = valid & (addr >= 0) & (addr < m.numel)
                val = np.full(n, CANONICAL_NAN, dtype=np.uint32)
                val[ok] = flat[ins.imm][addr[ok]]
                if inside is not True:
                    val = np.where(inside, val, np.uint32(m.fill))
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

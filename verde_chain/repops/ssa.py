"""Straight-line programs written over virtual registers, with linear-scan register allocation.

The transcendental programs (``transcendental.py``) are long: written against fixed registers
they would be unreadable and fragile, so they are written as SSA code (every value a fresh
virtual register, :class:`V`) with a small builder, and ``allocate`` maps the values onto
r0..r15: dead code is dropped, a value's register is freed after its last use (and may be
taken by the instruction that reads it last), the lowest free register is always taken, and the
result ends in r0 (one MOV if it is not there). The allocation is deterministic, so the programs
(and the descHash of every kernel that contains one) are fixed by the source alone.

Inputs are pinned: input i is r_i when the program starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import NUM_REGS, THREE_REG_OPS, Instr, Op, bits_f32, f32_bits


class ProgramBuildError(RepOpsError):
    """A program could not be built (register pressure, inexact constant, dead value)."""


@dataclass(frozen=True)
class V:
    """A virtual register (SSA value)."""

    id: int


@dataclass
class ProgramBuilder:
    """Straight-line code over virtual registers; ``finish(result)`` allocates real ones."""

    n_inputs: int
    code: list[tuple[Op, int, tuple[int, ...], int]] = field(default_factory=list)  # op, dst, srcs, imm
    next_id: int = 0

    def __post_init__(self) -> None:
        self.inputs = [self._new() for _ in range(self.n_inputs)]

    def _new(self) -> V:
        v = V(self.next_id)
        self.next_id += 1
        return v

    def emit(self, op: Op, *srcs: V, imm: int = 0) -> V:
        dst = self._new()
        self.code.append((op, dst.id, tuple(s.id for s in srcs), imm))
        return dst

    # constants must be exact binary32 values: the program is the spec, no silent rounding
    def k(self, value: float) -> V:
        bits = f32_bits(value)
        if not (math.isnan(value) or bits_f32(bits) == value):
            raise ProgramBuildError(f"constant {value!r} is not exactly representable in binary32")
        return self.emit(Op.CONST, imm=bits)

    def kbits(self, bits: int) -> V:
        return self.emit(Op.CONST, imm=bits)

    def add(self, a: V, b: V) -> V:
        return self.emit(Op.ADD, a, b)

    def sub(self, a: V, b: V) -> V:
        return self.emit(Op.SUB, a, b)

    def mul(self, a: V, b: V) -> V:
        return self.emit(Op.MUL, a, b)

    def div(self, a: V, b: V) -> V:
        return self.emit(Op.DIV, a, b)

    def fma(self, a: V, b: V, c: V) -> V:
        return self.emit(Op.FMA, a, b, c)

    def min(self, a: V, b: V) -> V:
        return self.emit(Op.MIN, a, b)

    def max(self, a: V, b: V) -> V:
        return self.emit(Op.MAX, a, b)

    def lt(self, a: V, b: V) -> V:
        return self.emit(Op.LT, a, b)

    def select(self, cond: V, a: V, b: V) -> V:
        return self.emit(Op.SELECT, cond, a, b)

    def unary(self, op: Op, a: V) -> V:
        return self.emit(op, a)

    def horner(self, t: V, coeffs: list[float]) -> V:
        """c0 + t*(c1 + t*(c2 + ...)) with one FMA per step (coefficients low order first)."""
        acc = self.k(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, t, self.k(c))
        return acc

    def two_sum(self, a: V, b: V) -> tuple[V, V]:
        """s = fl(a+b) and the exact error e = (a+b) - s (Knuth, no ordering needed)."""
        s = self.add(a, b)
        bb = self.sub(s, a)
        e = self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))
        return s, e

    def finish(self, result: V) -> list[Instr]:
        return allocate(self, result)


def allocate(b: ProgramBuilder, result: V) -> list[Instr]:
    """Linear-scan register allocation of straight-line SSA code; result ends in r0."""
    # dead-code elimination (helpers may compute values a caller does not need)
    live = {result.id}
    code = []
    for op, dst, srcs, imm in reversed(b.code):
        if dst in live:
            code.append((op, dst, srcs, imm))
            live.update(srcs)
    code.reverse()
    last_use: dict[int, int] = {}
    for i, (_, _, srcs, _) in enumerate(code):
        for s in srcs:
            last_use[s] = i
    last_use[result.id] = len(code)
    phys: dict[int, int] = {}
    free = list(range(NUM_REGS))
    for idx, v in enumerate(b.inputs):
        phys[v.id] = idx
        free.remove(idx)
    # inputs that are never used are free from the start
    for v in b.inputs:
        if v.id not in last_use:
            free.append(phys[v.id])
    out: list[Instr] = []
    for i, (op, dst, srcs, imm) in enumerate(code):
        regs = [phys[s] for s in srcs]
        # operands whose last use is here can hand their register to the destination
        for s in set(srcs):
            if last_use.get(s) == i:
                free.append(phys[s])
        if dst not in last_use:
            raise ProgramBuildError(f"dead value v{dst} ({op.name}); remove it")
        if not free:
            raise ProgramBuildError(f"more than {NUM_REGS} live values at instruction {i}")
        free.sort()
        phys[dst] = free.pop(0)
        a = regs[0] if regs else 0
        bb = regs[1] if len(regs) > 1 else 0
        if op in THREE_REG_OPS:
            out.append(Instr(op, phys[dst], a, bb, regs[2]))
        else:
            out.append(Instr(op, phys[dst], a, bb, imm))
    if phys[result.id] != 0:
        out.append(Instr(Op.MOV, 0, phys[result.id], 0, 0))
    return out

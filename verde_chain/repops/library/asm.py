"""Writing scalar programs by hand: one helper per instruction form.

Programs in the operator library are short and hand-allocated: the registers they use are part
of each operator's committed descriptor (``descHash``), so they are spelled out, one instruction
per line, with the value each one computes in a comment. The conventions every hand-written
program follows:

* input ``t`` of an elementwise kernel is loaded into ``r_t`` by the prologue
  (:func:`verde_chain.repops.library.maps.elementwise`); reductions load inside their body;
* the result is ``r0`` after the last instruction;
* scratch registers are chosen above the registers of the inputs that are still read later in
  the program, so no input is overwritten before its last use (the optimizers' shared prefix
  uses ``r8``/``r9``, clear of the at most four inputs of any optimizer kernel).

Transcendental programs (:func:`transcendental`) are the exception: they are generated with
register allocation (``repops/ssa.py``), read ``r0`` (and ``r1`` for gradients), write ``r0``
and may clobber any register, so the library never fuses them into a reduction or after code
whose registers are still needed.
"""

from __future__ import annotations

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op, f32_bits


def I(op: Op, dst: int, a: int = 0, b: int = 0, c: int = 0) -> Instr:
    """``dst = op(a, b[, c])``: the register form of every arithmetic instruction."""
    return Instr(op, dst, a, b, c)


def const(dst: int, value: float) -> Instr:
    """CONST of ``value`` rounded to binary32 (exact for the constants we use; see docs)."""
    return Instr(Op.CONST, dst, imm=f32_bits(value))


def load(dst: int, slot: int) -> Instr:
    """``dst = input[slot]`` at the descriptor's address for this element and loop index k."""
    return Instr(Op.LOAD, dst, imm=slot)


def loadidx(dst: int, index_reg: int, slot: int) -> Instr:
    """``dst = input[slot]`` at the descriptor's address plus ``int(r_index_reg) * idx_stride``."""
    return Instr(Op.LOADIDX, dst, index_reg, 0, slot)


def coord(dst: int, axis: int) -> Instr:
    """``dst = float(this element's output coordinate along axis)``."""
    return Instr(Op.COORD, dst, imm=axis)


def transcendental(name: str) -> tuple[Instr, ...]:
    """The straight-line program of a transcendental function (input r0[, r1], result r0)."""
    from verde_chain.repops import transcendental as tr

    prog = tr.PROGRAMS.get(name)
    if prog is None:
        raise RepOpsError(f"{name}: no transcendental program; available: {sorted(tr.PROGRAMS)}")
    return tuple(prog)

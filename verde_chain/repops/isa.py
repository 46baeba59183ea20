"""The RepOps scalar instruction set: the closed set of binary32 instructions that every
operator's per-element program is written in.

This module is the single source of the opcode numbers and the instruction encoding. The
spec interpreter (``program.py``), the on-chain ScalarVM (``contracts/vm/ScalarVM.sol``) and its
Python twin (``verde_chain/vm/scalarvm.py``) all decode the same 8-byte words defined here.

Instruction word (8 bytes, big-endian, so Solidity reads it with one ``uint64`` cast)::

    byte:   0        1        2        3        4 .. 7
          +--------+--------+--------+--------+------------------+
          | opcode |  dst   |   a    |   b    |  c / imm32       |
          +--------+--------+--------+--------+------------------+

``dst``, ``a``, ``b`` are register numbers (0..NUM_REGS-1). The last four bytes hold either a
third register (``c``, in the low byte) or a 32-bit immediate (``CONST`` bits, ``LOAD`` input
slot, ``COORD`` axis). Registers hold raw binary32 bit patterns.

Semantics of every opcode are defined in ``docs/repops-spec.md``; all arithmetic is
round-to-nearest-even, subnormals are honoured, and any NaN result is replaced by
``CANONICAL_NAN``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

NUM_REGS = 16
CANONICAL_NAN = 0x7FC00000
INSTR_BYTES = 8


class Op(enum.IntEnum):
    """Opcodes. Numbers are part of the protocol: never renumber, only append."""

    ADD = 0  # dst = a + b
    SUB = 1  # dst = a - b
    MUL = 2  # dst = a * b
    DIV = 3  # dst = a / b
    FMA = 4  # dst = a * b + c, one rounding
    SQRT = 5  # dst = sqrt(a)
    MAX = 6  # dst = max(a, b); NaN if either is NaN; max(-0, +0) = +0
    MIN = 7  # dst = min(a, b); NaN if either is NaN; min(-0, +0) = -0
    LT = 8  # dst = 1.0 if a < b else 0.0 (false on NaN)
    EQ = 9  # dst = 1.0 if a == b else 0.0 (false on NaN, -0 == +0)
    SELECT = 10  # dst = b if a != 0.0 (as a float; NaN counts as true) else c
    RINT = 11  # dst = a rounded to an integral value, ties to even
    LDEXP = 12  # dst = a * 2**b, b integral (as float), one rounding
    GETEXP = 13  # dst = floor(log2(|a|)) as float, exact; see spec for 0/inf/NaN
    GETMANT = 14  # dst = |a| / 2**GETEXP(a), in [1, 2); see spec for 0/inf/NaN
    NEG = 15  # dst = -a (sign flip, exact; NaN stays canonical)
    ABS = 16  # dst = |a| (exact; NaN stays canonical)
    CONST = 17  # dst = imm32 (raw bits)
    LOAD = 18  # dst = input[imm](address from the kernel descriptor, loop index k)
    COORD = 19  # dst = float(output coordinate along axis imm)
    LOADIDX = 20  # dst = input[imm] at the address of the descriptor + int(reg a) * index stride
    MOV = 21  # dst = a
    FLOOR = 22  # dst = a rounded toward -inf to an integral value


# Opcodes whose `c` field is a register (the others use the last four bytes as imm32).
THREE_REG_OPS = frozenset({Op.FMA, Op.SELECT})
IMM_OPS = frozenset({Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX})

# The register-use table: the fields each opcode reads as registers ("a", "b", "c"; LOADIDX reads
# its index from a, CONST/LOAD/COORD read none). Executors use it for liveness (which registers
# a phase reads before writing them); scripts/codegen.py writes it into the C/C++/CUDA header.
REG_READS: dict[Op, tuple[str, ...]] = {
    **{op: ("a", "b") for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.LT, Op.EQ, Op.LDEXP)},
    **{op: ("a", "b", "c") for op in (Op.FMA, Op.SELECT)},
    **{op: ("a",) for op in (Op.SQRT, Op.RINT, Op.FLOOR, Op.GETEXP, Op.GETMANT, Op.NEG, Op.ABS, Op.MOV, Op.LOADIDX)},
    **{op: () for op in (Op.CONST, Op.LOAD, Op.COORD)},
}
# SAFETY: an opcode appended without a row here would be executed with unknown liveness (the C++
# interpreter zeroes only live registers): refuse to import instead.
if set(REG_READS) != set(Op) or any(("c" in r) != (op in THREE_REG_OPS) for op, r in REG_READS.items()):
    raise AssertionError("isa.REG_READS must have one row per Op, reading c exactly for THREE_REG_OPS")


@dataclass(frozen=True, slots=True)
class Instr:
    """One instruction. ``imm`` is the c register for FMA/SELECT, else the immediate."""

    op: Op
    dst: int = 0
    a: int = 0
    b: int = 0
    imm: int = 0

    def __post_init__(self) -> None:
        for name in ("dst", "a", "b"):
            r = getattr(self, name)
            if not 0 <= r < NUM_REGS:
                raise ValueError(f"{self.op.name}: register {name}={r} outside 0..{NUM_REGS - 1}")
        if self.op in THREE_REG_OPS and not 0 <= self.imm < NUM_REGS:
            raise ValueError(f"{self.op.name}: register c={self.imm} outside 0..{NUM_REGS - 1}")
        if not 0 <= self.imm < 2**32:
            raise ValueError(f"{self.op.name}: immediate {self.imm} does not fit 32 bits")

    @property
    def c(self) -> int:
        return self.imm

    def encode(self) -> bytes:
        return struct.pack(">BBBBI", int(self.op), self.dst, self.a, self.b, self.imm)

    @classmethod
    def decode(cls, word: bytes) -> Instr:
        if len(word) != INSTR_BYTES:
            raise ValueError(f"instruction word must be {INSTR_BYTES} bytes, got {len(word)}")
        op, dst, a, b, imm = struct.unpack(">BBBBI", word)
        try:
            opcode = Op(op)
        except ValueError:
            raise ValueError(f"unknown opcode {op}") from None
        return cls(opcode, dst, a, b, imm)


def encode_program(instrs: list[Instr] | tuple[Instr, ...]) -> bytes:
    return b"".join(i.encode() for i in instrs)


def decode_program(code: bytes) -> list[Instr]:
    if len(code) % INSTR_BYTES:
        raise ValueError(f"program length {len(code)} is not a multiple of {INSTR_BYTES}")
    return [Instr.decode(code[i : i + INSTR_BYTES]) for i in range(0, len(code), INSTR_BYTES)]


def f32_bits(x: float) -> int:
    """Bit pattern of ``x`` rounded to binary32 (for CONST immediates)."""
    return struct.unpack(">I", struct.pack(">f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack(">f", struct.pack(">I", b & 0xFFFFFFFF))[0]

"""Python twin of ``contracts/vm/ScalarVM.sol``: states, one-step execution, and step proofs.

State preimage (160 bytes, hashed with keccak256)::

    | descHash (32) | element (32) | step j (32) | r0 r1 ... r15 (16 x 4 bytes, big-endian) |

The arithmetic goes through ``verde_chain.vm.softfloat`` (the integer twin of
SoftFloat32.sol), never numpy, so this module predicts exactly what the contract computes. The
bots use :func:`prove_step` to build what the game's final move submits. A step the contract
would revert on raises ``CustomError`` with the name and fields of ``contracts/vm/VMErrors.sol``
(``MissingOperand``: the caller gave no operand for a memory read; the contract opens it from the
proof instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from eth_abi import encode as abi_encode

from verde_chain.commit.merkle import keccak256
from verde_chain.commit.tensor import open_element
from verde_chain.errors import CustomError
from verde_chain.repops import isa
from verde_chain.repops.isa import NUM_REGS, Op
from verde_chain.repops.program import KernelDesc, as_bits, instruction_at
from verde_chain.vm import softfloat

STATE_BYTES = 160
REGS_AT = 96


@dataclass(frozen=True)
class State:
    desc_hash: bytes
    element: int
    step: int
    regs: tuple[int, ...]

    def encode(self) -> bytes:
        return (
            self.desc_hash
            + self.element.to_bytes(32, "big")
            + self.step.to_bytes(32, "big")
            + b"".join(r.to_bytes(4, "big") for r in self.regs)
        )

    def hash(self) -> bytes:
        return keccak256(self.encode())

    @classmethod
    def decode(cls, data: bytes) -> State:
        if len(data) != STATE_BYTES:
            raise CustomError("BadStateLength", actual=len(data), expected=STATE_BYTES)
        regs = tuple(int.from_bytes(data[REGS_AT + 4 * i : REGS_AT + 4 * i + 4], "big") for i in range(NUM_REGS))
        return cls(data[:32], int.from_bytes(data[32:64], "big"), int.from_bytes(data[64:96], "big"), regs)


def initial_state(desc_hash: bytes, element: int) -> State:
    return State(desc_hash, element, 0, (0,) * NUM_REGS)


@dataclass(frozen=True)
class StepProof:
    """What the final move of a dispute submits, plus the post-state the contract will compute."""

    pre: State
    proof: bytes  # abi.encode((bytes chunk, bytes32[] siblings)) for a memory read, else b""
    post: State


def _coords(desc: KernelDesc, e: int) -> tuple[int, ...]:
    return desc.coords(e)


def memory_read(desc: KernelDesc, state: State, instr: isa.Instr, k: int) -> tuple[int, int | None, int]:
    """(input slot, address, bits) of a memory instruction: address None means nothing is read
    and the result is ``bits`` (a window's fill, or NaN for a bad LOADIDX index)."""
    c = _coords(desc, state.element)
    index = state.regs[instr.a] if instr.op == Op.LOADIDX else None
    addr, bits = desc.read(instr.imm, c, k, index)
    if addr is not None and not 0 <= addr < desc.inputs[instr.imm].numel:
        raise CustomError("AddressOutOfRange", input=instr.imm, addr=addr, numel=desc.inputs[instr.imm].numel)
    return instr.imm, addr, bits


def execute(desc: KernelDesc, state: State, loaded: int | None = None) -> State:
    """Run micro-step ``state.step``; ``loaded`` is the value a LOAD/LOADIDX reads (if any)."""
    n = desc.num_steps
    if state.step >= n:
        raise CustomError("StepOutOfRange", step=state.step, numSteps=n)
    instr, k = instruction_at(desc, state.step)
    regs = list(state.regs)
    if instr.op == Op.CONST:
        val = instr.imm
    elif instr.op == Op.COORD:
        val = softfloat.from_uint32(_coords(desc, state.element)[instr.imm])
    elif instr.op in (Op.LOAD, Op.LOADIDX):
        _, addr, val = memory_read(desc, state, instr, k)
        if addr is not None:
            if loaded is None:
                raise CustomError("MissingOperand", step=state.step)
            val = loaded
    else:
        val = softfloat.execute(int(instr.op), regs[instr.a], regs[instr.b], regs[instr.imm & 15])
    regs[instr.dst] = val
    return State(state.desc_hash, state.element, state.step + 1, tuple(regs))


def run_states(desc: KernelDesc, inputs: Sequence[np.ndarray], element: int) -> list[State]:
    """All N+1 states of one element's program (s_0 .. s_N)."""
    flat = [as_bits(x) for x in inputs]
    dh = desc.hash()
    s = initial_state(dh, element)
    out = [s]
    for _ in range(desc.num_steps):
        s = execute(desc, s, _loaded_value(desc, flat, s))
        out.append(s)
    return out


def _loaded_value(desc: KernelDesc, flat: Sequence[np.ndarray], s: State) -> int | None:
    instr, k = instruction_at(desc, s.step)
    if instr.op not in (Op.LOAD, Op.LOADIDX):
        return None
    t, addr, _ = memory_read(desc, s, instr, k)
    return None if addr is None else int(flat[t][addr])


def prove_step(desc: KernelDesc, inputs: Sequence[np.ndarray], pre: State) -> StepProof:
    """Build the proof for executing micro-step ``pre.step`` from ``pre`` (honest operands)."""
    flat = [as_bits(x) for x in inputs]
    instr, k = instruction_at(desc, pre.step)
    proof = b""
    loaded = None
    if instr.op in (Op.LOAD, Op.LOADIDX):
        t, addr, _ = memory_read(desc, pre, instr, k)
        if addr is not None:
            op = open_element(flat[t], addr)
            proof = abi_encode(["(bytes,bytes32[])"], [(op.chunk, list(op.proof))])
            loaded = op.bits
    return StepProof(pre, proof, execute(desc, pre, loaded))

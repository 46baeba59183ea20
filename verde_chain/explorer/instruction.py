"""The one instruction a dispute ends on, decoded for people: op, operands and result, each as a
binary32 value and as its bits.

The last move of a game (``DisputeGame.step``) sends the node's kernel descriptor, the agreed
pre-state s_j and, for a memory read, the Merkle opening of the word read. Replaying those bytes
through the ScalarVM twin (``verde_chain/vm/scalarvm.py``) yields exactly the post-state the
contract computed, so the explorer shows what the referee did without trusting either party:

    pre-state s_j  --(instruction j of the element's program, loop index k)-->  post-state s_j+1
    hash(s_j) = the state both parties agreed on    hash(s_j+1) vs the defender's claim decides

Pure: no chain access here (the chain adapter hands over the call's bytes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from eth_abi import decode as abi_decode

from verde_chain.commit.tensor import ElementOpening
from verde_chain.repops.isa import CANONICAL_NAN, REG_READS, Instr, Op, bits_f32
from verde_chain.repops.program import KernelDesc, instruction_at
from verde_chain.vm import scalarvm as vm

LOAD_PROOF_TYPES = ["(bytes,bytes32[])"]  # ScalarVM.LoadProof: (chunk, siblings)


def f32(bits: int) -> dict[str, Any]:
    """A binary32 bit pattern three ways: shortest round-trip decimal, hex, and sign|exponent|mantissa."""
    b = bits & 0xFFFFFFFF
    s = f"{b:032b}"
    return {"float": str(np.float32(bits_f32(b))), "bits": f"0x{b:08x}", "binary": f"{s[0]} {s[1:9]} {s[9:]}"}


def _register(name: str, reg: int, bits: int) -> dict[str, Any]:
    return {"operand": name, "register": reg, **f32(bits)}


def _assembly(ins: Instr, k: int, memory: dict[str, Any] | None) -> str:
    regs = ", ".join(f"r{getattr(ins, r)}" for r in REG_READS[ins.op])
    op = ins.op.name.lower()
    if ins.op == Op.CONST:
        return f"r{ins.dst} = const {f32(ins.imm)['bits']}"
    if ins.op == Op.COORD:
        return f"r{ins.dst} = coord axis {ins.imm}"
    if memory is not None:
        where = (f"in{ins.imm}[{memory['address']}]" if memory["address"] is not None
                 else "nothing (index out of range)" if memory["bits"] == f"0x{CANONICAL_NAN:08x}"
                 else f"nothing (window out of range: fill {memory['bits']})")
        return f"r{ins.dst} = {op}({regs + ', ' if regs else ''}{where})  k={k}"
    return f"r{ins.dst} = {op}({regs})"


def explain_step(desc: bytes, pre_state: bytes, proof: bytes) -> dict[str, Any]:
    """Decode ``step(desc, preState, proof)``: the instruction, what it read, what it wrote."""
    d = KernelDesc.decode(desc)
    pre = vm.State.decode(pre_state)
    ins, k = instruction_at(d, pre.step)
    coords = d.coords(pre.element)
    memory: dict[str, Any] | None = None
    loaded: int | None = None
    if ins.op in (Op.LOAD, Op.LOADIDX):
        slot, addr, bits = vm.memory_read(d, pre, ins, k)  # the twin's own addressing rule, not a copy of it
        memory = {"input": slot, "address": addr, **f32(bits)}  # without a read: the value it yields
        if addr is not None:
            chunk, siblings = abi_decode(LOAD_PROOF_TYPES, proof)[0]
            loaded = ElementOpening(addr, d.inputs[ins.imm].numel, bytes(chunk), tuple(siblings)).bits
            memory.update(f32(loaded))
    post = vm.execute(d, pre, loaded)
    immediate: dict[str, Any] | None = None
    if ins.op == Op.CONST:
        immediate = f32(ins.imm)
    elif ins.op == Op.COORD:
        immediate = {"axis": ins.imm, "coordinate": coords[ins.imm]}
    return {
        "micro_step": pre.step, "micro_steps": d.num_steps, "k": k, "element": pre.element, "coords": list(coords),
        "op": ins.op.name, "word": "0x" + ins.encode().hex(), "assembly": _assembly(ins, k, memory),
        "operands": [_register(name, getattr(ins, name), pre.regs[getattr(ins, name)])
                     for name in REG_READS[ins.op]],
        "immediate": immediate, "memory": memory,
        "result": _register("dst", ins.dst, post.regs[ins.dst]),
        "pre_state": "0x" + pre.hash().hex(), "post_state": "0x" + post.hash().hex(),
    }


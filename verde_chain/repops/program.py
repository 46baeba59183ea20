"""Kernel descriptors: the canonical definition of one RepOps primitive node.

A primitive node computes every output element ``e`` by running ONE straight-line scalar program
over binary32 registers. The :class:`KernelDesc` fixes everything that program can see:

    out_shape   output tensor shape (rank 0..6); element e <-> coordinates c (C order)
    K           reduction length (1 for a map)
    inputs      one InputMap per input tensor: where LOAD / LOADIDX read from
    prologue    run once with loop index k = 0
    body        run for k = 1 .. K-1, ascending (the ONE reduction order)
    epilogue    run once with k = K-1
    result      register r0 after the last instruction

Execution of one element (every register starts as +0.0 = bits 0)::

    step j:   0 .. P-1 | P .. P+(K-1)*B-1          | P+(K-1)*B .. N-1
    instr:    prologue | body[(j-P) % B]           | epilogue
    k:        0        | 1 + (j-P) // B            | K-1

    N = P + (K-1)*B + E  micro-steps;  VM state after j steps = (j, r0..r15)

Addressing (``InputMap``)::

    LOAD    t: addr = offset + sum_d c[d]*strides[d] + k*kstride       (checked in range statically)
    LOADIDX t: addr = (the same) + int(value of register a) * idx_stride
               register a must hold an integral, finite float with 0 <= addr < numel,
               otherwise the result is CANONICAL_NAN and nothing is read (decidable on-chain)

Canonical encoding (``KernelDesc.encode``) is Solidity's ``abi.encode`` of the six values::

    (uint32[] outShape, uint32 K,
     (uint64 numel, int64[] strides, int64 kstride, uint64 offset, int64 idxStride)[] inputs,
     bytes prologue, bytes body, bytes epilogue)            programs: isa.encode_program words

so a contract reads it with ``abi.decode(data, (uint32[], uint32, InputMap[], bytes, bytes,
bytes))``; ``KernelDesc.hash()`` is keccak256 of that encoding.

This module also holds the slow scalar interpreter (``run_spec``, ``trace``): element by
element, instruction by instruction, exactly the semantics the on-chain VM executes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from Crypto.Hash import keccak
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode

from verde_chain.errors import RepOpsError
from verde_chain.repops import isa
from verde_chain.repops.isa import CANONICAL_NAN, NUM_REGS, Instr, Op

MAX_RANK = 6
# COORD converts a coordinate to binary32; it is exact only below 2**24.
MAX_DIM = 1 << 24
ABI_TYPES = (
    "uint32[]",
    "uint32",
    "(uint64,int64[],int64,uint64,int64)[]",
    "bytes",
    "bytes",
    "bytes",
)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class DescriptorError(RepOpsError):
    """A KernelDesc is malformed (shape, strides, register or input slot out of range)."""

    def __init__(self, message: str, **fields: object) -> None:
        self.fields = fields
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class InputMap:
    """Affine address map of one input tensor (flat, C order, ``numel`` elements)."""

    numel: int
    strides: tuple[int, ...]  # one per OUTPUT dim; 0 = broadcast along that dim
    kstride: int = 0
    offset: int = 0
    idx_stride: int = 0

    def base_range(self, out_shape: tuple[int, ...], K: int) -> tuple[int, int]:
        """Smallest and largest LOAD address over all coordinates and k in [0, K-1]."""
        lo = hi = self.offset
        for s, n in zip(self.strides, out_shape):
            span = s * (n - 1)
            lo += min(0, span)
            hi += max(0, span)
        span = self.kstride * (K - 1)
        return lo + min(0, span), hi + max(0, span)


@dataclass(frozen=True)
class KernelDesc:
    """One primitive RepOps node (see the module docstring for the execution model)."""

    out_shape: tuple[int, ...]
    K: int
    inputs: tuple[InputMap, ...]
    prologue: tuple[Instr, ...]
    body: tuple[Instr, ...] = ()
    epilogue: tuple[Instr, ...] = ()
    # Human-readable name for logs and errors; NOT part of the encoding or the hash.
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_shape", tuple(int(d) for d in self.out_shape))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for name in ("prologue", "body", "epilogue"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.validate()

    # ----------------------------------------------------------------- validation
    def validate(self) -> None:
        who = self.label or "KernelDesc"
        if len(self.out_shape) > MAX_RANK:
            raise DescriptorError(f"{who}: rank {len(self.out_shape)} > {MAX_RANK}")
        for d in self.out_shape:
            if not 1 <= d <= MAX_DIM:
                raise DescriptorError(f"{who}: output dim {d} outside 1..{MAX_DIM}", dim=d)
        if not 1 <= self.K < 2**32:
            raise DescriptorError(f"{who}: K={self.K} must be in 1..2**32-1", K=self.K)
        if self.K > 1 and not self.body:
            raise DescriptorError(f"{who}: K={self.K} > 1 needs a non-empty body")
        if not self.prologue and not self.epilogue:
            raise DescriptorError(f"{who}: empty program")
        rank = len(self.out_shape)
        for t, m in enumerate(self.inputs):
            if len(m.strides) != rank:
                raise DescriptorError(
                    f"{who}: input {t} has {len(m.strides)} strides for rank {rank}", input=t
                )
            if not 1 <= m.numel < 2**63 or not 0 <= m.offset < 2**63:
                raise DescriptorError(f"{who}: input {t} numel {m.numel} / offset {m.offset} invalid", input=t)
            lo, hi = m.base_range(self.out_shape, self.K)
            uses_plain_load = any(
                i.op == Op.LOAD and i.imm == t for i in self.prologue + self.body + self.epilogue
            )
            if uses_plain_load and (lo < 0 or hi >= m.numel):
                raise DescriptorError(
                    f"{who}: input {t} addresses [{lo}, {hi}] leave [0, {m.numel})",
                    input=t,
                    lo=lo,
                    hi=hi,
                )
            for v in (*m.strides, m.kstride, m.idx_stride):
                if not INT64_MIN <= v <= INT64_MAX:
                    raise DescriptorError(f"{who}: input {t} stride {v} exceeds int64")
        for i in self.prologue + self.body + self.epilogue:
            if i.op in (Op.LOAD, Op.LOADIDX) and i.imm >= len(self.inputs):
                raise DescriptorError(
                    f"{who}: {i.op.name} reads input {i.imm} of {len(self.inputs)}", slot=i.imm
                )
            if i.op == Op.COORD and i.imm >= rank:
                raise DescriptorError(f"{who}: COORD axis {i.imm} >= rank {rank}", axis=i.imm)

    # ----------------------------------------------------------------- geometry
    @property
    def numel(self) -> int:
        return math.prod(self.out_shape)

    @property
    def num_steps(self) -> int:
        """N = len(prologue) + (K-1)*len(body) + len(epilogue)."""
        return len(self.prologue) + (self.K - 1) * len(self.body) + len(self.epilogue)

    def coords(self, e: int) -> tuple[int, ...]:
        """Output coordinates of flat element e (C order)."""
        if not 0 <= e < self.numel:
            raise DescriptorError(f"element {e} outside 0..{self.numel - 1}", element=e)
        out = []
        for d in reversed(self.out_shape):
            out.append(e % d)
            e //= d
        return tuple(reversed(out))

    def address(self, t: int, c: Sequence[int], k: int) -> int:
        m = self.inputs[t]
        return m.offset + sum(ci * si for ci, si in zip(c, m.strides)) + k * m.kstride

    # ----------------------------------------------------------------- encoding
    def encode(self) -> bytes:
        return abi_encode(
            list(ABI_TYPES),
            [
                list(self.out_shape),
                self.K,
                [(m.numel, list(m.strides), m.kstride, m.offset, m.idx_stride) for m in self.inputs],
                isa.encode_program(self.prologue),
                isa.encode_program(self.body),
                isa.encode_program(self.epilogue),
            ],
        )

    @classmethod
    def decode(cls, data: bytes) -> KernelDesc:
        shape, K, ins, pro, body, epi = abi_decode(list(ABI_TYPES), data)
        return cls(
            out_shape=tuple(shape),
            K=K,
            inputs=tuple(InputMap(n, tuple(s), ks, off, ids) for n, s, ks, off, ids in ins),
            prologue=tuple(isa.decode_program(pro)),
            body=tuple(isa.decode_program(body)),
            epilogue=tuple(isa.decode_program(epi)),
        )

    def hash(self) -> bytes:
        h = keccak.new(digest_bits=256)
        h.update(self.encode())
        return h.digest()


# Whatever executes one node: (descriptor, flat float32 inputs) -> flat float32 output. The
# interpreter below, ``reference.run`` and every backend's runner have this type.
Runner = Callable[[KernelDesc, list[np.ndarray]], np.ndarray]


def instruction_at(desc: KernelDesc, j: int) -> tuple[Instr, int]:
    """The instruction executed at micro-step j (0-based) and its loop index k, in O(1)."""
    P, B = len(desc.prologue), len(desc.body)
    N = desc.num_steps
    if not 0 <= j < N:
        raise DescriptorError(f"step {j} outside 0..{N - 1}", step=j)
    if j < P:
        return desc.prologue[j], 0
    body_end = P + (desc.K - 1) * B
    if j < body_end:
        q, r = divmod(j - P, B)
        return desc.body[r], 1 + q
    return desc.epilogue[j - body_end], desc.K - 1


# ======================================================================= scalar interpreter


@dataclass(frozen=True, slots=True)
class VMState:
    """State of one element's VM after ``step`` micro-steps."""

    step: int
    regs: tuple[int, ...]  # NUM_REGS uint32 bit patterns


@dataclass(frozen=True, slots=True)
class MemAccess:
    """What a LOAD/LOADIDX read: the input slot, flat address (None: no read, result NaN), bits."""

    input: int
    address: int | None
    value: int


@dataclass(frozen=True, slots=True)
class Step:
    """Micro-step j: ``pre`` --instr (at loop index k)--> ``post``."""

    j: int
    instr: Instr
    k: int
    pre: VMState
    post: VMState
    access: MemAccess | None


def as_bits(x: np.ndarray) -> np.ndarray:
    """Flat uint32 bit patterns of a float32 (or already uint32) array."""
    a = np.asarray(x)
    if a.dtype == np.float32:
        return np.ascontiguousarray(a).reshape(-1).view(np.uint32)
    if a.dtype == np.uint32:
        return np.ascontiguousarray(a).reshape(-1)
    raise RepOpsError(f"RepOps inputs must be float32 (or uint32 bit patterns), got {a.dtype}")


def check_inputs(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(inputs) != len(desc.inputs):
        raise DescriptorError(
            f"{desc.label or 'kernel'}: {len(inputs)} inputs given, {len(desc.inputs)} expected"
        )
    flat = [as_bits(x) for x in inputs]
    for t, (a, m) in enumerate(zip(flat, desc.inputs)):
        if a.size != m.numel:
            raise DescriptorError(
                f"{desc.label or 'kernel'}: input {t} has {a.size} elements, map says {m.numel}",
                input=t,
            )
    return flat


def index_of(bits: int) -> int | None:
    """The integer a LOADIDX index register denotes, or None unless it is an integral value in
    the int32 range (the rule the on-chain prover decides; see docs/repops-spec.md)."""
    x = isa.bits_f32(bits)
    if math.isnan(x) or math.isinf(x) or x != math.floor(x) or not -(2**31) <= x < 2**31:
        return None
    return int(x)


def coord_bits(v: int) -> int:
    return isa.f32_bits(float(v))


def _scalar(op: Op, a: int, b: int, c: int) -> int:
    from verde_chain.repops import fp32  # imported on first use: importing program stays cheap

    return int(fp32.scalar(op, a, b, c))


def step_once(
    desc: KernelDesc,
    inputs: Sequence[np.ndarray],
    coords: Sequence[int],
    regs: list[int],
    instr: Instr,
    k: int,
) -> MemAccess | None:
    """Execute one instruction in place on ``regs``; return the memory access it made."""
    access: MemAccess | None = None
    if instr.op == Op.CONST:
        val = instr.imm
    elif instr.op == Op.COORD:
        val = coord_bits(coords[instr.imm])
    elif instr.op == Op.LOAD:
        addr = desc.address(instr.imm, coords, k)
        val = int(inputs[instr.imm][addr])
        access = MemAccess(instr.imm, addr, val)
    elif instr.op == Op.LOADIDX:
        m = desc.inputs[instr.imm]
        idx = index_of(regs[instr.a])
        where = None if idx is None else desc.address(instr.imm, coords, k) + idx * m.idx_stride
        if where is None or not 0 <= where < m.numel:
            where, val = None, CANONICAL_NAN
        else:
            val = int(inputs[instr.imm][where])
        access = MemAccess(instr.imm, where, val)
    else:
        val = _scalar(instr.op, regs[instr.a], regs[instr.b], regs[instr.c])
    regs[instr.dst] = val
    return access


def trace(desc: KernelDesc, inputs: Sequence[np.ndarray], e: int) -> list[Step]:
    """The full micro-step trace of output element e: N steps, state j -> state j+1."""
    flat = check_inputs(desc, inputs)
    c = desc.coords(e)
    regs = [0] * NUM_REGS
    steps: list[Step] = []
    for j in range(desc.num_steps):
        instr, k = instruction_at(desc, j)
        pre = VMState(j, tuple(regs))
        acc = step_once(desc, flat, c, regs, instr, k)
        steps.append(Step(j, instr, k, pre, VMState(j + 1, tuple(regs)), acc))
    return steps


def _run_element(desc: KernelDesc, flat: list[np.ndarray], e: int) -> int:
    c = desc.coords(e)
    regs = [0] * NUM_REGS
    for instr in desc.prologue:
        step_once(desc, flat, c, regs, instr, 0)
    for k in range(1, desc.K):
        for instr in desc.body:
            step_once(desc, flat, c, regs, instr, k)
    for instr in desc.epilogue:
        step_once(desc, flat, c, regs, instr, desc.K - 1)
    return regs[0]


def run_spec(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Slow scalar interpreter of the canonical semantics (small tensors only): float32 out."""
    from verde_chain.repops import fp32

    fp32.require_ieee_env()  # index_of's float conversion runs under this thread's MXCSR too
    flat = check_inputs(desc, inputs)
    out = np.array([_run_element(desc, flat, e) for e in range(desc.numel)], dtype=np.uint32)
    return out.view(np.float32).reshape(desc.out_shape)

"""Kernel descriptors: the canonical definition of one RepOps primitive node.

Why one module over ~500 lines: the descriptor, its byte encoding (hashed into graph roots and read
by ``contracts/vm/DescView.sol``) and the scalar interpreter that defines its meaning must change
together; this file is the spec the ScalarVM is checked against.

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

    LOAD    t: addr = offset + sum_d c[d]*strides[d] + k*kstride
                      + sum_w (v_w / div_w) * stride_w                  (checked in range statically)
    LOADIDX t: addr = (the same) + int(value of register a) * idx_stride
               register a must hold an integral, finite float with 0 <= addr < numel,
               otherwise the result is CANONICAL_NAN and nothing is read (decidable on-chain)

Windows (``Window``, the convolution / pooling / padding extension): ``k`` is split into digits
``kd`` over ``kdims`` (row-major; no kdims = one digit, k itself) and each window of an input is
one bounded input axis ``v_w = out_mul*c[axis] + k_mul*kd[digit] + offset``. The window is *in
range* iff ``v_w >= 0``, ``v_w % div == 0`` and ``v_w / div < size``. A LOAD or LOADIDX with any
window of its input out of range reads nothing and yields the input's ``fill`` bits (+0.0 for
a zero-padded convolution, -inf for max pooling); LOADIDX checks windows before its index.

Canonical encoding (``KernelDesc.encode``) is Solidity's ``abi.encode`` of the six values::

    (uint32[] outShape, uint32 K,
     (uint64 numel, int64[] strides, int64 kstride, uint64 offset, int64 idxStride)[] inputs,
     bytes prologue, bytes body, bytes epilogue)            programs: isa.encode_program words

so a contract reads it with ``abi.decode(data, (uint32[], uint32, InputMap[], bytes, bytes,
bytes))``; ``KernelDesc.hash()`` is keccak256 of that encoding. A descriptor that uses the window
extension (kdims or windows) has a packed form instead (``PACKED_TAG``, big-endian, no padding:
its calldata is what a one-step proof pays for, and abi words of small integers are mostly
zeros)::

    u8 0xE0 | u8 rank, u32 outShape[rank] | u32 K | u8 n, u32 kdims[n] | u8 inputs, per input:
      u64 numel, i64 strides[rank], i64 kstride, u64 offset, i64 idxStride, u32 fill, u8 windows,
      per window: u8 axis, i64 outMul, u8 digit, i64 kMul, i64 offset, u32 div, u64 size, i64 stride
    | u32 P, prologue words | u32 B, body words | u32 E, epilogue words

Its first byte (0xE0) tells it from the abi form (whose first word is 0xC0, so its first byte
0), and a descriptor without the extension encodes (and hashes) exactly as before the extension
existed.

This module also holds the slow scalar interpreter (``run_spec``, ``trace``): element by
element, instruction by instruction, exactly the semantics the on-chain VM executes.
"""

from __future__ import annotations

import math
import struct
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
# The abi form's first word (the offset of outShape: six head words); the packed form's first byte.
HEAD_PLAIN = 32 * len(ABI_TYPES)
PACKED_TAG = 0xE0
MAX_WINDOWS = 8
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class DescriptorError(RepOpsError):
    """A KernelDesc is malformed (shape, strides, register or input slot out of range)."""

    def __init__(self, message: str, **fields: object) -> None:
        self.fields = fields
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Window:
    """One bounded input axis of a windowed load (convolution, pooling, padding).

    ``v = out_mul*c[axis] + k_mul*kd[digit] + offset`` (a zero multiplier drops its term, and
    then its index must be 0); in range iff ``v >= 0``, ``v % div == 0`` and ``v // div < size``;
    an in-range window adds ``(v // div) * stride`` to the address. ``div > 1`` is the stride of
    a convolution seen from its input (the gradient w.r.t. the input of a strided conv)."""

    axis: int = 0
    out_mul: int = 0
    digit: int = 0
    k_mul: int = 0
    offset: int = 0
    div: int = 1
    size: int = 1
    stride: int = 0

    def position(self, c: Sequence[int], kd: Sequence[int]) -> int | None:
        """``v // div`` if the window is in range at (c, kd), else None."""
        v = self.offset
        if self.out_mul:
            v += self.out_mul * c[self.axis]
        if self.k_mul:
            v += self.k_mul * kd[self.digit]
        if v < 0 or v % self.div:
            return None
        q = v // self.div
        return q if q < self.size else None

    def q_range(self, out_shape: Sequence[int], kdims: Sequence[int]) -> tuple[int, int]:
        """Smallest and largest in-range ``v // div`` (lo > hi: never in range)."""
        lo = hi = self.offset
        for mul, n in ((self.out_mul, out_shape[self.axis] if self.out_mul else 1),
                       (self.k_mul, kdims[self.digit] if self.k_mul else 1)):
            span = mul * (n - 1)
            lo, hi = lo + min(0, span), hi + max(0, span)
        return max(0, -(-lo // self.div)), min(self.size - 1, hi // self.div)


@dataclass(frozen=True, slots=True)
class InputMap:
    """Affine address map of one input tensor (flat, C order, ``numel`` elements)."""

    numel: int
    strides: tuple[int, ...]  # one per OUTPUT dim; 0 = broadcast along that dim
    kstride: int = 0
    offset: int = 0
    idx_stride: int = 0
    # The window extension: bounded axes, and the bits a load reads when one is out of range.
    windows: tuple[Window, ...] = ()
    fill: int = 0

    def base_range(self, out_shape: tuple[int, ...], K: int) -> tuple[int, int]:
        """Smallest and largest LOAD address over all coordinates and k in [0, K-1], windows
        out of the count (see ``load_range``)."""
        lo = hi = self.offset
        for s, n in zip(self.strides, out_shape):
            span = s * (n - 1)
            lo += min(0, span)
            hi += max(0, span)
        span = self.kstride * (K - 1)
        return lo + min(0, span), hi + max(0, span)

    def load_range(self, out_shape: tuple[int, ...], K: int, kdims: Sequence[int]) -> tuple[int, int] | None:
        """A box holding every address a LOAD reads (windows in range); None: it never reads."""
        lo, hi = self.base_range(out_shape, K)
        for w in self.windows:
            qlo, qhi = w.q_range(out_shape, kdims)
            if qlo > qhi:
                return None
            a, b = qlo * w.stride, qhi * w.stride
            lo, hi = lo + min(a, b), hi + max(a, b)
        return lo, hi


@dataclass(frozen=True)
class KernelDesc:
    """One primitive RepOps node (see the module docstring for the execution model)."""

    out_shape: tuple[int, ...]
    K: int
    inputs: tuple[InputMap, ...]
    prologue: tuple[Instr, ...]
    body: tuple[Instr, ...] = ()
    epilogue: tuple[Instr, ...] = ()
    # The digits of k (row-major, product K) that windows read; () = one digit, k itself.
    kdims: tuple[int, ...] = ()
    # Human-readable name for logs and errors; NOT part of the encoding or the hash.
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_shape", tuple(int(d) for d in self.out_shape))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for name in ("prologue", "body", "epilogue"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        # One digit is k itself: keep the one encoding of that descriptor.
        kdims = tuple(int(d) for d in self.kdims)
        object.__setattr__(self, "kdims", kdims if len(kdims) > 1 else ())
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
            self._validate_windows(t, m)
            box = m.load_range(self.out_shape, self.K, self.digit_dims)
            lo, hi = box if box is not None else (0, 0)
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
        if self.kdims and (len(self.kdims) > MAX_RANK or math.prod(self.kdims) != self.K
                           or min(self.kdims) < 1):
            raise DescriptorError(f"{who}: kdims {self.kdims} must be 2..{MAX_RANK} digits >= 1 "
                                  f"with product K={self.K}", kdims=self.kdims)

    def _validate_windows(self, t: int, m: InputMap) -> None:
        who = self.label or "KernelDesc"
        if len(m.windows) > MAX_WINDOWS:
            raise DescriptorError(f"{who}: input {t} has {len(m.windows)} windows > {MAX_WINDOWS}", input=t)
        if not 0 <= m.fill < 2**32 or (m.fill and not m.windows):
            raise DescriptorError(f"{who}: input {t} fill {m.fill:#x} needs windows and 32 bits", input=t)
        digits = len(self.digit_dims)
        for w in m.windows:
            ok = (
                (0 <= w.axis < len(self.out_shape) if w.out_mul else w.axis == 0)
                and (0 <= w.digit < digits if w.k_mul else w.digit == 0)
                and 1 <= w.div < 2**32
                and 1 <= w.size < 2**63
                and all(INT64_MIN <= v <= INT64_MAX for v in (w.out_mul, w.k_mul, w.offset, w.stride))
            )
            if not ok:
                raise DescriptorError(f"{who}: input {t} has a malformed window {w}", input=t)
        box = m.load_range(self.out_shape, self.K, self.digit_dims)
        if m.windows and box is not None and not (INT64_MIN // 2 <= box[0] <= box[1] <= INT64_MAX // 2):
            raise DescriptorError(f"{who}: input {t} window addresses exceed int64", input=t)

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

    @property
    def digit_dims(self) -> tuple[int, ...]:
        """The digits of k: ``kdims``, or ``(K,)`` without them."""
        return self.kdims or (self.K,)

    @property
    def extended(self) -> bool:
        """Whether the descriptor uses the window extension (and so encodes seven values)."""
        return bool(self.kdims) or any(m.windows for m in self.inputs)

    def kdigits(self, k: int) -> tuple[int, ...]:
        """The digits of loop index k over ``digit_dims`` (row-major)."""
        out = []
        for d in reversed(self.digit_dims):
            out.append(k % d)
            k //= d
        return tuple(reversed(out))

    def address(self, t: int, c: Sequence[int], k: int) -> int | None:
        """The flat address LOAD t reads at (c, k); None if a window is out of range (the load
        then reads the input's fill bits)."""
        m = self.inputs[t]
        addr = m.offset + sum(ci * si for ci, si in zip(c, m.strides)) + k * m.kstride
        if m.windows:
            kd = self.kdigits(k)
            for w in m.windows:
                q = w.position(c, kd)
                if q is None:
                    return None
                addr += q * w.stride
        return addr

    def read(self, t: int, c: Sequence[int], k: int, index_bits: int | None = None) -> tuple[int | None, int]:
        """What LOAD t (``index_bits`` None) or LOADIDX t reads at (c, k): ``(address, 0)``, or
        ``(None, bits)`` when nothing is read — the input's fill for a window out of range,
        the canonical NaN for a LOADIDX index that is not valid (docs/repops-spec.md §1)."""
        m = self.inputs[t]
        addr = self.address(t, c, k)
        if addr is None:
            return None, m.fill
        if index_bits is None:
            return addr, 0
        idx = index_of(index_bits)
        if idx is None:
            return None, CANONICAL_NAN
        addr += idx * m.idx_stride
        return (addr, 0) if 0 <= addr < m.numel else (None, CANONICAL_NAN)

    # ----------------------------------------------------------------- encoding
    def encode(self) -> bytes:
        if self.extended:
            return _pack(self)
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
        if data[:1] == bytes([PACKED_TAG]):
            return _unpack(data)
        if int.from_bytes(data[:32], "big") != HEAD_PLAIN:
            raise DescriptorError("a descriptor is the abi form (first word 0xc0) or the packed one (first byte 0xe0)")
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


_WINDOW = struct.Struct(">BqBqqIQq")  # axis, outMul, digit, kMul, offset, div, size, stride


def _pack(d: KernelDesc) -> bytes:
    """The packed form of a descriptor with the window extension (module docstring)."""
    rank = len(d.out_shape)
    out = [struct.pack(f">BB{rank}II", PACKED_TAG, rank, *d.out_shape, d.K),
           struct.pack(f">B{len(d.kdims)}I", len(d.kdims), *d.kdims), struct.pack(">B", len(d.inputs))]
    for m in d.inputs:
        out.append(struct.pack(f">Q{rank}qqQqIB", m.numel, *m.strides, m.kstride, m.offset, m.idx_stride, m.fill,
                               len(m.windows)))
        out += [_WINDOW.pack(w.axis, w.out_mul, w.digit, w.k_mul, w.offset, w.div, w.size, w.stride) for w in m.windows]
    for prog in (d.prologue, d.body, d.epilogue):
        out.append(struct.pack(">I", len(prog)) + isa.encode_program(prog))
    return b"".join(out)


def _unpack(data: bytes) -> KernelDesc:
    """Inverse of :func:`_pack`; a truncated or overlong encoding is refused."""
    at = 0

    def take(fmt: str) -> tuple[int, ...]:
        nonlocal at
        st = struct.Struct(">" + fmt)
        if at + st.size > len(data):
            raise DescriptorError("packed descriptor is truncated")
        vals = st.unpack_from(data, at)
        at += st.size
        return vals

    _, rank = take("BB")
    shape = take(f"{rank}I")
    (K,) = take("I")
    (nd,) = take("B")
    kdims = take(f"{nd}I")
    (nin,) = take("B")
    inputs = []
    for _ in range(nin):
        numel, *strides_etc = take(f"Q{rank}qqQqIB")
        strides, (kstride, offset, idx_stride, fill, nw) = tuple(strides_etc[:rank]), strides_etc[rank:]
        windows = tuple(Window(*take("BqBqqIQq")) for _ in range(nw))
        inputs.append(InputMap(numel, strides, kstride, offset, idx_stride, windows, fill))
    progs = []
    for _ in range(3):
        (n,) = take("I")
        if at + isa.INSTR_BYTES * n > len(data):
            raise DescriptorError("packed descriptor is truncated")
        progs.append(isa.decode_program(data[at : at + isa.INSTR_BYTES * n]))
        at += isa.INSTR_BYTES * n
    if at != len(data):
        raise DescriptorError(f"packed descriptor has {len(data) - at} trailing bytes")
    return KernelDesc(tuple(shape), K, tuple(inputs), tuple(progs[0]), tuple(progs[1]), tuple(progs[2]), kdims=kdims)


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
    """What a LOAD/LOADIDX read: the input slot, flat address (None: nothing read — the fill of a
    window out of range, or NaN for a bad LOADIDX index), bits."""

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
    elif instr.op in (Op.LOAD, Op.LOADIDX):
        index = regs[instr.a] if instr.op == Op.LOADIDX else None
        where, val = desc.read(instr.imm, coords, k, index)
        if where is not None:
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

"""Compiled maps: long straight-line programs as generated C++ over ``kernels/repops_map.h``.

Long maps (transcendentals, optimizer updates, the elementwise parts of norms and losses) are
compiled: the program becomes the body of one loop over output elements, W of them per
iteration (W lanes of a GCC vector per register), every instruction the template of
``kernels/repops_fp32.h`` (the one definition every C++/CUDA path uses) instantiated for W lanes.
The compiler vectorises across ELEMENTS only, never across k, and runs with -ffp-contract=off
and without fast-math, so each instruction stays one IEEE operation rounded once. NaN results
are canonicalised once, at the end (``kernels/repops_map.h`` says why that gives the spec's
bits). Eligible: every input read through a periodic map (``plan.periodic_map``: contiguous, a
scalar, a per-row statistic broadcast along its row, a row of scale or bias broadcast over the
rows), at least JIT_MIN_INSTRS instructions, JIT_MIN_NUMEL elements or JIT_MIN_WORK
lane-instructions (small short programs are not worth a compile). LOADIDX compiles too (concat,
gathers, slice gradients: ``jit_source`` says how), where the input it reads is read by no LOAD.
K > 1 programs (chains: a batch-norm statistic after its gather, a reduction the fold and row
kernels do not take) compile as a loop over k inside the loop over elements
(``_chain_source``): each lane runs one element's whole chain in the interpreter's order, and
each input's address moves by its k stride. One shared object per (program, linear maps, ISA),
cached on disk (well under a second per compile) under a key that covers the headers too.

Epilogues of the fast kernels (GEMM, fold, row dot) are compiled the same way
(``epilogue_map``): the epilogue as a map whose input 0 is the node's own output, run in place
after the kernel, under the same eligibility rules (a program ``LOAD r0 <- x0`` then the
epilogue, so one instruction longer than the epilogue itself).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch

from verde_chain.repops.backends.cpu import extension as ext
from verde_chain.repops.backends.plan import periodic_map
from verde_chain.repops.backends.registry import BackendUnavailable
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.shapes import c_strides
from verde_chain.repops.program import InputMap, KernelDesc

JIT_MIN_INSTRS = 8
JIT_MIN_NUMEL = 1 << 16  # ... or at least this many output elements
# ... or at least this many lane-instructions: the interpreter's per-block cost (lane address
# tables for broadcast inputs) made the norms' short maps over ~4 k elements 5-10x slower there
JIT_MIN_WORK = 1 << 13


def min_instrs_for(desc: KernelDesc, min_instrs: int) -> int:
    """The program length from which ``desc`` is compiled (``min_instrs`` unless big maps)."""
    return 1 if desc.numel >= JIT_MIN_NUMEL or map_work(desc) >= JIT_MIN_WORK else min_instrs
JIT_DIR = ext.BUILD_ROOT / "repops_jit"
JIT_LANES = {"scalar": 4, "avx2": 8, "avx512": 16}
HEADERS = (ext.KERNELS / "repops_map.h", ext.KERNELS / "repops_fp32.h", ext.KERNELS / "generated" / "repops_isa.h")

# Each opcode in a compiled map: its repops_fp32.h template on W lanes (the instruction's value
# where it has one: the map canonicalises once, at the end), or None: not compiled, the
# interpreter runs such a program. Every Op has a row (a new one fails this module's import).
_JIT_OPS: dict[Op, str | None] = {
    Op.ADD: "rp_add_value({a}, {b})", Op.SUB: "rp_sub_value({a}, {b})", Op.MUL: "rp_mul_value({a}, {b})",
    Op.DIV: "rp_div_value({a}, {b})", Op.FMA: "rp_fma_value({a}, {b}, {c})", Op.SQRT: "rp_sqrt_value({a})",
    Op.MAX: "rp_max({a}, {b})", Op.MIN: "rp_min({a}, {b})", Op.LT: "rp_lt({a}, {b})", Op.EQ: "rp_eq({a}, {b})",
    Op.SELECT: "rp_select_value({a}, {b}, {c})", Op.RINT: "rp_rint_value({a})", Op.FLOOR: "rp_floor_value({a})",
    Op.LDEXP: "rp_ldexp({a}, {b})", Op.GETEXP: "rp_getexp({a})", Op.GETMANT: "rp_getmant({a})",
    Op.NEG: "rp_neg_value({a})", Op.ABS: "rp_abs_value({a})", Op.MOV: "rp_mov_value({a})",
    Op.CONST: "rp_splat<vu>({imm}u)", Op.LOAD: "x{imm}",
    Op.COORD: "c{imm}", Op.LOADIDX: "rp_loadidx_lanes{small}(p{imm}, b{imm}, {a}, {idx_stride}, {numel}{limit})",
}  # fmt: skip
if set(_JIT_OPS) != set(Op):
    raise AssertionError(f"compiled maps: no row for {sorted(o.name for o in set(Op) - set(_JIT_OPS))}")


def jit_source(desc: KernelDesc, lanes: int = 16, min_instrs: int = JIT_MIN_INSTRS) -> str | None:
    """C++ source of ``desc`` as one vector loop (``lanes`` elements per iteration), or None if
    it is not an eligible map.

    Every LOAD of input t reads the same address for a given element (K = 1), so each input is
    loaded once per iteration into x_t: a full vector, or zero-padded lanes in the tail. Every
    input of a block is loaded before the block is stored, which epilogue maps rely on: they
    run in place, reading element e of the output they overwrite (``epilogue_map``).

    An input read by LOADIDX (and by no LOAD) is passed as its pointer p_t and the W lanes'
    descriptor addresses b_t (int64, from its periodic map); each LOADIDX is
    ``rp_loadidx_lanes`` (repops_map.h), the interpreter's rule lane by lane. Such an input's
    bounds check is its numel (``map_lin``): the rule keeps every read below it. Its reads are
    done inside the body, so an epilogue map, which reads its output through LOAD only (input
    0), still loads that before it stores."""
    chain = desc.K > 1
    code = desc.prologue + desc.body + desc.epilogue  # K = 1: no body; the rest runs at k = 0
    if (desc.body and not chain) or len(code) < min_instrs:
        return None
    # windowed inputs (chains only): moving with k alone (k_linear), or masked per lane (masked_window)
    masked = {t for t, m in enumerate(desc.inputs) if m.windows and not k_linear(desc, m)}
    if any(m.windows for m in desc.inputs) and not (chain and all(masked_window(desc, desc.inputs[t]) for t in masked)):
        return None
    periods = [periodic_map(m, desc.out_shape) for m in desc.inputs]
    if any(per is None or per[0] < 0 for per in periods):
        return None
    indexed = indexed_inputs(desc)
    if indexed & {ins.imm for ins in code if ins.op == Op.LOAD}:
        return None  # read both ways: its bounds check would need both rows (map_lin)
    if chain and (indexed or desc.numel < 2):
        return None  # a chain's bounds row is its inputs' box (map_lin): LOAD only, two elements
    # rp_loadidx_lanes_small's bounds (repops_map.h): 32-bit lanes
    small = {t for t in indexed
             if 1 <= desc.inputs[t].numel < 1 << 29 and max(map(abs, desc.inputs[t].base_range(desc.out_shape, 1))) < 1 << 29}

    def spell(ins: Instr) -> str:
        spelling = cast(str, _JIT_OPS[ins.op])
        m = desc.inputs[ins.imm] if ins.op == Op.LOADIDX else None
        fields = {"small": "", "idx_stride": "", "numel": "", "limit": ""}
        if m is not None:
            fields |= {"idx_stride": f"{m.idx_stride}LL", "numel": f"{m.numel}LL"}
        if m is not None and ins.imm in small:
            fields |= {"small": "_small", "limit": f", {_index_limit(m.idx_stride)}f"}
        return f"r{ins.dst} = " + spelling.format(a=f"r{ins.a}", b=f"r{ins.b}", c=f"r{ins.imm & 15}", imm=ins.imm,
                                                  **fields) + ";"

    if any(_JIT_OPS[ins.op] is None for ins in code):
        return None
    # The result is canonicalised unless r0's last writer copies raw bits (LOAD, LOADIDX, CONST
    # keep payloads in the spec; every register instruction canonicalises). A chain runs its
    # body last before the epilogue, at k = K - 1.
    order = desc.prologue + desc.body + desc.epilogue if chain else code
    last = next((i for i in reversed(order) if i.dst == 0), None)
    ret = "r0" if last is None or last.op in (Op.LOAD, Op.LOADIDX, Op.CONST) else "rp_canon(r0)"
    n_in = len(desc.inputs)
    # COORD d: the output coordinate along axis d, (e / inner_d) % shape_d, one more vector per
    # iteration like an input (per_block)
    axes = sorted({ins.imm for ins in code if ins.op == Op.COORD})
    if any(d >= len(desc.out_shape) for d in axes):
        return None
    regs = ", ".join(f"r{i} = rp_splat<vu>(0u)" for i in range(16))

    def periodic(off: str, s: int, q: int, p: int, lane: str) -> str:
        """Where the periodic map (s, q, p) from ``off`` reads for element e + ``lane``."""
        row = f"(e + {lane}) / {q}" if q > 1 else f"(e + {lane})"
        return f"{off} + (({row}) % {p}) * {s}" if q * p < desc.numel else f"{off} + ({row}) * {s}"

    def load(t: int, tail: bool) -> str:
        m, (s, q, p) = desc.inputs[t], cast(tuple[int, int, int], periods[t])
        src = f"((const uint32_t*)in[{t}])"
        if t in indexed:
            return base(t, "vi" if t in small else "vl", tail)
        if t in masked:
            return window_load(t)
        # a chain's k (a variable of the generated loop) moves the address
        off = f"({m.offset}{k_address(desc, m)})" if chain else str(m.offset)
        if s == 0:
            return f"const vu x{t} = rp_splat<vu>({src}[{off}]);"
        wrap = q * p < desc.numel  # an outer block the map is constant along
        lim = "rem" if tail else "W"
        per_lane = f"x{t} = rp_splat<vu>(0u); for (int i = 0; i < {lim}; i++) x{t}[i] = {src}[{periodic(off, s, q, p, 'i')}];"
        if tail:
            return "vu " + per_lane
        if q > 1:  # W lanes in one row: one address for all
            return (f"vu x{t}; if (e / {q} == (e + W - 1) / {q}) x{t} = rp_splat<vu>({src}[{periodic(off, s, q, p, '0')}]); "
                    f"else {{ {per_lane} }}")
        if s == 1 and not wrap:
            return f"vu x{t}; __builtin_memcpy(&x{t}, {src} + {off} + e, sizeof x{t});"
        if s == 1:  # W lanes inside one period: contiguous
            return (f"vu x{t}; if (e % {p} + W <= {p}) __builtin_memcpy(&x{t}, {src} + {off} + e % {p}, "
                    f"sizeof x{t}); else {{ {per_lane} }}")
        if not wrap and 0 < s * lanes < 1 << 31:  # W lanes s apart: one gather (a channel per lane)
            return f"const vu x{t} = rp_gather_lanes({src} + {off} + e * {s}, rp_iota() * {s});"
        return "vu " + per_lane

    def base(t: int, ty: str, tail: bool) -> str:
        """b_t: the descriptor address (its periodic map, k = 0) of each of the W lanes, as ty
        (vi: 32-bit, vl: 64-bit); in a tail, lanes past the end get element 0's (inside the
        bounds rp_loadidx_lanes_small and masked_window were chosen by)."""
        m, (s, q, p) = desc.inputs[t], cast(tuple[int, int, int], periods[t])
        lane = "int32_t" if ty == "vi" else "int64_t"
        if s == 0:
            return f"const {ty} b{t} = {ty}{{}} + ({lane}){m.offset};"
        addr = periodic(str(m.offset), s, q, p, "i")
        if tail:
            return f"{ty} b{t}; for (int i = 0; i < W; i++) b{t}[i] = i < rem ? {addr} : {m.offset};"
        per_lane = f"for (int i = 0; i < W; i++) b{t}[i] = {addr};"
        if q > 1:  # W lanes in one row: one address for all
            return (f"{ty} b{t}; if (e / {q} == (e + W - 1) / {q}) b{t} = {ty}{{}} + ({lane})({periodic(str(m.offset), s, q, p, '0')}); "
                    f"else {{ {per_lane} }}")
        return f"{ty} b{t}; {per_lane}"

    def window_load(t: int) -> str:
        """x_t of an input whose windows follow output coordinates or can leave their range
        (``masked_window``): lane by lane, the base address b_t plus each window's
        ``(v / div) * stride`` at ``v = out_mul * coordinate + k_mul * digit + offset``, in 32-bit
        lanes; a lane with any window out of range (v < 0, v % div != 0 or v / div >= size) is the
        fill and reads nothing (its gather index is 0)."""
        m, dims = desc.inputs[t], desc.digit_dims
        parts = [f"vi a = b{t}" + (f" + (int32_t)(k * {m.kstride})" if m.kstride else "") + ";", "vi ok = vi{} == vi{};"]
        for w in m.windows:
            kpart = f"(int32_t)({w.k_mul} * ((k / {math.prod(dims[w.digit + 1:])}) % {dims[w.digit]}) + {w.offset})"
            v = f"{w.out_mul} * ci{w.axis} + {kpart}" if w.out_mul else f"vi{{}} + {kpart}"
            check = f"(v >= 0) & (v < {w.size * w.div})" + (f" & (v % {w.div} == 0)" if w.div > 1 else "")
            step = f"(v / {w.div}) * {w.stride}" if w.div > 1 else f"v * {w.stride}"
            parts.append(f"{{ const vi v = {v}; ok = ok & {check}; a += {step}; }}")
        src = f"((const uint32_t*)in[{t}])"
        parts.append(f"x{t} = ok ? rp_gather_lanes({src}, ok ? a : vi{{}}) : vu{{}} + {m.fill}u;")
        return f"vu x{t}; {{ {' '.join(parts)} }}"

    # output coordinates as 32-bit integers, per block: COORD's axes and the masked windows' axes
    int_axes = sorted(set(axes) | {w.axis for t in masked for w in desc.inputs[t].windows if w.out_mul})

    def coord(d: int, tail: bool) -> str:
        inner, n = math.prod(desc.out_shape[d + 1:]), desc.out_shape[d]
        lim = "rem" if tail else "W"
        per_lane = f"ci{d} = vi{{}}; for (int i = 0; i < {lim}; i++) ci{d}[i] = (int32_t)(((e + i) / {inner}) % {n});"
        if tail:
            return "vi " + per_lane
        if inner > 1:  # W lanes at one coordinate: one value
            return f"vi ci{d}; if (e / {inner} == (e + W - 1) / {inner}) ci{d} = vi{{}} + (int32_t)((e / {inner}) % {n}); else {{ {per_lane} }}"
        # W consecutive coordinates inside one run: first + i, no division per lane
        return (f"vi ci{d}; {{ const int64_t first = e % {n}; if (first + W <= {n}) ci{d} = rp_iota() + (int32_t)first; "
                f"else {{ {per_lane} }} }}")

    def per_block(tail: bool) -> str:
        """What a block of W elements computes once: coordinates (COORD's as exact binary32:
        every dim is below program.MAX_DIM = 2^24) and the masked inputs' lane bases."""
        return " ".join([coord(d, tail) for d in int_axes] + [f"const vu c{d} = rp_int_bits(ci{d});" for d in axes]
                        + [base(t, "vi", tail) for t in sorted(masked)])

    if chain:
        return _chain_source(desc, lanes, ret, regs, spell, load, per_block)
    params = ", ".join([f"const uint32_t* p{t}, {'vi' if t in small else 'vl'} b{t}" if t in indexed else f"vu x{t}"
                        for t in range(n_in)]
                       + [f"vu c{d}" for d in axes])
    args = ", ".join([f"((const uint32_t*)in[{t}]), b{t}" if t in indexed else f"x{t}" for t in range(n_in)]
                     + [f"c{d}" for d in axes])
    body = "\n    ".join(spell(ins) for ins in desc.prologue + desc.epilogue)
    main_loads = "\n        ".join([load(t, False) for t in range(n_in)] + [per_block(False)])
    tail_loads = "\n        ".join([load(t, True) for t in range(n_in)] + [per_block(True)])
    return (
        f'#define W {lanes}\n#include "repops_map.h"\n'
        + f"RP_MAP_BODY({params}) {{\n    vu {regs};\n    {body}\n    return {ret};\n}}\n"
        + 'extern "C" __attribute__((visibility("default")))\n'
        + "void repops_map(const void* const* in, uint32_t* out, int64_t e0, int64_t e1) {\n"
        + "    RP_MAP_FPENV_ENTER;\n    int64_t e = e0;\n"
        + f"    for (; e + W <= e1; e += W) {{\n        {main_loads}\n"
        + f"        const vu r = body({args});\n        __builtin_memcpy(out + e, &r, sizeof r);\n    }}\n"
        + f"    if (e < e1) {{\n        const int rem = (int)(e1 - e);\n        {tail_loads}\n"
        + f"        const vu r = body({args});\n        for (int i = 0; i < rem; i++) out[e + i] = r[i];\n    }}\n"
        + "    RP_MAP_FPENV_EXIT;\n}\n"
    )


def _chain_source(desc: KernelDesc, lanes: int, ret: str, regs: str, spell: Callable[[Instr], str],
                  load: Callable[[int, bool], str], per_block: Callable[[bool], str]) -> str:
    """A K > 1 program as one loop over blocks of W output elements, the chain inside it:
    registers start at +0, the prologue runs with its inputs loaded at k = 0, the body for k = 1
    .. K - 1 (each iteration loading what the body reads at that k), the epilogue at k = K - 1:
    the interpreter's order for every lane, one element's whole chain in one lane. The
    canonical NaN once at the end, as in a K = 1 map (repops_map.h says why that holds across
    iterations too: no instruction's value depends on a NaN operand's payload)."""

    def phase(code: tuple[Instr, ...], tail: bool) -> str:
        read = sorted({i.imm for i in code if i.op == Op.LOAD})
        return " ".join([load(t, tail) for t in read] + [spell(i) for i in code])

    def block(tail: bool) -> str:
        return (per_block(tail) + f" vu {regs};"
                + f" {{ const int64_t k = 0; {phase(desc.prologue, tail)} }}"
                + f" for (int64_t k = 1; k < {desc.K}; k++) {{ {phase(desc.body, tail)} }}"
                + f" {{ const int64_t k = {desc.K - 1}; {phase(desc.epilogue, tail)} }}"
                + f" const vu r = {ret};")

    return (
        f'#define W {lanes}\n#include "repops_map.h"\n'
        + 'extern "C" __attribute__((visibility("default")))\n'
        + "void repops_map(const void* const* in, uint32_t* out, int64_t e0, int64_t e1) {\n"
        + "    RP_MAP_FPENV_ENTER;\n    int64_t e = e0;\n"
        + f"    for (; e + W <= e1; e += W) {{\n        {block(False)}\n"
        + "        __builtin_memcpy(out + e, &r, sizeof r);\n    }\n"
        + f"    if (e < e1) {{\n        const int rem = (int)(e1 - e);\n        {block(True)}\n"
        + "        for (int i = 0; i < rem; i++) out[e + i] = r[i];\n    }\n"
        + "    RP_MAP_FPENV_EXIT;\n}\n"
    )


def k_linear(desc: KernelDesc, m: InputMap) -> bool:
    """Whether every window of ``m`` only adds a multiple of one digit of k to the address and
    never leaves its range: no output coordinate, no divisor, in range at every digit value (a
    batch-norm statistic's input: the batch and spatial digits of k, no padding). Such a map
    never reads its fill, and its address is the periodic map's plus a function of k alone
    (``k_address``): a chain compiles with it."""
    for w in m.windows:
        if w.out_mul or w.div != 1:
            return False
        last = w.offset + w.k_mul * (desc.digit_dims[w.digit] - 1)
        if min(w.offset, last) < 0 or max(w.offset, last) >= w.size:
            return False
    return True


def masked_window(desc: KernelDesc, m: InputMap) -> bool:
    """Whether a chain reads ``m`` (windowed, not ``k_linear``: pooling, padding) lane by lane in
    32-bit arithmetic (``jit_source``'s window_load): at most four windows, numel below 2^30,
    and every base address, window value and window offset below 2^28 in magnitude, so no sum
    of them leaves int32 whatever the lane and k."""
    if len(m.windows) > 4 or m.numel >= 1 << 30:
        return False
    if max(map(abs, m.base_range(desc.out_shape, desc.K))) >= 1 << 28:
        return False
    dims = desc.digit_dims
    for w in m.windows:
        v = abs(w.out_mul) * (desc.out_shape[w.axis] - 1) + abs(w.k_mul) * (dims[w.digit] - 1) + abs(w.offset)
        if v >= 1 << 28 or v * abs(w.stride) >= 1 << 28 or w.size * w.div >= 1 << 31:
            return False
    return True


def k_address(desc: KernelDesc, m: InputMap) -> str:
    """The part of ``m``'s address that k moves, as a C++ expression over ``k`` (empty: none):
    ``k * kstride``, plus per window (``k_linear``) ``(k_mul * digit + offset) * stride``, a
    digit being ``(k / inner) % size`` over ``desc.digit_dims`` (row-major)."""
    dims = desc.digit_dims
    terms = [f" + k * {m.kstride}"] if m.kstride else []
    for w in m.windows:
        inner = math.prod(dims[w.digit + 1:])
        digit = f"((k / {inner}) % {dims[w.digit]})" if w.k_mul else "0"
        terms.append(f" + ({w.k_mul} * {digit} + {w.offset}) * {w.stride}")
    return "".join(terms)


def epilogue_map(desc: KernelDesc) -> KernelDesc | None:
    """The epilogue of ``desc`` (a GEMM, fold or row dot node, whose epilogue reads no register
    but r0 before writing it: ``plan.classify``) as a K = 1 map over
    ``(desc's own output, *desc's inputs)``: ``LOAD r0 <- input 0`` (the kernel's result, which
    the interpreter would preset r0 to), then the epilogue with its input slots shifted by one
    and each input map it reads fixed at k = K-1 (where the spec runs the epilogue). Registers other than
    r0 start at +0.0 as in the interpreter, and the epilogue cannot read them unwritten. None:
    no epilogue, or a windowed descriptor (its epilogue runs after the plan's permuting copy)."""
    if not desc.epilogue or desc.extended:
        return None
    k = desc.K - 1
    own = InputMap(desc.numel, c_strides(desc.out_shape))
    # An input the epilogue never loads (a dot's A and B, often not periodic) gets a map that
    # reads one valid address, element 0: the map's eligibility then depends on what it reads.
    read = {i.imm for i in desc.epilogue if i.op in (Op.LOAD, Op.LOADIDX)}
    inputs = (own, *(replace(m, offset=m.offset + k * m.kstride, kstride=0) if t in read
                     else InputMap(m.numel, (0,) * len(desc.out_shape)) for t, m in enumerate(desc.inputs)))
    code = tuple(replace(i, imm=i.imm + 1) if i.op in (Op.LOAD, Op.LOADIDX) else i for i in desc.epilogue)
    return KernelDesc(desc.out_shape, 1, inputs, (Instr(Op.LOAD, 0, imm=0), *code), label=f"{desc.label} epilogue")


def _index_limit(idx_stride: int) -> str:
    """rp_loadidx_lanes_small's limit: the largest binary32 <= floor(2^30 / |idx_stride|) (0: none)."""
    if idx_stride == 0:
        return "0.0"
    f = float(np.float32((1 << 30) // abs(idx_stride)))
    while f > (1 << 30) // abs(idx_stride):
        f = float(np.nextafter(np.float32(f), np.float32(0)))
    return f"{f:.1f}"


def indexed_inputs(desc: KernelDesc) -> set[int]:
    """The input slots ``desc``'s program reads with LOADIDX."""
    return {i.imm for i in desc.prologue + desc.body + desc.epilogue if i.op == Op.LOADIDX}


def map_lin(desc: KernelDesc) -> torch.Tensor:
    """(n_inputs, 4) int64 rows ``offset, s, q, p``: where a compiled map of ``desc`` reads input
    t for output element e (``offset + ((e // q) % p) * s``, ``plan.periodic_map``), as the
    extension's bounds check takes them. An input read by LOADIDX: one address, its last
    element (numel - 1, 0, 1, 1): the check then proves the tensor holds the numel that the
    index rule bounds every read by (``jit_source``)."""
    indexed = indexed_inputs(desc)
    if desc.K > 1:  # a chain (jit_source): each input's box over every element and k, as one row
        boxes = [m.load_range(desc.out_shape, desc.K, desc.digit_dims) or (0, 0) for m in desc.inputs]
        return torch.tensor([(lo, hi - lo, 1, 2) for lo, hi in boxes], dtype=torch.int64).reshape(len(boxes), 4)
    rows = [(m.numel - 1, 0, 1, 1) if t in indexed else (m.offset, *cast(tuple[int, int, int], periodic_map(m, desc.out_shape)))
            for t, m in enumerate(desc.inputs)]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 4)


def map_work(desc: KernelDesc) -> int:
    """Lane-instructions of a compiled map of ``desc`` (how many threads it is worth)."""
    return desc.numel * (len(desc.prologue) + (desc.K - 1) * len(desc.body) + len(desc.epilogue))


def map_address(fn: Callable[..., None]) -> int:
    """The C address of a compiled map (the extension calls it on its threads; ``jit_compile``'s
    cache keeps the library loaded)."""
    addr = ctypes.cast(cast(Any, fn), ctypes.c_void_p).value
    if not addr:
        raise BackendUnavailable("a compiled map has no address")
    return addr


_JIT_SIGNATURE = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32), ctypes.c_int64, ctypes.c_int64)


@functools.cache
def jit_compile(source: str, isa: str) -> Callable[..., None]:
    """Compile (or load from the disk cache) one generated map; returns the C function."""
    # -fno-trapping-math lets the compiler evaluate both sides of a select (if-conversion, so
    # the loop vectorises); it only drops the promise about FP exception flags and traps, which
    # nothing here enables or reads. Values stay IEEE: no contraction, no fast-math.
    flags = [*ext.build_flags(isa), "-fno-math-errno", "-fno-trapping-math", "-std=c++17", "-shared", "-fPIC",
             f"-I{ext.KERNELS}"]  # fmt: skip
    key = hashlib.sha256((source + ext.source_key(HEADERS, flags)).encode()).hexdigest()[:16]
    JIT_DIR.mkdir(parents=True, exist_ok=True)
    lib_path = JIT_DIR / f"map_{isa}_{key}.so"
    if not lib_path.exists():
        src = JIT_DIR / f"map_{isa}_{key}.{os.getpid()}.cpp"
        tmp = JIT_DIR / f"map_{isa}_{key}.{os.getpid()}.so"
        src.write_text(source)
        cxx = os.environ.get("CXX", "c++")
        proc = subprocess.run([cxx, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True, check=False)
        src.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise BackendUnavailable(f"compiling a RepOps map failed: {proc.stderr[-2000:]}")
        os.replace(tmp, lib_path)  # atomic: concurrent processes never load a partial file
    fn = ctypes.CDLL(str(lib_path)).repops_map
    fn.argtypes = _JIT_SIGNATURE
    fn.restype = None
    return fn

"""Epilogues of the fast kernels as compiled maps (``jit.epilogue_map``): a GEMM's bias, a dot
epilogue that graph/peephole.py appended, a mean's /K, a row dot's epilogue run as a map over the
kernel's result, in place in the whole-step plan and per node, give exactly the interpreter's and
the reference's bits (special values in every input), at several thread counts with more than
one OS thread engaged, and the map path is really taken."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from tests.support.threads import as_bits, engaged
from verde_chain.graph.structure import SourceKind
from verde_chain.repops import library, reference
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.jit import epilogue_map
from verde_chain.repops.backends.cpu.step import StepKernel
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.program import InputMap, KernelDesc

# -0, NaNs with payloads (quiet, signalling, negative), +-inf, subnormals, the largest float
SPECIALS = np.array([0x80000000, 0x7FC00001, 0x7F800001, 0xFFA00000, 0x7F800000, 0xFF800000, 0x00000001,
                     0x807FFFFF, 0x00400000, 0x7F7FFFFF], dtype=np.uint32)  # fmt: skip
T, H, D = 64, 16, 8  # attention scores: (2, H, T, T) = 131 072 elements


def _masked_scores() -> KernelDesc:
    """Batched q @ k^T plus a (T, T) mask broadcast over batch and heads, as peephole writes it."""
    dot = library.matmul((2, H, T, D), (2, H, D, T))
    mask = InputMap(T * T, (0, 0, T, 1))
    return dataclasses.replace(dot, inputs=(*dot.inputs, mask),
                               epilogue=(*dot.epilogue, *library.addend_epilogue(len(dot.inputs))))


NODES = {
    "gemm, bias over rows": lambda: library.gemm((256, 8), (8, 512), (512,)),
    "gemm, full C, alpha, beta": lambda: library.gemm((256, 8), (8, 512), (256, 512), alpha=0.5, beta=3.0),
    "bmm + broadcast mask": _masked_scores,
    "fold, mean's /K": lambda: library.reduce("mean", (131072, 4), (1,), keepdims=False),
    "rowdot, mean": lambda: library.reduce_dot((131072, 4), (1,), keepdims=False, mean=True),
}
KINDS = {"gemm, bias over rows": "dot", "gemm, full C, alpha, beta": "dot", "bmm + broadcast mask": "dot",
         "fold, mean's /K": "fold", "rowdot, mean": "rowdot"}  # fmt: skip


def _inputs(desc: KernelDesc, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for m in desc.inputs:
        x = rng.standard_normal(m.numel).astype(np.float32).view(np.uint32)
        at = rng.choice(m.numel, size=min(m.numel, 4 * len(SPECIALS)), replace=False)
        x[at] = np.resize(SPECIALS, len(at))
        out.append(x.view(np.float32))
    return out


def _plan_run(backend: CpuBackend, desc: KernelDesc, ins: list[np.ndarray]) -> tuple[np.ndarray, StepKernel]:
    """``desc`` as the last node of a whole-step plan, its inputs state nodes (copies of the
    previous arena), so it reads them from this step's arena as any node does."""
    copies = [KernelDesc((m.numel,), 1, (InputMap(m.numel, (1,)),), (Instr(Op.LOAD, 0, imm=0),)) for m in desc.inputs]
    n = len(copies)
    wiring = [[(int(SourceKind.PREV_STEP_NODE_OUTPUT), i)] for i in range(n)]
    wiring.append([(int(SourceKind.NODE_OUTPUT), i) for i in range(n)])
    kernel = StepKernel(backend, [*copies, desc], wiring, list(range(n)), 1)
    prev = kernel.pack(dict(enumerate(ins)))
    arena = kernel.run(prev, np.zeros(1, dtype=np.float32))
    return kernel.views(arena)[n].copy(), kernel


@pytest.mark.parametrize("name", list(NODES))
def test_epilogue_maps_equal_the_interpreter_and_the_reference(name: str) -> None:
    desc = NODES[name]()
    ins = _inputs(desc, 7)
    want = as_bits(reference.run(desc, ins).reshape(-1))
    isa = cpu_ext.best_isa()
    off = CpuBackend(isa, threads=1, jit_epilogues=False)
    assert off.plan(desc).kind == KINDS[name]
    assert off.prepare(desc).epi is None
    interp, kernel = _plan_run(off, desc, ins)
    assert kernel.compiled_epilogues() == []
    assert np.array_equal(as_bits(interp), want)
    for threads in (1, 2, 3):
        on = CpuBackend(isa, threads=threads)
        assert on.prepare(desc).epi is not None, "the epilogue was not compiled"
        got, kernel = engaged(isa, threads, functools.partial(_plan_run, on, desc, ins))
        assert kernel.compiled_epilogues() == [len(desc.inputs)], "the plan ran the epilogue on the interpreter"
        assert np.array_equal(as_bits(got), want), f"plan, {threads} threads"
        node = engaged(isa, threads, lambda: on(desc, ins))  # noqa: B023 (called at once)
        assert np.array_equal(as_bits(node.reshape(-1)), want), f"per node, {threads} threads"


def test_every_isa_build_gives_the_same_bits() -> None:
    desc = NODES["bmm + broadcast mask"]()
    ins = _inputs(desc, 8)
    want = as_bits(reference.run(desc, ins).reshape(-1))
    for isa in cpu_ext.available_isas():
        got, kernel = _plan_run(CpuBackend(isa, threads=2), desc, ins)
        assert kernel.compiled_epilogues() == [len(desc.inputs)]
        assert np.array_equal(as_bits(got), want), isa


def test_the_epilogue_map_reads_the_output_then_the_shifted_inputs() -> None:
    desc = library.gemm((4, 3), (3, 5), (5,), beta=2.0)
    epi = epilogue_map(desc)
    assert epi is not None and epi.K == 1 and not epi.body and not epi.epilogue
    # A and B are not read: one valid address each; C at k = K-1
    assert epi.inputs == (InputMap(20, (5, 1)), InputMap(12, (0, 0)), InputMap(15, (0, 0)),
                          dataclasses.replace(desc.inputs[2], offset=desc.inputs[2].offset + 2 * desc.inputs[2].kstride,
                                              kstride=0))
    assert epi.prologue[0] == Instr(Op.LOAD, 0, imm=0)
    assert [i.imm for i in epi.prologue[1:] if i.op == Op.LOAD] == [3]  # C: input 2 of the gemm
    assert epilogue_map(library.matmul((4, 3), (3, 5))) is None  # no epilogue


def test_small_short_epilogues_stay_on_the_interpreter() -> None:
    """The compiled maps' one rule (jit.min_instrs_for): a 3-instruction map over 16 elements is
    not worth a compile."""
    desc = library.gemm((4, 3), (3, 4), (4,))
    assert CpuBackend(threads=1).prepare(desc).epi is None


def test_the_plan_refuses_an_epilogue_map_that_does_not_read_its_output_in_place() -> None:
    import torch

    desc = library.gemm((256, 8), (8, 512), (512,))
    backend = CpuBackend(threads=1)
    prep = backend.prepare(desc)
    assert prep.epi is not None
    ext = backend.extension
    plan = ext.StepPlan(1 << 18, 1 << 18, 1, *cpu_ext.DEFAULT_TILE)
    refs = torch.tensor([(1, 0, 2048), (1, 4096, 4096), (1, 8192, 512)], dtype=torch.int64)
    offs = torch.zeros(1, dtype=torch.int64)
    code = (prep.maps, prep.out_shape, desc.K, *prep.programs, 16384)
    bad = prep.epi.lin.clone()
    bad[0, 0] = 1  # input 0 one element ahead: not in place
    from verde_chain.repops.backends.cpu.jit import map_address

    with pytest.raises(RuntimeError, match="element for element"):
        plan.add_dot(refs, *code, 0, 1, 256, 512, offs, 8, 1, offs, 512, 1, bad, map_address(prep.epi.fn), 1)
    with pytest.raises(RuntimeError, match="map input addresses"):  # C read past its 512 elements
        bad = prep.epi.lin.clone()
        bad[3, 1] = 2
        plan.add_dot(refs, *code, 0, 1, 256, 512, offs, 8, 1, offs, 512, 1, bad, map_address(prep.epi.fn), 1)
    assert len(plan) == 0


def test_tiny_gpt2_steps_with_compiled_epilogues_equal_the_interpreter_and_the_reference() -> None:
    """Three AdamW steps of tiny GPT-2 (its gemm biases, peephole's fused addends, the tied
    embedding's gradient): every node output and C_s, compiled epilogues on and off, and the
    numpy reference."""
    from tests.repops.test_step_kernel import assert_same_steps, run_steps
    from verde_chain.examples.lm import LMConfig, hf_model, lm_job
    from verde_chain.graph.backend import make_runner

    cfg = LMConfig("gpt2")
    job = lm_job(cfg, steps=3, lr=1e-2, model=hf_model(cfg, seed=3))
    graph = job.program.graph
    isa = cpu_ext.best_isa()
    on = engaged(isa, 2, functools.partial(run_steps, graph, job.init_state, job.batch,
                                           CpuBackend(isa=isa, threads=2)))
    assert on[2].step_kernel().compiled_epilogues(), "no epilogue ran as a compiled map"
    off = run_steps(graph, job.init_state, job.batch, CpuBackend(isa=isa, threads=2, jit_epilogues=False))
    assert off[2].step_kernel().compiled_epilogues() == []
    assert_same_steps(on, off)
    assert_same_steps(on, run_steps(graph, job.init_state, job.batch, make_runner("reference")))

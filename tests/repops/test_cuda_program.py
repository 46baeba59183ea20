"""The CUDA program interpreter (``kernels/repops_program.cuh``) proven without a GPU.

The header is ``__host__ __device__`` code: the very source nvcc compiles into the CUDA kernel
is compiled here by g++ (-O2 -ffp-contract=off -DRP_AS_DEVICE: the device's spelling of every
exact primitive) into a small shared library with a C entry point and loaded with ctypes
(tests/support/cuda_host.py). It then runs the SAME descriptors as ``scripts/gpu_check.py``
(``family_cases``: every instruction on all edge pairs, every op family) and random programs,
and its bits are compared with ``reference.run`` / ``program.run_spec``. The CUDA backend's
Python side (GEMM planning, operand views, the epilogue with r0 preset) is run on the CPU with
a stand-in extension (CPU GEMM + this host interpreter). What this cannot prove is the GPU's
arithmetic itself: scripts/gpu_check.py does that when a GPU is lent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cuda_host import HostInterpreter, StandInExtension, WindowedStandInExtension
from verde_chain.errors import RepOpsError
from verde_chain.repops import library, program, reference
from verde_chain.repops.backends import BACKENDS
from verde_chain.repops.backends.cuda import backend as cuda_backend
from verde_chain.repops.backends.cuda.backend import KINDS, CudaBackend
from verde_chain.repops.backends.cuda.extension import CudaUnavailable
from verde_chain.repops.backends.plan import classify
from verde_chain.repops.edges import EDGE_BITS
from verde_chain.repops.isa import IMM_OPS, THREE_REG_OPS, Instr, Op


@pytest.fixture(scope="module")
def gpu_check(script: Callable[[str], ModuleType]) -> ModuleType:
    return script("gpu_check")


@pytest.fixture(scope="module", autouse=True)
def _fp_env() -> None:
    torch.set_flush_denormal(False)  # the numpy reference runs in this thread


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    g, w = np.asarray(got).reshape(-1).view(np.uint32), np.asarray(want).reshape(-1).view(np.uint32)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} differ, first [{bad[0]}] {g[bad[0]]:#010x} != {w[bad[0]]:#010x}"


# ======================================================================= the op families


@pytest.mark.parametrize("seed", [0, 1])
def test_every_family_matches_the_reference(host: HostInterpreter, gpu_check: ModuleType, seed: int) -> None:
    """gpu_check's family cases, node by node: host twin of the CUDA interpreter == reference."""
    cases = gpu_check.family_cases(seed)
    names = {c[0] for c in cases}
    # the families the brief names are all there
    for want in ("instr_FMA", "instr_LDEXP", "instr_GETMANT", "matmul", "gemm_1", "softmax", "layer_norm",
                 "gelu_erf", "gelu_tanh", "exp", "log", "tanh", "erf", "reduce_sum", "reduce_l2", "gather", "scatter_add",
                 "adamw", "sgd_nesterov", "sce_mean", "layer_norm_backward", "matmul_backward"):  # fmt: skip
        assert want in names, want
    rows = gpu_check.check_families(host, reference.run, cases)
    failed = [r for r in rows if r.get("error") or r["mismatches"]]
    assert not failed, failed[:5]
    assert sum(r["nodes"] for r in rows) >= 200
    assert sum(r["elements"] for r in rows) >= 100_000


def test_loadidx_huge_and_boundary_indices_match_the_scalar_interpreter(host: HostInterpreter) -> None:
    """Integral indices at and beyond the int32 limits: decided exactly as program.index_of."""
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    idx = np.array([2.0**31, -(2.0**31), 2.0**31 - 128, 1e30, 2.0**62, -(2.0**62), 3e38, 9, -10, 1.0], np.float32)
    desc = library.gather((10, 4), idx.shape, 0)
    assert_bits(host(desc, [data, idx]), program.run_spec(desc, [data, idx]), "gather")
    # idx_stride 0: an index only needs to be valid, any valid value reads the base address
    m = program.InputMap(4, (1,), 0, 0, 0)
    d0 = program.KernelDesc((4,), 1, (m, program.InputMap(4, (1,))), (library.load(1, 1), Instr(Op.LOADIDX, 0, 1, 0, 0)))
    ix = np.array([2.0**31, -(2.0**31), 5e9, -3.0], np.float32)
    got = host(d0, [np.arange(4, dtype=np.float32), ix])
    assert_bits(got, program.run_spec(d0, [np.arange(4, dtype=np.float32), ix]), "idx_stride 0")
    assert got.view(np.uint32)[0] == 0x7FC00000 and got[1] == 1.0 and got[3] == 3.0


def test_gemm_epilogue_with_r0_preset(host: HostInterpreter) -> None:
    """The CUDA backend's dot path: r0 from the GEMM, then ONLY the epilogue on the interpreter."""
    a, b, c = (
        np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(6, 9), (9, 5), (5,)])
    )
    desc = library.gemm(a.shape, b.shape, c.shape, 0.5, -2.0)
    assert desc.epilogue
    chain = program.KernelDesc(desc.out_shape, desc.K, desc.inputs, desc.prologue, desc.body)
    r0 = reference.run(chain, [a, b, c])
    assert_bits(host(desc, [a, b, c], r0_init=r0), reference.run(desc, [a, b, c]), "gemm epilogue")


# ======================================================================= random programs

_CONST_BITS = st.sampled_from(EDGE_BITS) | st.integers(0, 2**32 - 1)


@st.composite
def random_desc(draw: st.DrawFn) -> tuple[program.KernelDesc, list[np.ndarray]]:
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    K = draw(st.integers(1, 4))
    n_in = draw(st.integers(1, 3))
    numel = int(np.prod(shape)) if shape else 1
    cs = library.c_strides(shape)
    maps, ins = [], []
    for t in range(n_in):
        bcast = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        strides = tuple(0 if bz else s * K for s, bz in zip(cs, bcast))
        maps.append(program.InputMap(numel * K, strides, 1, 0, draw(st.integers(-3, 3))))
        bits = draw(st.lists(_CONST_BITS, min_size=numel * K, max_size=numel * K))
        ins.append(np.array(bits, np.uint32).view(np.float32))

    def instr() -> Instr:
        op = draw(st.sampled_from(list(Op)))
        dst, a, b = (draw(st.integers(0, 15)) for _ in range(3))
        if op in THREE_REG_OPS:
            imm = draw(st.integers(0, 15))
        elif op in (Op.LOAD, Op.LOADIDX):
            imm = draw(st.integers(0, n_in - 1))
        elif op == Op.COORD:
            if rank == 0:
                return Instr(Op.CONST, dst, imm=draw(_CONST_BITS))
            imm = draw(st.integers(0, rank - 1))
        elif op in IMM_OPS:
            imm = draw(_CONST_BITS)
        else:
            imm = 0
        return Instr(op, dst, a, b, imm)

    pro = tuple(instr() for _ in range(draw(st.integers(1, 8))))
    body = tuple(instr() for _ in range(draw(st.integers(1, 6)))) if K > 1 else ()
    epi = tuple(instr() for _ in range(draw(st.integers(0, 4))))
    return program.KernelDesc(shape, K, tuple(maps), pro, body, epi, label="random"), ins


@settings(max_examples=150, deadline=None)
@given(case=random_desc())
def test_random_programs_match_the_scalar_interpreter(host: HostInterpreter, case: Any) -> None:
    desc, ins = case
    assert_bits(host(desc, ins), program.run_spec(desc, ins), "random program")


# ======================================================================= refusals


def test_bad_descriptors_are_refused_before_any_read(host: HostInterpreter) -> None:
    """SAFETY: the decoder (shared with the CUDA launcher) refuses bad encodings with a reason."""
    x = np.zeros(4, np.float32)
    ok_maps = np.array([[1, 0, 0, 0, 4]], np.int64)
    load = np.array([[int(Op.LOAD), 0, 0, 0, 0]], np.int64)
    none = np.zeros((0, 5), np.int64)
    assert host.raw([x], ok_maps, (4,), 1, [load, none, none])[0] == 0
    bad_cases = {
        "LOAD addresses leave": ([x], np.array([[1, 0, 2, 0, 4]], np.int64), (4,), 1, [load, none, none]),  # offset 2
        "LOAD addresses leave ": (
            [x],
            np.array([[1, 1, 0, 0, 4]], np.int64),
            (4,),
            2,
            [load, load, none],
        ),  # k runs past
        "unknown opcode": ([x], ok_maps, (4,), 1, [np.array([[len(Op), 0, 0, 0, 0]], np.int64), none, none]),
        "register": ([x], ok_maps, (4,), 1, [np.array([[int(Op.ADD), 16, 0, 0, 0]], np.int64), none, none]),
        "c register": ([x], ok_maps, (4,), 1, [np.array([[int(Op.FMA), 0, 0, 0, 16]], np.int64), none, none]),
        "missing input": ([x], ok_maps, (4,), 1, [np.array([[int(Op.LOADIDX), 0, 0, 0, 1]], np.int64), none, none]),
        "COORD axis": ([x], ok_maps, (4,), 1, [np.array([[int(Op.COORD), 0, 0, 0, 1]], np.int64), none, none]),
        "K must be": ([x], ok_maps, (4,), 0, [load, none, none]),
        "rank": ([x], np.zeros((1, 11), np.int64), (1,) * 7, 1, [load, none, none]),
    }
    for reason, args in bad_cases.items():
        rc, _, err = host.raw(*args)
        assert rc == -1 and reason.strip() in err, (reason, rc, err)


# ======================================================================= the backend without CUDA


def test_backend_raises_clearly_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; gpu_check.py runs the backend")
    desc = library.map_unary("exp", (3,))
    x = np.ones(3, np.float32)
    with pytest.raises(CudaUnavailable, match="CUDA is not available"):
        CudaBackend()
    with pytest.raises(CudaUnavailable, match="CUDA is not available") as info:
        cuda_backend.backend(desc, [x])
    assert isinstance(info.value, RepOpsError)
    with pytest.raises(CudaUnavailable, match="CUDA is not available"):
        BACKENDS["cuda"](desc, [x])
    from verde_chain.graph.backend import make_runner

    run = make_runner("cuda")  # registered; the error comes on first use, not silently
    with pytest.raises(CudaUnavailable, match="CUDA is not available"):
        run(desc, [x])


def classify_cuda(desc: program.KernelDesc):  # type: ignore[no-untyped-def]
    return classify(desc, KINDS)


def test_plan_sends_dot_nodes_to_the_gemm() -> None:
    assert classify_cuda(library.matmul((6, 9), (9, 5))).kind == "dot"
    assert classify_cuda(library.gemm((6, 9), (5, 9), (5,), 0.5, 1.0, False, True)).kind == "dot"
    assert classify_cuda(library.matmul((3, 1, 4, 7), (2, 7, 5))).kind == "dot"
    assert classify_cuda(library.matmul((7,), (7, 4))).kind == "program"  # GEMV
    assert classify_cuda(library.reduce_dot((5, 7), (1,))).kind == "program"
    assert classify_cuda(library.softmax((4, 6)).nodes[0].desc).kind == "program"
    mm = library.matmul((4, 6), (6, 3))
    odd = program.KernelDesc(mm.out_shape, mm.K, mm.inputs, mm.prologue, mm.body, (Instr(Op.ADD, 0, 0, 1),))
    assert classify_cuda(odd).kind == "program"  # the epilogue reads r1: not modelled by the GEMM
    neg = program.KernelDesc(
        mm.out_shape, mm.K, (mm.inputs[0], program.InputMap(18, (0, -1), 3, 2)), mm.prologue, mm.body
    )
    assert classify_cuda(neg).kind == "program"


def test_backend_python_side_on_the_cpu(
    host: HostInterpreter, gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CudaBackend's planning, operand views, GEMM + epilogue and result handling, with a
    CPU stand-in for the extension: bit-identical to the reference on every family."""
    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    ext = StandInExtension(host)
    be = CudaBackend(device="cpu", ext=ext)
    rows = gpu_check.check_families(be, reference.run, gpu_check.family_cases(2))
    failed = [r for r in rows if r.get("error") or r["mismatches"]]
    assert not failed, failed[:5]
    assert ext.calls["matmul3"] >= 10 and ext.calls["r0_init"] >= 3 and ext.calls["run_program"] >= 200, ext.calls


def test_training_through_make_runner_cuda_on_the_cpu(
    host: HostInterpreter, gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu_check's training comparison, with the stand-in extension behind make_runner("cuda"):
    the runner runs whole steps on the device arena (CudaStepKernel: prepared nodes launched,
    GEMMs in place) and agrees with the C++ backend on every commitment C_0..C_T."""
    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    ext = StandInExtension(host)
    be = CudaBackend(device="cpu", ext=ext)
    monkeypatch.setattr(cuda_backend, "default_backend", lambda: be)
    out = gpu_check.training("digits", 2)
    assert out["identical"], out
    assert out["cuda_whole_step"], "make_runner('cuda') must offer the CUDA step kernel"
    assert ext.calls["matmul3"] > 0 and ext.calls["launch_program"] > 0 and ext.calls["run_program"] == 0


def test_gpu_check_families_step_on_the_cpu(
    host: HostInterpreter, gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU script's "families" step as it will run on a GPU (two seeds plus the large
    shapes, against the C++ CPU backend), with the stand-in extension: it reports no failure,
    so a failure on the GPU can only come from the device's kernels."""
    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    out = gpu_check.families(CudaBackend(device="cpu", ext=StandInExtension(host)), quick=False)
    assert out["against"] == "cpu" and not out["failed"], out["failed"][:5]
    assert out["cases"] >= 2 * 150 and out["elements"] >= 4_000_000, out


def test_gpu_check_vision_step_on_the_cpu(
    host: HostInterpreter, gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The GPU script's "vision" step with the stand-in extension: the digits CNN (conv, batch
    norm, pooling nodes; windowed GEMMs on the device's path) agrees with the C++ backend on
    every commitment; a job that fails is reported beside the others, not raised; and the
    summary is on disk after the step, so a run cut short keeps it."""
    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    ext = WindowedStandInExtension(host)
    be = CudaBackend(device="cpu", ext=ext)
    monkeypatch.setattr(cuda_backend, "default_backend", lambda: be)
    monkeypatch.setattr(gpu_check, "VISION_JOBS", ("digits_cnn", "no_such_job"))
    summary: dict[str, Any] = {"errors": []}
    out_file = tmp_path / "summary.json"
    gpu_check._timed_step(summary, "vision", lambda: gpu_check.vision(1), str(out_file))
    cnn, missing = summary["vision"]["digits_cnn"], summary["vision"]["no_such_job"]
    assert cnn["identical"] and cnn["nodes"] > 50, cnn
    assert missing["identical"] is False and "no_such_job" in missing["error"], missing
    assert ext.calls.get("windowed_matmul", 0) > 0 and ext.calls["run_program"] > 0, ext.calls
    assert json.loads(out_file.read_text())["vision"] == json.loads(json.dumps(summary["vision"]))
    gpu_check._timed_step(summary, "bench", lambda: 1 / 0, str(out_file))
    written = json.loads(out_file.read_text())
    assert written["errors"][0].startswith("bench: ") and "ZeroDivisionError" in written["errors"][0]
    assert "vision" in written and "bench_s" in written

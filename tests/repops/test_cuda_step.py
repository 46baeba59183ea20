"""The CUDA whole-step kernel (``CudaBackend.compile_step`` -> ``CudaStepKernel``) without a GPU.

The extension is the CPU stand-in of tests/support/cuda_host.py (C++ GEMM + the host build of
``kernels/repops_program.cuh``), so what is proven here is everything but the device's own
arithmetic (scripts/gpu_check.py checks that): the arena layout, the per-node views and
operands, the GEMM + epilogue through a scratch r0, the double-buffered device arenas, which
previous state is uploaded and which is reused, and that a step moves one batch and at most one
arena to the device and one arena back — never a tensor per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.cuda_host import HostInterpreter, StandInExtension
from verde_chain.errors import RepOpsError
from verde_chain.examples import EXAMPLES
from verde_chain.graph.backend import make_runner
from verde_chain.graph.executor import PlainState, StepExecutor
from verde_chain.job import Job
from verde_chain.repops.backends.cpu.step import StepKernel
from verde_chain.repops.backends.cuda import backend as cuda_backend
from verde_chain.repops.backends.cuda.backend import CudaBackend, CudaRunner
from verde_chain.repops.backends.cuda.extension import check_out
from verde_chain.repops.backends.cuda.step import CudaStepKernel

STEPS = 3


class Transfers:
    """Counts the backend's host <-> device copies (the only ones a whole step makes)."""

    def __init__(self, be: CudaBackend) -> None:
        self.up: list[int] = []  # element count of each host -> device copy
        self.down = 0
        upload, download = be.upload, be.download

        def counted_upload(dst: torch.Tensor, src: np.ndarray) -> None:
            self.up.append(src.size)
            upload(dst, src)

        def counted_download(src: torch.Tensor) -> np.ndarray:
            self.down += 1
            return download(src)

        be.upload = counted_upload  # type: ignore[method-assign]
        be.download = counted_download  # type: ignore[method-assign]

    def take(self) -> tuple[list[int], int]:
        out = (self.up, self.down)
        self.up, self.down = [], 0
        return out


@pytest.fixture
def cuda(host: HostInterpreter, monkeypatch: pytest.MonkeyPatch) -> tuple[CudaBackend, StandInExtension, Transfers]:
    torch.set_flush_denormal(False)
    monkeypatch.setattr(cuda_backend, "cuda_status", lambda: None)
    ext = StandInExtension(host)
    be = CudaBackend(device="cpu", ext=ext)
    # make_runner("cuda") / CudaRunner reach the backend through default_backend
    monkeypatch.setattr(cuda_backend, "default_backend", lambda: be)
    return be, ext, Transfers(be)


@pytest.fixture(scope="module")
def jobs() -> dict[str, Job]:
    return {"digits": EXAMPLES["digits"](steps=STEPS), "transformer": EXAMPLES["transformer"](steps=STEPS)}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)


def same(xs: list[np.ndarray], ys: list[np.ndarray], what: str) -> None:
    assert len(xs) == len(ys), what
    for d, (x, y) in enumerate(zip(xs, ys, strict=True)):
        bx, by = bits(x), bits(y)
        assert np.array_equal(bx, by), f"{what}: node {d} differs at {np.flatnonzero(bx != by)[:5]}"


def run_steps(
    job: Job, runner: Callable[..., Any]
) -> tuple[list[list[np.ndarray]], bytes, StepExecutor, list[PlainState]]:
    """Steps 1..STEPS: plain, except the last (committed); outputs, C_T, the executor, states."""
    ex = StepExecutor(job.program.graph, runner)
    st: PlainState = ex.initial_state(job.init_state)
    states, outs = [st], []
    for s in range(1, STEPS):
        res = ex.run_plain(st, job.batch(s))
        outs.append(res.outputs)
        st = res.state
        states.append(st)
    last = ex.run_step(st, job.batch(STEPS))
    outs.append(last.outputs)
    states.append(last.state)
    return outs, last.commitment, ex, states


@pytest.mark.parametrize("name", ["digits", "transformer"])
def test_whole_step_on_the_device_equals_the_cpu_backend(
    name: str, jobs: dict[str, Job], cuda: tuple[CudaBackend, StandInExtension, Transfers]
) -> None:
    """Every node output of 3 steps and C_T bit-identical to make_runner("cpu"); one batch upload,
    one arena upload only from C_0, one download per step; every kernel operand a view of the
    step kernel's device buffers."""
    be, ext, transfers = cuda
    job = jobs[name]
    outs, c_t, ex, _ = run_steps(job, CudaRunner())
    kernel = ex.step_kernel()
    assert isinstance(kernel, CudaStepKernel)  # the whole-step path really ran
    want_outs, want_c, cpu_ex, _ = run_steps(job, make_runner("cpu"))
    assert c_t == want_c
    for s in range(STEPS):
        same(outs[s], want_outs[s], f"{name} step {s + 1}")
    # the same arena layout as the CPU whole-step kernel (the executor's arena_roots rely on it)
    cpu_kernel = cpu_ex.step_kernel()
    assert isinstance(cpu_kernel, StepKernel)
    assert kernel.offsets == cpu_kernel.offsets and kernel.arena_numel == cpu_kernel.arena_numel
    up, down = transfers.take()
    n_arena, n_batch = kernel.arena_numel, job.program.graph.batch_numel
    # step 1 uploads C_0 (packed) and its batch; steps 2, 3 read the arena the device kept
    assert up == [n_arena, n_batch, n_batch, n_batch] and down == STEPS, (up, down)
    # every node prepared once per arena parity, launched once per step, nothing else run
    nodes = job.program.graph.nodes
    gemm_only = sum(1 for n in nodes if be.path(n.desc) == "dot" and not n.desc.epilogue)
    gemms = sum(1 for n in nodes if be.path(n.desc) == "dot")
    assert ext.calls["prepare_program"] == 2 * (len(nodes) - gemm_only)
    assert ext.calls["launch_program"] == STEPS * (len(nodes) - gemm_only)
    assert ext.calls["matmul3"] == STEPS * gemms and ext.calls["out"] == ext.calls["matmul3"]  # GEMMs land in place
    assert ext.calls["run_program"] == 0 and gemms > 0
    if name == "digits":
        assert gemm_only < gemms  # GEMMs with an epilogue (r0 scratch -> slot) ran too
    buffers = {t.untyped_storage().data_ptr() for t in (*kernel._arenas, kernel._batch, kernel._r0)}
    assert ext.storages <= buffers, "a kernel read or wrote a tensor outside the device buffers"


def test_states_not_from_the_kernel_are_uploaded(
    jobs: dict[str, Job], cuda: tuple[CudaBackend, StandInExtension, Transfers]
) -> None:
    """A replaced state (dataclasses.replace drops the arena), an older state of this kernel and
    a state of another executor are all uploaded, never mistaken for the device's arena."""
    _, _, transfers = cuda
    job = jobs["transformer"]
    want_outs, want_c, _, want_states = run_steps(job, make_runner("cpu"))
    ex = StepExecutor(job.program.graph, CudaRunner())
    s0 = ex.initial_state(job.init_state)
    s1 = ex.run_plain(s0, job.batch(1)).state
    kernel = ex.step_kernel()
    s2 = ex.run_plain(s1, job.batch(2)).state
    transfers.take()
    n_arena, n_batch = kernel.arena_numel, job.program.graph.batch_numel

    # 1. a replaced state: new tensors dict, arena dropped -> packed and uploaded
    moved = dataclasses.replace(s2, tensors={p: t.copy() for p, t in s2.tensors.items()})
    assert moved.arena is None
    r3 = ex.run_step(moved, job.batch(3))
    assert r3.commitment == want_c
    same(r3.outputs, want_outs[2], "after replace")
    assert transfers.take() == ([n_arena, n_batch], 1)

    # 2. an older arena of this kernel (s1's; s2's and r3's were computed since) -> uploaded
    again = ex.run_plain(s1, job.batch(2))
    same(again.outputs, want_outs[1], "older state")
    assert transfers.take() == ([n_arena, n_batch], 1)

    # 3. the arena just returned is reused; the one before it (s2) no longer is
    r3b = ex.run_step(again.state, job.batch(3))
    assert r3b.commitment == want_c and transfers.take() == ([n_batch], 1)
    assert ex.run_step(s2, job.batch(3)).commitment == want_c
    assert transfers.take() == ([n_arena, n_batch], 1)

    # 4. a state whose tensors equal the kernel's but came from elsewhere (the C++ backend)
    cpu_s2 = want_states[2]
    assert ex.run_step(cpu_s2, job.batch(3)).commitment == want_c
    up, _ = transfers.take()
    assert up[0] == n_arena


def test_returned_arena_is_read_only_so_the_device_copy_stays_its_twin(
    jobs: dict[str, Job], cuda: tuple[CudaBackend, StandInExtension, Transfers]
) -> None:
    """SAFETY: the device arena is reused only for the array it was copied to; that array cannot
    be edited in place (an edit would silently not reach the device)."""
    job = jobs["digits"]
    ex = StepExecutor(job.program.graph, CudaRunner())
    st = ex.run_plain(ex.initial_state(job.init_state), job.batch(1)).state
    assert st.arena is not None and not st.arena.flags.writeable
    t = next(iter(st.tensors.values()))
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 1.0


def test_node_times_and_refusals(jobs: dict[str, Job], cuda: tuple[CudaBackend, StandInExtension, Transfers]) -> None:
    be, _, _ = cuda
    job = jobs["digits"]
    g = job.program.graph
    ex = StepExecutor(g, CudaRunner())
    kernel = ex.step_kernel()
    assert isinstance(kernel, CudaStepKernel)
    kernel.node_times = np.zeros(len(g.nodes))
    s0 = ex.initial_state(job.init_state)
    ex.run_plain(s0, job.batch(1))
    assert (kernel.node_times >= 0).all() and kernel.node_times.sum() > 0
    with pytest.raises(RepOpsError, match="previous arena"):
        kernel.run(np.zeros(kernel.arena_numel + 1, np.float32), job.batch(1))
    with pytest.raises(RepOpsError, match="batch has"):
        kernel.run(kernel.pack(s0.tensors), np.zeros(3, np.float32))
    wiring = [tuple((int(s.kind), int(s.index)) for s in n.inputs) for n in g.nodes]
    bad = [list(w) for w in wiring]
    d = next(i for i, w in enumerate(wiring) if any(k == 0 for k, _ in w))
    bad[d] = [(0, d) if k == 0 else (k, i) for k, i in wiring[d]]  # reads its own output
    with pytest.raises(RepOpsError, match="not an earlier node"):
        be.compile_step([n.desc for n in g.nodes], bad, [s.producer for s in g.states], g.batch_numel)


def test_out_must_be_apart_from_the_operands() -> None:
    """The out= contract of the binding (and the ctypes fallback): right dtype and size,
    contiguous, no overlap with what the kernel reads."""
    buf = torch.zeros(64, dtype=torch.int32)
    check_out(buf[32:48], torch.int32, 16, (buf[0:16], buf[16:32]))
    with pytest.raises(ValueError, match="overlaps"):
        check_out(buf[8:24], torch.int32, 16, (buf[0:16],))
    strided = buf.view(torch.float32).as_strided((4, 4), (1, 8), 20)  # touches 20 .. 47
    with pytest.raises(ValueError, match="overlaps"):
        check_out(buf[44:60].view(torch.float32), torch.float32, 16, (strided,))
    with pytest.raises(ValueError, match="contiguous"):
        check_out(buf[0:32:2], torch.int32, 16, ())
    with pytest.raises(ValueError, match="elements"):
        check_out(buf[0:8], torch.int32, 16, ())


def test_make_runner_cuda_runs_whole_steps(
    jobs: dict[str, Job], cuda: tuple[CudaBackend, StandInExtension, Transfers]
) -> None:
    """make_runner("cuda") offers compile_step, so the executor runs whole steps on the device
    (ops.BackendRunner passes the registered backend's compile_step on)."""
    runner = make_runner("cuda")
    assert getattr(runner, "compile_step", None) is not None, "make_runner('cuda') must offer compile_step"
    _, c_t, ex, _ = run_steps(jobs["digits"], runner)
    assert isinstance(ex.step_kernel(), CudaStepKernel)
    assert c_t == run_steps(jobs["digits"], make_runner("cpu"))[1]


def test_gpu_check_step_timing_on_the_cpu(
    cuda: tuple[CudaBackend, StandInExtension, Transfers], script: Callable[[str], ModuleType]
) -> None:
    """scripts/gpu_check.py's step_timing as it runs on a GPU (with the stand-in): the whole-step
    kernel runs and both models' committed steps agree with the C++ backend."""
    gpu_check = script("gpu_check")
    out = gpu_check.step_timing(CudaRunner(), reps=1)
    assert set(out) == {"digits_wide", "transformer"}
    for row in out.values():
        assert row["whole_step"] and row["identical"] and row["cuda_ms"] > 0 and row["cpu_ms"] > 0, row


def test_training_run_with_checkpoints_resume_and_recompute(
    cuda: tuple[CudaBackend, StandInExtension, Transfers], tmp_path: Any
) -> None:
    """The read-only arenas travel through everything a trainer does with states: checkpoints on
    disk, resume, recomputation from a checkpoint, element openings and micro-step traces."""
    job = EXAMPLES["digits"](steps=4)
    want = job.make_run(None, 0, make_runner("cpu"), 4)
    want.run()
    run = job.make_run(tmp_path, 2, CudaRunner(), 4)
    assert run.run() == want.commitments[4]
    assert isinstance(run.exec.step_kernel(), CudaStepKernel)
    assert [run.commitments[s] for s in range(5)] == [want.commitments[s] for s in range(5)]
    again = job.make_run(tmp_path, 2, CudaRunner(), 4, fresh=False)
    assert again.resume() == 4
    assert again.recompute_step(3).commitment == want.commitments[3]
    loss = job.program.graph.named["loss"]
    root, opening = again.open_output(3, loss, 0)
    assert (root, opening) == want.open_output(3, loss, 0)
    assert again.trace(3, loss, 0) == want.trace(3, loss, 0)

"""The shared step arena (``native.ArenaLayout`` with ``keep``): dead intermediates share memory
by liveness, a committed step hashes each output inside the plan before its slot is reused,
and every root, node hash, C_s and state tensor is that of the layout that keeps every output."""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np
import pytest
import torch

from tests.support.tensor_ref import ref_root
from tests.support.threads import engaged, spread_check
from verde_chain.commit import native as commit_native
from verde_chain.commit.native import default_threads
from verde_chain.errors import RepOpsError
from verde_chain.examples import EXAMPLES
from verde_chain.examples.lm import LMConfig, lm_job
from verde_chain.graph.executor import StepExecutor, StepResult
from verde_chain.repops.backends import native
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.step import StepKernel, roots_api

JOBS = {"transformer": {}, "digits_cnn": {"batch_size": 4}}
STEPS = 3


def _job(name: str):  # type: ignore[no-untyped-def]
    return EXAMPLES[name](steps=STEPS, **JOBS[name])


def _steps(job, keep):  # type: ignore[no-untyped-def]
    """Plain steps 1..STEPS-1, then a committed step STEPS, keeping ``keep`` (None: all)."""
    ex = StepExecutor(job.program.graph, CpuBackend(threads=2))
    st = ex.initial_state(job.init_state)
    for s in range(1, STEPS):
        st = ex.run_plain(st, job.batch(s), keep=keep).state
    return ex, ex.run_step(st, job.batch(STEPS), keep=keep)


def _assert_same(a: StepResult, b: StepResult) -> None:
    assert a.roots == b.roots
    assert a.node_hashes == b.node_hashes
    assert a.commitment == b.commitment
    for p, t in a.state.tensors.items():
        assert np.array_equal(t.view(np.uint32), b.state.tensors[p].view(np.uint32))


def _loss(job) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return (job.program.graph.named["loss"],)


@pytest.mark.parametrize("name", list(JOBS))
def test_shared_arena_is_smaller_and_commits_the_same(name: str) -> None:
    job = _job(name)
    ex_full, full = _steps(job, None)
    ex_shared, shared = _steps(job, _loss(job))
    kernel = ex_shared.step_kernel(_loss(job))
    assert isinstance(kernel, StepKernel) and not kernel.keeps_all and kernel.hashes_outputs
    assert ex_full.step_kernel().keeps_all
    # the memory really is shared: arena + work region under the sum of the node outputs,
    # and some outputs of the step occupy the same addresses
    total = sum(kernel.numels)
    assert kernel.arena_numel + kernel.work_numel < total, (kernel.arena_numel, kernel.work_numel, total)
    work = [d for d in range(len(kernel.numels)) if kernel.offsets[d] >= kernel.arena_numel]
    starts = [kernel.offsets[d] for d in work]
    assert len(set(starts)) < len(starts)
    _assert_same(full, shared)
    # the outputs not kept are not handed out; the loss is
    loss = _loss(job)[0]
    assert np.array_equal(full.outputs[loss], shared.outputs[loss])
    assert sum(o.size == 0 for o in shared.outputs) == len(work)


def test_a_wrong_slot_assignment_is_refused_and_would_change_the_commitment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation: each slot handed back one node early (its last reader may then find
    another node's data there)."""
    job = _job("transformer")
    _, full = _steps(job, None)
    real = native.shared_slots

    def early(numels, last, kept):  # type: ignore[no-untyped-def]
        return real(numels, [max(d, e - 1) for d, e in enumerate(last)], kept)

    monkeypatch.setattr(native, "shared_slots", early)
    with pytest.raises(RepOpsError, match="still read later in the step"):
        _steps(job, _loss(job))
    # without the check, the equality above is what catches it
    monkeypatch.setattr(native, "check_slots", lambda *a: None)
    _, wrong = _steps(job, _loss(job))
    assert wrong.commitment != full.commitment


def test_training_runs_on_the_shared_layout() -> None:
    """A run's steps use the shared layout (state and loss kept) and reach the C_T of a run
    whose steps keep every output."""
    job = _job("transformer")
    runner = CpuBackend(threads=1)
    run = job.make_run(None, 0, runner, STEPS)
    c_t = run.run()
    assert list(run.exec._kernels) == [frozenset(run.keep)]  # only the shared layout was built
    kernel = run.exec.step_kernel(run.keep)
    assert isinstance(kernel, StepKernel) and not kernel.keeps_all
    _, full = _steps(job, None)
    assert c_t == full.commitment


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    """The issue's tiny Llama, with the reference of its committed step STEPS: every node run
    one by one (an identity tamper takes the per-node path) and hashed by ``tensor_roots``."""
    job = lm_job(LMConfig("llama"), steps=STEPS, checkpoint_interval=0)
    ex = StepExecutor(job.program.graph, CpuBackend(threads=1))
    st = ex.initial_state(job.init_state)
    for s in range(1, STEPS):
        st = ex.run_plain(st, job.batch(s)).state
    return job, ex.run_step(st, job.batch(STEPS), tamper=lambda d, out: out)


def _committed(ex, st, batch, keep, ref, tries: int = 20, patience_s: float = 20.0):  # type: ignore[no-untyped-def]
    """The committed step run up to ``tries`` times (each equal to ``ref``) until more than one
    thread hashed (at 2+ threads a pool worker hashes in its idle time, which a busy machine
    may not give it in one step), and on for up to ``patience_s`` seconds, pausing between
    runs, while it has not (the other test process of a two-core CI can hold both cores with
    threads of its own for longer than 20 steps); returns the kernel and, per run, (threads that
    hashed, items hashed while levels ran, all items)."""
    kernel, runs = ex.step_kernel(keep), []
    start = time.monotonic()
    while len(runs) < tries or (tries > 1 and time.monotonic() - start < patience_s):
        with spread_check(ex.runner.isa):
            got = ex.run_step(st, batch, keep=keep)
        _assert_same(ref, got)
        runs.append((kernel.hash_workers(), *kernel.idle_hashed()))
        if runs[-1][0] > 1:
            break
        if len(runs) >= tries:
            time.sleep(0.05)
    return kernel, runs


def _llama_state(job, threads: int):  # type: ignore[no-untyped-def]
    ex = StepExecutor(job.program.graph, CpuBackend(threads=threads))
    st = ex.initial_state(job.init_state)
    for s in range(1, STEPS):
        st = ex.run_plain(st, job.batch(s), keep=_loss(job)).state
    return ex, st


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_in_plan_hashing_on_threads_gives_the_reference_roots(llama, threads: int) -> None:  # type: ignore[no-untyped-def]
    """The committed step hashes its outputs inside the plan on up to ``threads`` threads (the
    machine's cores at most): every root, node hash and C_s is the reference's, and at more
    than one thread more than one OS thread really hashed."""
    job, ref = llama
    want = min(threads, default_threads())
    if threads > 1 and want < 2:
        pytest.skip("one core: the hashing cannot be shown to run on several threads")
    ex, st = _llama_state(job, threads)
    kernel, runs = _committed(ex, st, job.batch(STEPS), _loss(job), ref, tries=1 if want == 1 else 20)
    assert isinstance(kernel, StepKernel) and kernel.hashes_outputs and not kernel.keeps_all
    workers = runs[-1][0]
    if want == 1:
        assert workers == 1
        assert runs[-1][1:] == (0, 0)  # one thread: everything at the hash points
    else:
        assert 1 < workers <= want, (threads, runs)


def test_idle_hashing_overlaps_the_levels_and_gives_the_same_roots(llama) -> None:  # type: ignore[no-untyped-def]
    """At two threads a committed step hashes finished outputs in the pool worker's idle time
    while later levels run (step_plan.cpp IdleHashing), and drains the rest at the hash points:
    the reference's roots, node hashes and C_s in every run; in some run the worker really
    hashed items while levels ran; with idle hashing off, nothing is hashed that way and the
    roots are the same."""
    job, ref = llama
    if default_threads() < 2:
        pytest.skip("one core: nothing runs beside the levels")
    ex, st = _llama_state(job, 2)
    kernel = ex.step_kernel(_loss(job))
    kernel.set_idle_hashing(True)
    overlapped = []
    for _ in range(20):
        _, runs = _committed(ex, st, job.batch(STEPS), _loss(job), ref)
        overlapped.append(runs[-1][1])
        assert runs[-1][2] > 0 and runs[-1][1] <= runs[-1][2]
        if overlapped[-1] > 0:
            break
    assert max(overlapped) > 0, overlapped
    kernel.set_idle_hashing(False)
    try:
        _, runs = _committed(ex, st, job.batch(STEPS), _loss(job), ref)
        assert all(r[1:] == (0, 0) for r in runs), runs
    finally:
        kernel.set_idle_hashing(True)


@pytest.mark.slow
def test_in_plan_hashing_splits_big_outputs_across_threads() -> None:
    """Outputs of more than 256 leaves (digits_cnn at batch 256 has six of exactly 2,048) are cut
    into subtree tasks that the pool's threads share with the small outputs' groups: same
    roots, node hashes and C_s as the node-by-node reference, big outputs really split, and
    both threads hashed (no thread of the keccak tree's own was started)."""
    if default_threads() < 2:
        pytest.skip("one core: the hashing cannot be shown to run on several threads")
    job = EXAMPLES["digits_cnn"](steps=2, batch_size=256)
    backend = CpuBackend(threads=2)
    ex = StepExecutor(job.program.graph, backend)
    st = ex.initial_state(job.init_state)
    ref = ex.run_step(st, job.batch(1), tamper=lambda d, out: out)
    started, split = commit_native.threads_started(), commit_native.trees_split()
    kernel, runs = _committed(ex, st, job.batch(1), _loss(job), ref)
    assert commit_native.trees_split() > split
    assert commit_native.threads_started() == started
    assert isinstance(kernel, StepKernel) and kernel.hashes_outputs and not kernel.keeps_all
    assert sum(n >= 2048 * 128 for n in kernel.numels) >= 1
    assert runs[-1][0] == 2, runs


# Sizes around the in-plan hashing's boundaries (elements): the largest small tree (256 leaves),
# the smallest split one (257), ragged last leaves, 2,048 leaves (the old split threshold) and
# 2^14 + 1 (tasks of the largest size, a one-leaf last task, the top fold's ZERO padding).
POOL_SIZES = [128 * 256, 128 * 256 + 1, 128 * 257 - 3, 128 * 2047 + 5, 128 * 2048, 128 * 2048 + 1, 128 * 2**14 + 1]


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_pool_hashing_of_big_outputs_gives_the_reference_roots(threads: int) -> None:
    """The in-plan hashing's code (``pool_tensor_roots``: the keccak tree's items run on the
    plan's pool) on sizes around its thresholds, each alone and all of them with small
    tensors in one call: the roots of the Python twin, every big tensor cut into subtree tasks
    when more than one thread may hash, and more than one OS thread hashing (the pool's probe)."""
    want = min(threads, default_threads())
    if threads > 1 and want < 2:
        pytest.skip("one core: the hashing cannot be shown to run on several threads")
    if commit_native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    isa = cpu_ext.best_isa()
    ext, api = cpu_ext.extension(isa), roots_api()
    rng = np.random.default_rng(threads)
    small = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 128 * 40, size=40)]
    big = [rng.standard_normal(n).astype(np.float32) for n in POOL_SIZES]
    big[1][[0, 1, 2, 3]] = [-0.0, np.inf, np.nan, 1e-45]  # bits taken as they are
    expected = {id(t): ref_root(t.view(np.uint32)) for t in small + big}
    # each tensor split alone (the 256-leaf one is a small tree: one item, one thread), then all
    for case in [[t] for t in big if t.size > 128 * 256] + [small + big]:
        split = commit_native.trees_split()
        tensors = [torch.from_numpy(t) for t in case]
        roots, workers = engaged(isa, want, functools.partial(ext.pool_tensor_roots, api, tensors, want))
        assert [bytes(r) for r in roots.numpy()] == [expected[id(t)] for t in case]
        assert (workers > 1) == (want > 1), (want, workers)
        if len(case) == 1:  # one big tensor: split exactly when several threads may hash it
            assert commit_native.trees_split() - split == (want > 1), case[0].size



class _RootsApiTable(ctypes.Structure):
    """keccak_tree.c keccak_roots_api_t (step_plan.cpp RootsApi): five function addresses and
    the leaf size."""

    _fields_ = [("begin", ctypes.c_void_p), ("items", ctypes.c_void_p), ("threads", ctypes.c_void_p),
                ("run_item", ctypes.c_void_p), ("end", ctypes.c_void_p), ("leaf_elems", ctypes.c_size_t)]


_BEGIN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                          ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_int))


def test_a_committed_run_that_fails_midway_leaves_the_plan_and_pool_sound(llama) -> None:  # type: ignore[no-untyped-def]
    """A committed run at two threads whose keccak tree runs out of memory partway (the k-th
    ``roots_begin`` fails, as malloc would: the first, and the last but one, when most batches
    are out with the pool's idle function) raises one named error; the batches already handed
    out are taken back (idle work removed, their work folded and freed). The same kernel then
    commits the step with the reference's roots, node hashes and C_s, again hashing in idle time
    (the pool took the new run's idle function, so the failed run had removed its own)."""
    job, ref = llama
    if default_threads() < 2:
        pytest.skip("one core: no idle hashing")
    if commit_native.load_library() is None:
        pytest.skip("no C compiler: the native library is not built here")
    ex, st = _llama_state(job, 2)
    kernel = ex.step_kernel(_loss(job))
    real = _RootsApiTable.from_address(roots_api())
    real_begin = _BEGIN(real.begin)
    calls, fail_at = [0], [0]

    def begin(*args):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == fail_at[0]:
            args[-1][0] = -2
            return None
        return real_begin(*args)

    counting = _BEGIN(begin)
    table = _RootsApiTable(ctypes.cast(counting, ctypes.c_void_p).value, real.items, real.threads, real.run_item,
                           real.end, real.leaf_elems)
    kernel.hash_with(ctypes.addressof(table))
    try:
        _committed(ex, st, job.batch(STEPS), _loss(job), ref, tries=1)  # counts the batches (all succeed)
        batches = calls[0]
        assert batches > 3, batches
        for k in (1, batches - 1):
            calls[0], fail_at[0] = 0, k
            with pytest.raises(RuntimeError, match=r"roots_begin failed \(-2\)"):
                ex.run_step(st, job.batch(STEPS), keep=_loss(job))
            assert calls[0] == k
    finally:
        kernel.hash_with(roots_api())
    _, runs = _committed(ex, st, job.batch(STEPS), _loss(job), ref)
    assert runs[-1][2] > 0, runs  # the idle path ran: the failed run had given the pool back

"""The whole-step kernel (``StepPlan`` in kernels/cpu/step_plan.cpp, ``StepKernel`` in
backends/cpu/step.py): one C++ call per training step must give exactly the bits of running the nodes
one by one (which test_backend_cpu.py checks against the spec), on every ISA build and thread
count, and refuse any node that would read or write outside its buffers."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.graph import Attention, Mixed, build
from tests.support.threads import THREAD_COUNTS, engaged
from verde_chain.examples import EXAMPLES
from verde_chain.graph.backend import make_runner
from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.structure import SourceKind
from verde_chain.graph.training import OptimizerSpec, TrainingProgram
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.step import PLAN_KINDS, SCRATCH, StepKernel, plain_copy
from verde_chain.repops.program import KernelDesc

STEPS = 3


def node_by_node(backend: CpuBackend):  # type: ignore[no-untyped-def]
    """The same backend without ``compile_step``: the executor then runs nodes one by one."""
    return lambda desc, ins: backend(desc, ins)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def run_steps(graph, init, batches, runner, steps: int = STEPS):  # type: ignore[no-untyped-def]
    """Every node output of steps 1..steps (plain steps, then one committed) and C_steps."""
    ex = StepExecutor(graph, runner)
    st = ex.initial_state(init)
    outs = []
    for s in range(1, steps):
        res = ex.run_plain(st, batches(s))
        outs.append(res.outputs)
        st = res.state
    last = ex.run_step(st, batches(steps))
    outs.append(last.outputs)
    return outs, last.commitment, ex


def assert_same_steps(a, b) -> None:  # type: ignore[no-untyped-def]
    (outs_a, c_a, _), (outs_b, c_b, _) = a, b
    assert c_a == c_b
    for s, (xa, xb) in enumerate(zip(outs_a, outs_b, strict=True)):
        for d, (u, v) in enumerate(zip(xa, xb, strict=True)):
            assert np.array_equal(bits(u), bits(v)), f"step {s + 1} node {d}"


# ----------------------------------------------------------------------------- small graphs


def _mlp() -> tuple[TrainingProgram, np.ndarray, np.ndarray]:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    rng = np.random.default_rng(2)
    return build(m, torch.zeros(6, 5), opt=OptimizerSpec("adam", lr=0.01)), rng.standard_normal((6, 5)), rng.integers(0, 3, 6)


def _mixed(fuse: bool):  # type: ignore[no-untyped-def]
    def make():  # type: ignore[no-untyped-def]
        torch.manual_seed(3)
        rng = np.random.default_rng(4)
        x = rng.standard_normal((5, 6))
        return build(Mixed(), torch.tensor(x, dtype=torch.float32), fuse=fuse), x, rng.integers(0, 4, 5)

    return make


def _attention():  # type: ignore[no-untyped-def]
    torch.manual_seed(5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 4))
    return build(Attention(), torch.tensor(x, dtype=torch.float32), "mse"), x, rng.standard_normal((2, 5, 3))


def _embedding():  # type: ignore[no-untyped-def]
    from verde_chain.graph.onnx_import import import_torch
    from verde_chain.graph.training import LossSpec, build_training_graph

    torch.manual_seed(7)
    tokens = np.array([[0, 3, 3, 5], [1, 3, 0, 0]], dtype=np.int64)
    model, _ = import_torch(nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6)), torch.tensor(tokens), ["x"])
    prog = build_training_graph(model, LossSpec("cross_entropy"), OptimizerSpec("sgd", lr=0.1, momentum=0.9))
    return prog, tokens, np.array([[3, 3, 5, 1], [3, 0, 0, 2]])


GRAPHS = {"mlp-adam": _mlp, "mixed-gelu": _mixed(True), "mixed-erf": _mixed(False), "attention": _attention,
          "embedding-momentum": _embedding}  # fmt: skip


@pytest.mark.parametrize("name", list(GRAPHS))
def test_small_graphs_fused_equal_node_by_node_and_the_reference(name: str) -> None:
    prog, x, y = GRAPHS[name]()
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)

    def batches(s: int) -> np.ndarray:  # a different batch each step (rolled samples)
        return prog.batch(s, {"x": np.roll(x, s, axis=0)}, np.roll(y, s, axis=0))

    backend = CpuBackend(threads=1)
    fused = run_steps(prog.graph, prog.initial_state(), batches, backend)
    assert isinstance(fused[2].step_kernel(), StepKernel)  # the whole-step path really ran
    assert_same_steps(fused, run_steps(prog.graph, prog.initial_state(), batches, node_by_node(backend)))
    assert fused[1] == run_steps(prog.graph, prog.initial_state(), batches, make_runner("reference"))[1]


# ----------------------------------------------------------------------------- the examples


@pytest.fixture(scope="module")
def transformer():  # type: ignore[no-untyped-def]
    return EXAMPLES["transformer"](steps=STEPS)


def test_transformer_every_kernel_kind_and_every_isa_and_thread_count(transformer) -> None:  # type: ignore[no-untyped-def]
    job = transformer
    graph = job.program.graph
    backend = CpuBackend(threads=1)
    kinds = {backend.path(n.desc) for n in graph.nodes}
    assert kinds == {"dot", "fold", "binary", "scatter", "rowdot", "jit", "program"}  # every node kind of the plan
    assert any(plain_copy(n.desc) for n in graph.nodes)  # transposes: the plan's permuting copy
    base = run_steps(graph, job.init_state, job.batch, node_by_node(backend))
    for isa in cpu_ext.available_isas():
        for threads in THREAD_COUNTS:
            fused = engaged(isa, threads, functools.partial(run_steps, graph, job.init_state, job.batch,
                                                            CpuBackend(isa=isa, threads=threads)))
            assert_same_steps(fused, base)


def test_digits_wide_parallel_maps_and_gemm_equal_one_thread() -> None:
    """Nodes big enough that the plan splits GEMMs, folds and compiled maps across threads: every
    thread count gives the 1-thread bits (and the nodes' one by one), more than one thread engaged."""
    job = EXAMPLES["digits"](steps=2, hidden=512, batch_size=256)
    graph = job.program.graph
    one = run_steps(graph, job.init_state, job.batch, CpuBackend(threads=1), steps=2)
    assert_same_steps(one, run_steps(graph, job.init_state, job.batch, node_by_node(CpuBackend(threads=1)), 2))
    isa = cpu_ext.best_isa()
    with_threads = torch.get_num_threads()
    try:
        for threads in THREAD_COUNTS[1:]:
            torch.set_num_threads(threads)
            assert_same_steps(one, engaged(isa, threads, functools.partial(
                run_steps, graph, job.init_state, job.batch, CpuBackend(isa=isa, threads=threads), steps=2)))
    finally:
        torch.set_num_threads(with_threads)


@pytest.mark.slow
def test_llama_h256_every_thread_count_equals_one_thread() -> None:
    """The language model at hidden 256 (bench_threads.py's job): batched GEMMs with one weight
    (one GEMM over every entry's rows in the plan), transposes as permuting copies."""
    from verde_chain.examples.lm import LMConfig, lm_job

    job = lm_job(LMConfig("llama", hidden=256), steps=2, checkpoint_interval=0)
    graph = job.program.graph
    isa = cpu_ext.best_isa()
    one = run_steps(graph, job.init_state, job.batch, CpuBackend(isa=isa, threads=1), steps=2)
    assert_same_steps(one, run_steps(graph, job.init_state, job.batch, node_by_node(CpuBackend(threads=1)), 2))
    for threads in THREAD_COUNTS[1:]:
        assert_same_steps(one, engaged(isa, threads, functools.partial(
            run_steps, graph, job.init_state, job.batch, CpuBackend(isa=isa, threads=threads), steps=2)))


# ----------------------------------------------------------------------------- the schedule

WRITABLE = (int(SourceKind.NODE_OUTPUT), SCRATCH)  # the buffers a plan node writes


def schedule_errors(levels: list[list[int]], io: list[list[tuple[int, int, int]]]) -> list[str]:
    """What is wrong with a plan's schedule (StepPlan.schedule()): every node must run exactly
    once, and after every earlier node it depends on (it reads what that one writes, or writes
    what that one reads or writes), in a later level: the nodes of one level run side by side."""
    errors = []
    level_of: dict[int, int] = {}
    for lv, nodes in enumerate(levels):
        for i in nodes:
            if i in level_of:
                errors.append(f"node {i} runs twice")
            level_of[i] = lv
    errors += [f"node {i} never runs" for i in range(len(io)) if i not in level_of]

    def hit(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
        return a[0] == b[0] and a[0] in WRITABLE and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]

    for j, (out_j, *ins_j) in enumerate(io):
        for i in range(j):
            out_i, *ins_i = io[i]
            if (hit(out_j, out_i) or any(hit(r, out_i) for r in ins_j) or any(hit(r, out_j) for r in ins_i)) \
                    and level_of.get(j, -1) <= level_of.get(i, -1):
                errors.append(f"node {j} (level {level_of.get(j)}) depends on node {i} (level {level_of.get(i)})")
    return errors


def _plan_of(job) -> object:  # type: ignore[no-untyped-def]
    ex = StepExecutor(job.program.graph, CpuBackend(threads=2))
    ex.run_plain(ex.initial_state(job.init_state), job.batch(1))
    kernel = ex.step_kernel()
    assert isinstance(kernel, StepKernel)
    return kernel._plan


@pytest.mark.parametrize("name,kw", [("transformer", {}), ("digits", {"hidden": 512, "batch_size": 256}),
                                     ("digits_cnn", {"batch_size": 16})])
def test_the_plan_runs_every_node_after_what_it_depends_on(name: str, kw: dict[str, int]) -> None:
    levels, io = _plan_of(EXAMPLES[name](steps=1, **kw)).schedule()  # type: ignore[attr-defined]
    assert schedule_errors(levels, io) == []
    # the schedule really runs nodes side by side: a level of several nodes
    assert max(len(nodes) for nodes in levels) > 1
    assert len(levels) < len(io)


def test_the_schedule_check_catches_a_node_run_before_its_input(transformer) -> None:  # type: ignore[no-untyped-def]
    """Each mutation of a real schedule that would change bits is caught: a node moved into the
    level of the node whose output it reads, a writer moved before a reader of the same place,
    a node dropped, a node run twice."""
    levels, io = _plan_of(transformer).schedule()  # type: ignore[attr-defined]
    assert schedule_errors(levels, io) == []

    def moved(node: int, to: int) -> list[list[int]]:
        out = [[i for i in nodes if i != node] for nodes in levels]
        out[to].append(node)
        return out

    level_of = {i: lv for lv, nodes in enumerate(levels) for i in nodes}

    def reads(j: int, i: int) -> bool:
        (buf, at, n), *_ = io[i]
        return any(r[0] == buf and r[1] < at + n and at < r[1] + r[2] for r in io[j][1:])

    reader = next(j for j in range(len(io)) if any(reads(j, i) for i in range(j)))
    writer = max((i for i in range(reader) if reads(reader, i)), key=lambda i: level_of[i])
    assert schedule_errors(moved(reader, level_of[writer]), io)  # side by side with its input's writer
    assert schedule_errors(moved(writer, level_of[reader]), io)  # its writer after it
    assert schedule_errors([[i for i in nodes if i != reader] for nodes in levels], io)
    assert schedule_errors([*levels, [reader]], io)


def _depends(io: list[list[tuple[int, int, int]]], j: int, i: int) -> bool:
    """Whether node j (after node i) must run after it: it reads what i writes, or writes what i
    reads or writes (schedule_errors' rule)."""
    def hit(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
        return a[0] == b[0] and a[0] in WRITABLE and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]

    (out_j, *ins_j), (out_i, *ins_i) = io[j], io[i]
    return hit(out_j, out_i) or any(hit(r, out_i) for r in ins_j) or any(hit(r, out_j) for r in ins_i)


def float_errors(levels: list[list[int]], io: list[list[tuple[int, int, int]]],
                 floating: list[tuple[int, int]]) -> list[str]:
    """What is wrong with a plan's floating nodes (StepPlan.floating_nodes(): (node, deadline)),
    which plain runs at two or more threads take out of their levels and run in the pool's idle
    time: a floating node must be done before any level-bound node that depends on it runs (its
    deadline is at most that node's level) and no later than a floating node that depends on it
    (its deadline is at most theirs), and it must be able to start before its deadline (every
    level-bound node it depends on is in an earlier level)."""
    level_of = {i: lv for lv, nodes in enumerate(levels) for i in nodes}
    deadline = dict(floating)
    errors = []
    for j in range(len(io)):
        for i in range(j):
            if not _depends(io, j, i):
                continue
            if i in deadline and j in deadline and deadline[i] > deadline[j]:
                errors.append(f"floating node {i} is due at {deadline[i]}, after floating node {j} that depends on it")
            elif i in deadline and j not in deadline and deadline[i] > level_of[j]:
                errors.append(f"floating node {i} is due at {deadline[i]}, after node {j} (level {level_of[j]})")
            elif j in deadline and i not in deadline and level_of[i] >= deadline[j]:
                errors.append(f"floating node {j} is due at {deadline[j]}, before node {i} (level {level_of[i]}) it needs")
    return errors


@pytest.mark.parametrize("name,kw", [("transformer", {}), ("digits_cnn", {"batch_size": 16})])
def test_floating_nodes_are_done_before_what_depends_on_them_and_can_start(name: str, kw: dict[str, int]) -> None:
    plan = _plan_of(EXAMPLES[name](steps=1, **kw))
    levels, io = plan.schedule()  # type: ignore[attr-defined]
    floating = [tuple(f) for f in plan.floating_nodes()]  # type: ignore[attr-defined]
    assert floating  # the optimizer's updates float
    assert float_errors(levels, io, floating) == []  # type: ignore[arg-type]


def test_the_float_check_catches_a_deadline_too_late_or_too_early(transformer) -> None:  # type: ignore[no-untyped-def]
    """A floating node due after a level-bound node that reads its output, or due before the
    level of a node whose output it reads, is caught."""
    plan = _plan_of(transformer)
    levels, io = plan.schedule()  # type: ignore[attr-defined]
    floating = [(int(i), int(d)) for i, d in plan.floating_nodes()]  # type: ignore[attr-defined]
    assert float_errors(levels, io, floating) == []
    level_of = {i: lv for lv, nodes in enumerate(levels) for i in nodes}
    deadline = dict(floating)
    late = next((i, j) for i, _ in floating for j in range(i + 1, len(io))
                if j not in deadline and _depends(io, j, i))
    early = next((j, i) for j, _ in floating for i in range(j) if i not in deadline and _depends(io, j, i))
    assert float_errors(levels, io, [(f, level_of[late[1]] + 1 if f == late[0] else d) for f, d in floating])
    assert float_errors(levels, io, [(f, level_of[early[1]] if f == early[0] else d) for f, d in floating])


def test_floating_nodes_run_on_a_worker_with_the_bits_of_their_levels(transformer) -> None:  # type: ignore[no-untyped-def]
    """Plain runs at 2, 3, 4 threads hand the floating nodes to pool workers (under the spread
    check at least one: the run waits for a worker to take the first), with the bits of every
    node run in its level and of one thread."""
    job = transformer
    graph = job.program.graph
    isa = cpu_ext.best_isa()
    one = run_steps(graph, job.init_state, job.batch, CpuBackend(isa=isa, threads=1))
    assert one[2].step_kernel().floated() == (0, 0)  # one thread: nothing floats
    for threads in (2, 3, 4):
        floated = engaged(isa, threads, functools.partial(run_steps, graph, job.init_state, job.batch,
                                                          CpuBackend(isa=isa, threads=threads)))
        kernel = floated[2].step_kernel()
        by_workers, total = kernel.floated()
        assert total == len(kernel.floating_nodes()) > 0 and by_workers >= 1, (threads, by_workers, total)
        assert_same_steps(floated, one)
        # the same plain step with every node in its level
        in_levels = StepExecutor(graph, CpuBackend(isa=isa, threads=threads))
        start = in_levels.initial_state(job.init_state)
        in_levels.run_plain(start, job.batch(1))
        in_levels.step_kernel().set_floating(False)
        res = in_levels.run_plain(start, job.batch(1))
        assert in_levels.step_kernel().floated() == (0, 0)
        for u, v in zip(res.outputs, one[0][0], strict=True):
            assert np.array_equal(bits(u), bits(v))


def test_the_state_carries_its_arena_and_a_replaced_state_does_not(transformer) -> None:  # type: ignore[no-untyped-def]
    job = transformer
    ex = StepExecutor(job.program.graph, CpuBackend(threads=1))
    st0 = ex.initial_state(job.init_state)
    res = ex.run_plain(st0, job.batch(1))
    assert res.state.arena is not None
    p = job.program.graph.states[0].producer
    assert np.shares_memory(res.state.tensors[p], res.state.arena)
    # a state rebuilt with another tensor (as the stale-state cheat does) must not run on the
    # old arena: replace() drops it, and the next step packs the tensors it really has
    stale = dataclasses.replace(res.state, tensors={**res.state.tensors, p: st0.tensors[p]})
    assert stale.arena is None
    a = ex.run_plain(stale, job.batch(2)).outputs
    b = StepExecutor(job.program.graph, node_by_node(CpuBackend(threads=1))).run_plain(stale, job.batch(2)).outputs
    assert all(np.array_equal(bits(u), bits(v)) for u, v in zip(a, b))
    # a tampered step runs node by node and has no arena
    tampered = ex.run_plain(st0, job.batch(1), tamper=lambda d, out: out)
    assert tampered.state.arena is None


# ----------------------------------------------------------------------------- convolutional networks

CNN_JOBS = {"digits_cnn": {"batch_size": 16}, "resnet18": {"batch_size": 4}}


@pytest.mark.parametrize("name", ["digits_cnn", pytest.param("resnet18", marks=pytest.mark.slow)])
def test_cnn_steps_in_one_call_equal_node_by_node_every_isa_and_thread_count(name: str) -> None:
    """Convolutions, their gradients, pooling and batch norm in the plan (windowed GEMM, permutes
    with conv's bias, max-pool backward's scatter form, pooling and batch-norm statistics
    compiled as chains over their inputs in place): the bits of the nodes one by one, on every
    ISA and thread count, with more than one thread engaged; with compiled maps off, the same
    bits through the plan's gathers into scratch (the dewindowed forms) at 2 threads."""
    job = EXAMPLES[name](steps=2, **CNN_JOBS[name])
    graph = job.program.graph
    base = run_steps(graph, job.init_state, job.batch, node_by_node(CpuBackend(threads=1)), steps=2)
    for isa in cpu_ext.available_isas():
        for threads in THREAD_COUNTS:
            fused = engaged(isa, threads, functools.partial(run_steps, graph, job.init_state, job.batch,
                                                            CpuBackend(isa=isa, threads=threads), steps=2))
            kernel = fused[2].step_kernel()
            assert isinstance(kernel, StepKernel)  # the whole-step path really ran
            assert kernel.window_forms["windowed jit"] and kernel.window_forms["gemm+permute"]
            assert kernel.window_forms["max-pool backward"]  # its scatter form, not the gathers
            # resnet18's convolutions have no bias: those with whole micro-tiles of pixels write
            # the output's order directly
            assert name != "resnet18" or kernel.window_forms["gemm, output order"]
            # weight gradients carry the momentum update: written in place, no permuting copy
            assert kernel.window_forms["gemm, epilogue in place"]
            assert_same_steps(fused, base)
        gathered = engaged(isa, 2, functools.partial(run_steps, graph, job.init_state, job.batch,
                                                     CpuBackend(isa=isa, threads=2, jit=False), steps=2))
        kernel = gathered[2].step_kernel()
        assert isinstance(kernel, StepKernel) and kernel.window_forms["dewindowed"]
        assert not kernel.window_forms["windowed jit"]
        assert_same_steps(gathered, base)


def _strided_cnn() -> tuple[TrainingProgram, np.ndarray, np.ndarray]:
    """Stride-2 convolutions on 16x16 and 8x8 maps (their grad inputs read dy through divisor-2
    windows in runs of 16 and 8 along a row) down to a 1x1 map whose 3x3 convolution's output
    (image, 1, channel, 1, 1) is put in order by a permute of size-1 axes."""
    torch.manual_seed(11)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 1, stride=2, bias=False), nn.ReLU(),
        nn.Conv2d(16, 24, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.Conv2d(24, 24, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.Conv2d(24, 32, 3, padding=1, bias=False), nn.Flatten(), nn.Linear(32, 5),
    )
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    return build(m, torch.from_numpy(x), opt=OptimizerSpec("sgd", lr=0.05, momentum=0.9)), x, rng.integers(0, 5, 3)


def _reference_steps(prog: TrainingProgram, x: np.ndarray, y: np.ndarray) -> tuple:  # type: ignore[type-arg]
    """(prog, its batches (step s: the batch rolled by s), the reference backend's steps)."""
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)

    def batches(s: int) -> np.ndarray:
        return prog.batch(s, {"x": np.roll(x, s, axis=0)}, np.roll(y, s, axis=0))

    return prog, batches, run_steps(prog.graph, prog.initial_state(), batches, make_runner("reference"))


def test_strided_grad_inputs_and_size_one_permutes_equal_the_reference_every_isa_and_thread_count() -> None:
    """The divisor-2 windows packed as runs (conv.cpp pack_steps_row_div: the counter proves it
    ran) and the permuting copy over merged axes (window_plan.cpp permute_into) give, over three
    steps with a committed one, every node output and C_s of the nodes one by one and of the
    reference backend, on every ISA and thread count."""
    prog, batches, ref = _reference_steps(*_strided_cnn())
    base = run_steps(prog.graph, prog.initial_state(), batches, node_by_node(CpuBackend(threads=1)))
    assert_same_steps(base, ref)
    for isa, threads, fused, packed in _plan_steps(prog, batches, "div_run_panels"):
        kernel = fused[2].step_kernel()
        assert isinstance(kernel, StepKernel)
        assert kernel.window_forms["gemm+permute"]
        # the divisor-2 runs were packed (where B's panels hold runs of 8: not scalar's 4)
        assert packed == (cpu_ext.extension(isa).info()["nr"] >= 8), (isa, threads)
        assert_same_steps(fused, ref)


def _plan_steps(prog: TrainingProgram, batches: list, counter: str) -> Iterator[tuple[str, int, list, bool]]:  # type: ignore[type-arg]
    """(isa, threads, the steps in one plan on engaged threads, whether the extension's
    ``counter`` grew meanwhile) for every ISA and thread count."""
    for isa in cpu_ext.available_isas():
        ext = cpu_ext.extension(isa)
        for threads in THREAD_COUNTS:
            before = getattr(ext, counter)()
            fused = engaged(isa, threads, functools.partial(run_steps, prog.graph, prog.initial_state(), batches,
                                                            CpuBackend(isa=isa, threads=threads)))
            yield isa, threads, fused, getattr(ext, counter)() > before


def _depthwise_cnn() -> tuple[TrainingProgram, np.ndarray, np.ndarray]:
    """mobilenet_v2's block in small: depthwise 3x3 convolutions (groups = channels) at stride 1
    and 2, with and without bias, between 1x1 convolutions, down to a 1x1 map."""
    torch.manual_seed(13)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 1, bias=False), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=(0, 1), groups=16, bias=False), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16, bias=False), nn.Flatten(), nn.Linear(16, 5),
    )
    rng = np.random.default_rng(14)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    return build(m, torch.from_numpy(x), opt=OptimizerSpec("sgd", lr=0.05, momentum=0.9)), x, rng.integers(0, 5, 4)


def test_depthwise_convolutions_in_the_plan_equal_the_reference_every_isa_and_thread_count() -> None:
    """Depthwise convolutions and their gradients in the plan (the windowed GEMM's one-row path:
    conv.cpp RowPlan, whose counter proves it ran) give, over three steps with a committed one,
    every node output and C_s of the reference backend, on every ISA and thread count."""
    prog, batches, ref = _reference_steps(*_depthwise_cnn())
    for isa, threads, fused, planned in _plan_steps(prog, batches, "row_plan_items"):
        assert isinstance(fused[2].step_kernel(), StepKernel)
        assert planned, (isa, threads)
        assert_same_steps(fused, ref)


@pytest.mark.parametrize("shape,strides", [
    ((4, 1, 6, 1, 1), (1, 99, 4, 7, 5)),  # a 1x1 map's (image, 1, channel, 1, 1) from (channel, image)
    ((3, 1, 5, 2, 2), (4, 0, 12, 2, 1)),  # (image, 1, channel, pixels) from (channel, image, pixels)
    ((2, 3, 4), (1, 2, 6)),  # a full transpose: nothing merges
    ((1, 1), (5, 3)),  # every axis of size 1: one element
    ((2, 3, 4), (12, 4, 1)),  # already in order: one line
])
def test_the_permuting_copy_over_merged_axes_equals_numpy(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """The plan's permuting copy (window_plan.cpp permute_into drops size-1 axes and merges axes
    the source steps evenly across) copies element (c_0, ...) from sum c_d * strides[d], as
    numpy's strided view of the source does. (These copies are one thread's work; the strided CNN
    test above runs permutes on several engaged threads.)"""
    from verde_chain.repops.backends.native import encode_maps
    from verde_chain.repops.program import InputMap

    n = int(np.prod(shape))
    src_numel = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    prev = torch.from_numpy(np.random.default_rng(3).standard_normal(max(src_numel, n)).astype(np.float32))
    want = np.lib.stride_tricks.as_strided(prev.numpy(), shape, [4 * s for s in strides]).reshape(-1)
    empty = torch.zeros((0, 5), dtype=torch.int64)
    plan = cpu_ext.extension(cpu_ext.best_isa()).StepPlan(n, prev.numel(), 1, *cpu_ext.DEFAULT_TILE, 0)
    plan.add_permute(torch.tensor([[int(SourceKind.PREV_STEP_NODE_OUTPUT), 0, src_numel]]),
                     torch.from_numpy(encode_maps([InputMap(src_numel, (0,) * len(shape))], len(shape))),
                     list(shape), 1, empty, empty, empty, 0, list(strides), *_NO_EPI_MAP)
    got = plan.run(prev, torch.zeros(1), 1).numpy()
    assert np.array_equal(bits(got), bits(want)), (shape, strides)


def test_conv_bias_as_a_compiled_map_after_the_permute_equals_the_interpreter() -> None:
    """digits_cnn's convolutions with bias run gemm+permute in the plan; the bias epilogue then
    runs as a compiled map in place (jit.epilogue_map) with the bits of the interpreter's, and so
    do the weight gradients' momentum updates over the GEMM's result in the node's output."""
    job = EXAMPLES["digits_cnn"](steps=2, **CNN_JOBS["digits_cnn"])
    graph = job.program.graph
    off = run_steps(graph, job.init_state, job.batch, CpuBackend(threads=2, jit_epilogues=False), steps=2)
    assert off[2].step_kernel().compiled_epilogues() == []
    # the interpreter runs the weight gradients' momentum in place too (r0 read from the output)
    assert off[2].step_kernel().window_forms["gemm, epilogue in place"]
    isa = cpu_ext.best_isa()
    on = engaged(isa, 2, functools.partial(run_steps, graph, job.init_state, job.batch,
                                           CpuBackend(isa=isa, threads=2), steps=2))
    kernel = on[2].step_kernel()
    kinds = kernel.profile().kinds
    assert "permute" in {kinds[i] for i in kernel.compiled_epilogues()}
    assert_same_steps(on, off)


def test_the_plan_profile_files_every_node_and_level() -> None:
    """StepKernel.profile (bench_threads.py --families): each plan node's kind, level and times,
    each level's wall; levels as the schedule runs them, every node and level timed in a run."""
    job = EXAMPLES["digits_cnn"](steps=1, **CNN_JOBS["digits_cnn"])
    ex = StepExecutor(job.program.graph, CpuBackend(threads=2))
    st = ex.initial_state(job.init_state)
    ex.run_plain(st, job.batch(1))
    kernel = ex.step_kernel()
    assert isinstance(kernel, StepKernel)
    prof = kernel.profile()
    levels, io = kernel._plan.schedule()  # type: ignore[attr-defined]
    assert len(prof.kinds) == len(io) == len(prof.owner) and len(prof.level_s) == len(levels)
    assert all(prof.level[i] == lv for lv, nodes in enumerate(levels) for i in nodes)
    assert {"window gemm", "pool backward", "permute", "jit"} <= set(prof.kinds)
    assert all(kind in PLAN_KINDS.values() for kind in prof.kinds)
    assert (prof.worth > 0).all()
    ex.run_plain(st, job.batch(1))
    assert prof.runs == 1 and (prof.node_s > 0).all() and (prof.level_s > 0).all()
    # the floating nodes ran out of their levels; every other node's time is inside its level's
    # (one level's nodes at most 2 threads' worth of it)
    assert np.flatnonzero(prof.floating).tolist() == [i for i, _ in kernel.floating_nodes()] != []
    assert prof.float_s > 0
    bound = ~prof.floating
    per_level = np.zeros(len(levels))
    np.add.at(per_level, prof.level[bound], prof.node_s[bound])
    assert (per_level <= 2 * prof.level_s + 1e-6).all()
    assert any(prof.side_by_side(lv, 2) for lv in range(len(levels)))


def test_a_dot_nodes_interpreter_epilogue_is_worth_its_own_work_only() -> None:
    """A GEMM node whose epilogue runs on the interpreter with r0 preset (no compiled map: the
    tiny Llama's attention scores, ``+ mask``) is worth its GEMM plus the epilogue's
    instructions, not the whole program's K-loop again: the plan's worth of every such node is
    numel * K / GEMM_MIN_FMAS + numel * len(epilogue) / PROGRAM_MIN_INSTRS (kernels.h). Counted
    with the K loop, the scores' 2,048 outputs were worth 12 threads and ran split, 2.4x slower
    than on one."""
    from verde_chain.examples.lm import LMConfig, lm_job

    job = lm_job(LMConfig("llama", hidden=256), steps=1, checkpoint_interval=0)
    ex = StepExecutor(job.program.graph, CpuBackend(threads=1))
    ex.run_plain(ex.initial_state(job.init_state), job.batch(1))
    kernel = ex.step_kernel()
    assert isinstance(kernel, StepKernel)
    prof, mapped = kernel.profile(), set(kernel.compiled_epilogues())
    checked = 0
    for i, kind in enumerate(prof.kinds):
        desc = job.program.graph.nodes[int(prof.owner[i])].desc
        if kind != "dot" or not desc.epilogue or i in mapped:
            continue
        want = desc.numel * desc.K / 2**18 + desc.numel * len(desc.epilogue) / 2**15
        assert prof.worth[i] == pytest.approx(want), (i, desc.label, desc.out_shape)
        checked += 1
    assert checked >= 2  # the two layers' attention scores at least


def test_digits_cnn_step_in_one_call_equals_the_reference() -> None:
    job = EXAMPLES["digits_cnn"](steps=1, batch_size=4)
    graph = job.program.graph
    fused = run_steps(graph, job.init_state, job.batch, CpuBackend(threads=2), steps=1)
    assert fused[1] == run_steps(graph, job.init_state, job.batch, make_runner("reference"), steps=1)[1]


# ----------------------------------------------------------------------------- bad plans


def _int64(rows) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1 if rows else 3)


# add_dot / add_fold / add_rowdot's last arguments when the epilogue is not a compiled map
_NO_EPI_MAP = (torch.zeros((0, 4), dtype=torch.int64), 0, 0)


def _rowdot_code() -> tuple:  # type: ignore[type-arg]
    """A (8,)-output reduce_dot node's program encodings (K = 2) and output offset 0."""
    from verde_chain.repops import library

    desc = library.reduce_dot((8, 2), (1,), keepdims=False)
    prep = CpuBackend(threads=1).prepare(desc)
    return (prep.maps, prep.out_shape, desc.K, *prep.programs, 0)


def test_plan_refuses_anything_outside_its_buffers() -> None:
    ext = cpu_ext.extension(cpu_ext.best_isa())
    plan = ext.StepPlan(64, 64, 16, *cpu_ext.DEFAULT_TILE)
    with pytest.raises(RuntimeError, match="leaves buffer"):
        plan.add_binary(_int64([(1, 60, 8), (1, 0, 8)]), 0, 8, 0)  # prev slice past the end
    with pytest.raises(RuntimeError, match="unknown buffer"):
        plan.add_binary(_int64([(4, 0, 8), (1, 0, 8)]), 0, 8, 0)  # 3 is the plan's scratch
    with pytest.raises(RuntimeError, match="leaves buffer 3 of 0"):
        plan.add_binary(_int64([(SCRATCH, 0, 8), (1, 0, 8)]), 0, 8, 0)  # this plan has no scratch
    with pytest.raises(RuntimeError, match="leaves the arena"):
        plan.add_binary(_int64([(1, 0, 8), (1, 8, 8)]), 60, 8, 0)
    with pytest.raises(RuntimeError, match="output's size"):
        plan.add_binary(_int64([(1, 0, 8), (2, 0, 4)]), 0, 8, 0)
    with pytest.raises(RuntimeError, match="null map"):
        plan.add_jit(_int64([(1, 0, 8)]), _int64([(0, 1, 1, 8)]), 0, 8, 0, 8)
    with pytest.raises(RuntimeError, match="map input addresses"):
        plan.add_jit(_int64([(1, 0, 8)]), _int64([(1, 1, 1, 8)]), 0, 8, 1234, 8)  # reads element 8 of 8
    with pytest.raises(RuntimeError, match="map input addresses"):  # rows of 2: a period of 5 rows of 8
        plan.add_jit(_int64([(1, 0, 8)]), _int64([(0, 2, 2, 5)]), 0, 10, 1234, 8)
    with pytest.raises(RuntimeError, match="q and p"):
        plan.add_jit(_int64([(1, 0, 8)]), _int64([(0, 1, 0, 8)]), 0, 8, 1234, 8)
    with pytest.raises(RuntimeError, match="rowdot A addresses"):  # 8 rows of 2 from element 1 of 16
        plan.add_rowdot(_int64([(1, 0, 16), (1, 0, 16)]), *_rowdot_code(), 0, 1, 2, 1, 1, 0, 2, 1, *_NO_EPI_MAP)
    # a 4x4 @ 4x4 dot whose B offset runs past its input
    from verde_chain.repops import library

    desc: KernelDesc = library.matmul((4, 4), (4, 4))
    backend = CpuBackend(threads=1)
    prep = backend.prepare(desc)
    code = (prep.maps, prep.out_shape, desc.K, *prep.programs, 0)
    offs = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="dot B addresses"):
        plan.add_dot(_int64([(1, 0, 16), (1, 16, 16)]), *code, 0, 1, 4, 4, offs, 4, 1, offs + 1, 4, 1, *_NO_EPI_MAP)
    with pytest.raises(RuntimeError, match="input 1 addresses|elements, map says"):
        plan.add_program(_int64([(1, 0, 16), (1, 16, 8)]), *code)  # B only 8 elements
    assert len(plan) == 0  # nothing half-added
    plan.add_binary(_int64([(1, 0, 8), (2, 0, 8)]), 0, 8, 2)
    with pytest.raises(RuntimeError, match="previous arena has 63 elements"):
        plan.run(torch.zeros(63), torch.zeros(16), 1)
    with pytest.raises(RuntimeError, match="batch must be a contiguous CPU float32"):
        plan.run(torch.zeros(64), torch.zeros(16, dtype=torch.float64), 1)
    prev, batch = torch.arange(64, dtype=torch.float32), torch.full((16,), 2.0)
    assert torch.equal(plan.run(prev, batch, 1)[:8], prev[:8] * 2.0)


def test_plan_refuses_window_nodes_outside_their_buffers() -> None:
    ext = cpu_ext.extension(cpu_ext.best_isa())
    plan = ext.StepPlan(64, 64, 16, *cpu_ext.DEFAULT_TILE, 32)
    rows, ks, wins = _int64([(0, 1, 2, 3)]), _int64([(0,), (4,)]), torch.zeros((0, 3), dtype=torch.int64)  # R 4, K 2
    with pytest.raises(RuntimeError, match="reads one input"):
        plan.add_window_gather(_int64([(1, 0, 8), (1, 0, 8)]), rows, ks, wins, 0, 2, SCRATCH, 0)
    with pytest.raises(RuntimeError, match="leaves the scratch of 32"):
        plan.add_window_gather(_int64([(1, 0, 8)]), rows, ks, wins, 0, 2, SCRATCH, 30)
    with pytest.raises(RuntimeError, match="outputs go to the arena or the scratch"):
        plan.add_window_gather(_int64([(1, 0, 8)]), rows, ks, wins, 0, 2, 1, 0)
    with pytest.raises(RuntimeError, match="mismatched shapes"):
        plan.add_window_gather(_int64([(1, 0, 8)]), rows, ks, wins, 0, 3, SCRATCH, 0)
    with pytest.raises(RuntimeError, match="tables have 4 / 4 rows, expected 2 / 4"):
        plan.add_window_gemm(_int64([(1, 0, 8), (1, 0, 8)]), rows, ks, wins, 0, rows, ks, wins, 0, 2, 1, 2, 2, 0, 0, [])
    with pytest.raises(RuntimeError, match="column split"):  # a 1 x 4 x 4 GEMM: no split fits
        plan.add_window_gemm(_int64([(1, 0, 8), (1, 0, 8)]), rows, ks, wins, 0, rows, ks, wins, 0, 1, 4, 4, 2, 0, 0,
                             [3, 0, 0])
    with pytest.raises(RuntimeError, match="permute source"):  # 2x4 read with strides (4, 1) from 7 elements
        plan.add_permute(_int64([(1, 0, 7)]), _int64([(0, 0, 0, 0, 0, 7)]), [2, 4], 1,
                         *(torch.zeros((0, 5), dtype=torch.int64),) * 3, 0, [4, 1], *_NO_EPI_MAP)
    assert len(plan) == 0
    plan.add_window_gather(_int64([(1, 0, 8)]), rows, ks, wins, 0, 2, SCRATCH, 0)
    prev = torch.arange(64, dtype=torch.float32)
    plan.run(prev, torch.zeros(16), 1)
    # the same tables over an input of 6 elements: element (3, 1) is address 7, checked per run
    plan.add_window_gather(_int64([(1, 0, 6)]), rows, ks, wins, 0, 2, SCRATCH, 8)
    with pytest.raises(RuntimeError, match="fell outside its input"):
        plan.run(prev, torch.zeros(16), 1)


# ----------------------------------------------------------------------------- scatter-add


def _scatter_case(P: int, row: tuple[int, ...], V: int, seed: int) -> tuple[KernelDesc, list[np.ndarray]]:
    """library.scatter_add with indices that hit, miss (out of range, negative, non-integral, NaN,
    -0 which matches row 0), repeat, and gradients full of ±0 / NaN / ±inf."""
    from verde_chain.repops import library
    from verde_chain.repops.edges import edge_array

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, V, P).astype(np.float32)
    odd = np.array([-0.0, -1.0, float(V), V + 3.0, 0.5, np.nan, np.inf], dtype=np.float32)
    pick = rng.random(P) < 0.3
    idx[pick] = rng.choice(odd, int(pick.sum()))
    g = edge_array((P, *row), seed + 1, frac=0.4)
    zeros = rng.random(g.shape) < 0.2  # many signed zeros: the -0 / +0 rule of the chain
    g[zeros] = np.where(rng.random(int(zeros.sum())) < 0.5, np.float32(-0.0), np.float32(0.0))
    flat = g.reshape(P, -1)
    flat[:, 0] = -0.0  # a column of -0 stays -0 until a miss adds +0: the rule the kernel must keep
    if P > 2:
        idx[-1] = idx[0] = 0.0  # row 0 matched first and last (no trailing miss) ...
        idx[1] = -1.0  # ... with a miss between
    return library.scatter_add(P, row, V), [g.reshape(-1), idx]


@pytest.mark.parametrize("P,row,V", [(1, (3,), 4), (2, (1,), 1), (7, (5,), 3), (40, (33,), 6), (128, (4, 8), 38), (300, (17,), 50)])
def test_scatter_add_kernel_equals_the_reference(P: int, row: tuple[int, ...], V: int) -> None:
    from verde_chain.repops import reference

    for seed in range(3):
        desc, ins = _scatter_case(P, row, V, 10 * seed + P)
        expected = bits(reference.run(desc, ins))
        for isa in cpu_ext.available_isas():
            backend = CpuBackend(isa=isa, threads=2)
            assert backend.path(desc) == "scatter"
            assert np.array_equal(bits(backend(desc, ins)), expected), (isa, seed)


def test_scatter_add_in_the_step_plan_equals_the_interpreter(transformer) -> None:  # type: ignore[no-untyped-def]
    """The transformer's embedding backward runs on the scatter kernel in the whole-step plan and
    gives the interpreter's bits (the same graph with the scatter plan turned off)."""
    import verde_chain.repops.backends.plan as bc

    job = transformer
    graph = job.program.graph
    scatter_nodes = [n for n in graph.nodes if CpuBackend(threads=1).path(n.desc) == "scatter"]
    assert scatter_nodes, "the transformer has an embedding backward"
    fused = run_steps(graph, job.init_state, job.batch, CpuBackend(threads=1))
    orig = bc._is_scatter_add
    bc._is_scatter_add = lambda desc: False
    try:
        interpreted_backend = CpuBackend(threads=1, jit=False)  # the interpreter itself, not a compiled chain
        assert interpreted_backend.path(scatter_nodes[0].desc) == "program"
        assert_same_steps(fused, run_steps(graph, job.init_state, job.batch, interpreted_backend))
    finally:
        bc._is_scatter_add = orig


def test_a_scatter_lookalike_with_other_maps_stays_on_the_interpreter() -> None:
    """Only library.scatter_add's exact program and maps take the kernel."""
    import dataclasses as dc

    from verde_chain.repops import reference

    desc, ins = _scatter_case(9, (4,), 5, 3)
    shifted = dc.replace(desc, inputs=(dc.replace(desc.inputs[0], offset=0), dc.replace(desc.inputs[1], numel=10)))
    other_body = dc.replace(desc, body=desc.body[:-1] + (dc.replace(desc.body[-1], b=5),))
    # not the scatter kernel: the interpreter, or with compiled maps on, the program compiled as a chain
    for lookalike in (shifted, other_body):
        assert CpuBackend(threads=1, jit=False).path(lookalike) == "program"
        assert CpuBackend(threads=1, jit_min_instrs=1).path(lookalike) == "jit"
    ins2 = [ins[0], np.concatenate([ins[1], np.zeros(1, np.float32)])]
    for be in (CpuBackend(threads=1, jit=False), CpuBackend(threads=1, jit_min_instrs=1)):
        assert np.array_equal(bits(be(shifted, ins2)), bits(reference.run(shifted, ins2)))

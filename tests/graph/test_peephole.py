"""graph/peephole.py: summed slice gradients become one node, an ADD of a single-use dot output
moves into the dot's epilogue, a convolution's weight gradient carries the optimizer's state
update in its epilogue. No value may change: three AdamW steps of the language models and three
SGD steps of the CNNs end on the same loss and state bits with the rewrites on and off (C++ and
reference backends), and small hand-built graphs with -0, NaN, overlapping and stepped slices
give the same bits; each test also checks that the rewrite fired (fewer nodes)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from verde_chain.examples import EXAMPLES
from verde_chain.examples.lm import ARCHS, LMConfig, hf_model, lm_job
from verde_chain.examples.vision import vision_job
from verde_chain.graph.backend import make_runner
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.executor import StepExecutor
from verde_chain.graph.onnx_import import export_torch, import_onnx
from verde_chain.graph.peephole import MAX_LEAVES, peephole
from verde_chain.graph.structure import SourceKind, TrainingGraph
from verde_chain.graph.training import LossSpec, OptimizerSpec, TrainingProgram, build_training_graph
from verde_chain.job import Job
from verde_chain.repops import library
from verde_chain.repops.backends.plan import classify
from verde_chain.vm import scalarvm as vm

BACKENDS = ("cpu", "reference")


def _state_bits(job: Job, on: bool, backend: str) -> tuple[list[bytes], dict[str, bytes], int]:
    """Loss bits of three steps and the final state's bits (parameters, Adam m and v, momenta)
    of ``job``'s model with the rewrites on or off."""
    return _steps(job.program, job.init_state, job.batch, on, backend)


def _steps(p: TrainingProgram, init: dict[str, np.ndarray], batch: Callable[[int], np.ndarray], on: bool,
           backend: str) -> tuple[list[bytes], dict[str, bytes], int]:
    assert p.loss is not None and p.optimizer is not None
    graph = build_training_graph(p.model, p.loss, p.optimizer, peephole=on).graph
    ex = StepExecutor(graph, make_runner(backend))
    st = ex.initial_state(init)
    losses = []
    for s in range(1, 4):
        res = ex.run_plain(st, batch(s))  # the batch layout does not depend on the rewrite
        losses.append(res.outputs[graph.named["loss"]].tobytes())
        st = res.state
    return losses, {slot.name: st.tensors[slot.producer].tobytes() for slot in graph.states}, len(graph.nodes)


def _lm(arch: str) -> Job:
    cfg = LMConfig(arch)
    return lm_job(cfg, steps=3, lr=1e-2, model=hf_model(cfg, seed=3))


JOBS: dict[str, Callable[[], Job]] = {
    **{arch: functools.partial(_lm, arch) for arch in ARCHS},
    # the golden transformer (tests/test_golden.py): its graph changes, its values must not
    "transformer": functools.partial(EXAMPLES["transformer"], steps=3),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(JOBS))
def test_training_is_bit_identical_with_and_without_peephole(name: str, backend: str) -> None:
    job = JOBS[name]()
    loss_on, state_on, n_on = _state_bits(job, True, backend)
    loss_off, state_off, n_off = _state_bits(job, False, backend)
    assert n_on < n_off  # the rewrite fired
    assert loss_on == loss_off
    assert state_on.keys() == state_off.keys() and all(state_on[k] == state_off[k] for k in state_on)
    assert len(set(loss_on)) == 3  # the steps really trained


# ----------------------------------------------------------------------- hand-built graphs

F32 = np.float32


def _specials(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random values with -0, +0, NaN (two payloads) and infinities sprinkled in."""
    x = rng.standard_normal(shape).astype(F32).reshape(-1)
    pool = np.array([-0.0, 0.0, np.inf, -np.inf], dtype=F32).view(np.uint32).tolist() + [0x7FC00000, 0x7FA00001]
    pick = rng.random(x.size) < 0.3
    x.view(np.uint32)[pick] = rng.choice(np.array(pool, dtype=np.uint32), int(pick.sum()))
    return x.reshape(shape)


def _run(graph: TrainingGraph, fields: dict[str, np.ndarray], backend: str) -> bytes:
    ex = StepExecutor(graph, make_runner(backend))
    res = ex.run_plain(ex.initial_state({}), graph.pack_batch(fields))
    return res.outputs[graph.named["out"]].tobytes()


def _check(build: Callable[[GraphBuilder], tuple[Ref, dict[str, tuple[int, ...]]]], seed: int = 0
           ) -> tuple[TrainingGraph, TrainingGraph]:
    """Build a graph (batch fields -> named ``out``), rewrite it, compare the output bits on both
    backends; returns (plain, rewritten)."""
    b = GraphBuilder()
    out, shapes = build(b)
    plain = b.finish({}, {"out": out})
    fused = peephole(plain)
    rng = np.random.default_rng(seed)
    fields = {n: _specials(rng, s) for n, s in shapes.items()}
    for backend in BACKENDS:
        assert _run(fused, fields, backend) == _run(plain, fields, backend), backend
    return plain, fused


SHAPE = (2, 3, 12)
# (starts, ends, steps): overlapping ranges, steps, a negative step, a slice on two axes
SLICES = [((0, 0, 0), (2, 3, 8), (1, 1, 1)), ((0, 0, 4), (2, 3, 12), (1, 1, 1)), ((0, 0, 1), (2, 3, 12), (1, 1, 3)),
          ((0, 1, 11), (2, 3, -13), (1, 1, -2)), ((1, 0, 2), (2, 3, 12), (1, 2, 5))]


def _slice_shape(starts: tuple[int, ...], ends: tuple[int, ...], steps: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(len(range(*slice(a, e, s).indices(n))) for a, e, s, n in zip(starts, ends, steps, SHAPE))


def _sum_of_slice_grads(b: GraphBuilder, n: int, extra: bool = False) -> tuple[Ref, dict[str, tuple[int, ...]]]:
    """add(...add(add(sg_0, sg_1), sg_2)..., sg_{n-1}) (autodiff's arrival order), plus a plain
    operand after the first two when ``extra``."""
    names = {f"g{i}": _slice_shape(*SLICES[i % len(SLICES)]) for i in range(n)}
    if extra:
        names["x"] = SHAPE
    refs = {k: b.batch_field(k, s) for k, s in names.items()}
    acc: Ref | None = None
    for i in range(n):
        g = b.unpack(refs[f"g{i}"])
        sg = b.node(library.slice_grad(SHAPE, *SLICES[i % len(SLICES)]), g, label="slice_grad")
        acc = sg if acc is None else b.binary("add", acc, sg)
        if extra and i == 1:
            acc = b.binary("add", acc, b.unpack(refs["x"]))
    assert acc is not None
    return acc, names


@pytest.mark.parametrize("n", [2, 3, 5])
def test_summed_slice_grads_are_one_node_with_the_same_bits(n: int) -> None:
    plain, fused = _check(lambda b: _sum_of_slice_grads(b, n))
    labels = [nd.label for nd in fused.nodes]
    assert labels.count("slice_grad_sum") == 1 and "slice_grad" not in labels and "add" not in labels
    assert len(fused.nodes) == len(plain.nodes) - 2 * (n - 1)
    assert classify(fused.nodes[fused.named["out"]].desc).kind == "program"


def test_a_plain_operand_in_the_chain_is_loaded() -> None:
    plain, fused = _check(lambda b: _sum_of_slice_grads(b, 3, extra=True), seed=1)
    assert len(fused.nodes) == len(plain.nodes) - 5  # 3 slice_grads + 2 inner ADDs
    assert [nd.label for nd in fused.nodes].count("slice_grad_sum") == 1


def test_long_chains_are_cut_into_nodes_of_at_most_max_leaves() -> None:
    n = 2 * MAX_LEAVES + 1
    plain, fused = _check(lambda b: _sum_of_slice_grads(b, n), seed=2)
    sums = [nd for nd in fused.nodes if nd.label == "slice_grad_sum"]
    assert len(sums) == 3 and len(fused.nodes) == len(plain.nodes) - 2 * (n - 1) + 2
    assert all(len(nd.desc.inputs) <= MAX_LEAVES for nd in sums)


def test_a_slice_grad_read_twice_stays() -> None:
    def build(b: GraphBuilder) -> tuple[Ref, dict[str, tuple[int, ...]]]:
        g = b.unpack(b.batch_field("g", _slice_shape(*SLICES[0])))
        sg = b.node(library.slice_grad(SHAPE, *SLICES[0]), g, label="slice_grad")
        return b.binary("add", b.binary("add", sg, sg), sg), {"g": _slice_shape(*SLICES[0])}
    plain, fused = _check(build)
    assert len(fused.nodes) == len(plain.nodes)


def _fields(b: GraphBuilder, spec: dict[str, tuple[int, ...]]) -> list[Ref]:
    refs = [b.batch_field(k, v) for k, v in spec.items()]  # every field before the first unpack
    return [b.unpack(r) for r in refs]


def _dot_plus(b: GraphBuilder, a: tuple[int, ...], w: tuple[int, ...], x: tuple[int, ...], dot_first: bool,
              trans_b: bool = False) -> tuple[Ref, dict[str, tuple[int, ...]]]:
    fa, fw, fx = _fields(b, {"a": a, "w": w, "x": x})
    mm = b.node(library.matmul(a, w, trans_b=trans_b), fa, fw, label="matmul")
    out = b.binary("add", mm, fx) if dot_first else b.binary("add", fx, mm)
    return out, {"a": a, "w": w, "x": x}


@pytest.mark.parametrize("dot_first", [True, False])
def test_add_of_a_matmul_is_a_gemm_with_the_same_bits(dot_first: bool) -> None:
    plain, fused = _check(lambda b: _dot_plus(b, (5, 7), (4, 7), (5, 4), dot_first, trans_b=True), seed=3)
    assert len(fused.nodes) == len(plain.nodes) - 1
    got = fused.nodes[fused.named["out"]].desc
    want = library.gemm((5, 7), (4, 7), (5, 4), trans_b=True)
    assert got == want  # exactly library.gemm's descriptor (the label is not part of it)
    assert classify(got).kind == "dot"


def test_batched_matmul_plus_a_broadcast_constant_keeps_the_gemm_kernel() -> None:
    plain, fused = _check(lambda b: _dot_plus(b, (2, 3, 6, 5), (2, 3, 5, 6), (1, 1, 6, 6), True), seed=4)
    assert len(fused.nodes) == len(plain.nodes) - 1
    assert classify(fused.nodes[fused.named["out"]].desc).kind == "dot"


def test_gemm_plus_a_residual_in_another_view() -> None:
    def build(b: GraphBuilder) -> tuple[Ref, dict[str, tuple[int, ...]]]:
        fa, fw, fc, fr = _fields(b, {"a": (6, 4), "w": (4, 5), "c": (5,), "r": (2, 3, 5)})
        g = b.node(library.gemm((6, 4), (4, 5), (5,)), fa, fw, fc, label="gemm")
        return b.binary("add", fr, b.view(g, (2, 3, 5))), {"a": (6, 4), "w": (4, 5), "c": (5,), "r": (2, 3, 5)}
    plain, fused = _check(build, seed=5)
    assert len(fused.nodes) == len(plain.nodes) - 1
    assert classify(fused.nodes[fused.named["out"]].desc).kind == "dot"


def test_a_matmul_read_twice_stays() -> None:
    def build(b: GraphBuilder) -> tuple[Ref, dict[str, tuple[int, ...]]]:
        fa, fw = _fields(b, {"a": (5, 7), "w": (7, 4)})
        mm = b.node(library.matmul((5, 7), (7, 4)), fa, fw, label="matmul")
        return b.binary("add", mm, mm), {"a": (5, 7), "w": (7, 4)}
    plain, fused = _check(build, seed=6)
    assert len(fused.nodes) == len(plain.nodes)


def test_shard_blocks_are_renumbered_and_stay_closed() -> None:
    """S = 2: each shard's block still reads only the state, the batch and its own nodes, and the
    step gives the same bits with the rewrites on and off."""
    job = _lm("gpt2")
    p = job.program
    assert p.loss is not None and p.optimizer is not None
    n = 2 * job.spec.batch_size  # the model's batch is one shard's
    x, y = job.dataset.X[:n], job.dataset.Y[:n]
    out = {}
    for on in (True, False):
        prog = build_training_graph(p.model, p.loss, p.optimizer, shards=2, peephole=on)
        g = prog.graph
        for lo, hi in g.shard_blocks:
            assert all(lo <= s.index < hi for n in g.nodes[lo:hi] for s in n.inputs if s.kind == 0)
        ex = StepExecutor(g, make_runner("cpu"))
        res = ex.run_plain(ex.initial_state(prog.initial_state()), prog.batch(1, {"input_ids": x}, y))
        out[on] = (len(g.nodes), res.outputs[g.named["loss"]].tobytes(),
                   [res.state.tensors[s.producer].tobytes() for s in g.states])
    assert out[True][0] < out[False][0] and out[True][1:] == out[False][1:]


@pytest.mark.parametrize("which", ["slice_grad_sum", "gemm"])
def test_the_scalarvm_twin_runs_a_fused_node(which: str) -> None:
    """A fused node is an ordinary descriptor: the on-chain VM's twin, instruction by
    instruction, ends on the backend's bits (elements 0, one in the middle, the last)."""
    def build(b: GraphBuilder) -> tuple[Ref, dict[str, tuple[int, ...]]]:
        return _sum_of_slice_grads(b, 3) if which == "slice_grad_sum" else _dot_plus(b, (5, 7), (7, 4), (5, 4), False)
    b = GraphBuilder()
    out, shapes = build(b)
    g = peephole(b.finish({}, {"out": out}))
    rng = np.random.default_rng(7)
    batch = g.pack_batch({n: _specials(rng, s) for n, s in shapes.items()})
    ex = StepExecutor(g, make_runner("cpu"))
    st = ex.initial_state({})
    res = ex.run_plain(st, batch)
    d = g.named["out"]
    assert g.nodes[d].label.startswith(which) or g.nodes[d].desc == library.gemm((5, 7), (7, 4), (5, 4))
    ins = ex.node_inputs(d, st, res.outputs, batch)
    want = res.outputs[d].view(np.uint32)
    for e in (0, want.size // 2, want.size - 1):
        assert vm.run_states(g.nodes[d].desc, ins, e)[-1].regs[0] == int(want[e])


# --------------------------------------------- a state update in a convolution's weight gradient


class _Convs(nn.Module):
    """Plain, grouped + strided + dilated, 1x1 without bias, and depthwise convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 4, 3, stride=2, padding=(1, 2), dilation=(1, 2), groups=2)
        self.c3 = nn.Conv2d(4, 6, 1, bias=False)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.fc = nn.Linear(6 * 4 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.c1(x)))
        h = self.dw(torch.relu(self.c3(self.c2(h))))
        return self.fc(torch.flatten(h, 1))


CONV_WEIGHTS = 4
OPTIMIZERS = {  # name -> (spec, how many conv weight gradients take their update)
    "momentum": (OptimizerSpec("sgd", lr=0.1, momentum=0.9), CONV_WEIGHTS),
    "momentum + weight decay": (OptimizerSpec("sgd", lr=0.1, momentum=0.9, weight_decay=1e-2), CONV_WEIGHTS),
    # no momentum: the parameter update itself is the gradient's one reader
    "plain sgd": (OptimizerSpec("sgd", lr=0.1), CONV_WEIGHTS),
    # Nesterov's parameter update reads the gradient too: two readers, nothing fused
    "nesterov": (OptimizerSpec("sgd", lr=0.1, momentum=0.9, nesterov=True), 0),
}


def _conv_program(opt: OptimizerSpec) -> tuple[TrainingProgram, Callable[[int], np.ndarray]]:
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((4, 3, 2, 7, 6)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 5, (4, 3)).astype(np.float32)
    model = import_onnx(export_torch(_Convs(), torch.tensor(x[0]), ["x"], training=True))
    prog = build_training_graph(model, LossSpec("cross_entropy"), opt)
    return prog, lambda s: prog.batch(s, {"x": _specials_if(s, x[s])}, y[s])


def _specials_if(step: int, x: np.ndarray) -> np.ndarray:
    """Step 3's images with -0, infinities and NaNs: the update must carry them as the
    unfused nodes do."""
    return _specials(np.random.default_rng(step), x.shape) if step == 3 else x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_a_convolution_weight_gradient_carries_the_state_update(opt: str, backend: str) -> None:
    spec, fused = OPTIMIZERS[opt]
    prog, batch = _conv_program(spec)
    init = prog.initial_state()
    loss_on, state_on, n_on = _steps(prog, init, batch, True, backend)
    loss_off, state_off, n_off = _steps(prog, init, batch, False, backend)
    assert n_off - n_on == fused
    g = prog.graph
    labels = [n.label for n in g.nodes if "+" in n.label]
    assert len(labels) == fused and all(lb.startswith("conv_grad_weight+sgd_") for lb in labels)
    if fused:  # the fused gradients are no longer tensors of the step, nor named
        assert sum(k.startswith("grad:") for k in g.named) == len(prog.model.params()) - CONV_WEIGHTS
    assert loss_on == loss_off
    assert state_on.keys() == state_off.keys() and all(state_on[k] == state_off[k] for k in state_on), \
        [k for k in state_on if state_on[k] != state_off[k]]
    assert len(set(loss_on[:2])) == 2  # the steps really trained


def test_the_fused_update_runs_in_the_windowed_gemm_epilogue_compiled() -> None:
    """On the C++ backend's whole-step plan each fused node is a windowed GEMM whose epilogue
    (the update) is a compiled map, not the interpreter."""
    prog, batch = _conv_program(OPTIMIZERS["momentum"][0])
    kernels = {}
    for on in (True, False):
        g = build_training_graph(prog.model, prog.loss, prog.optimizer, peephole=on).graph
        ex = StepExecutor(g, make_runner("cpu"))
        ex.run_plain(ex.initial_state(prog.initial_state()), batch(1))
        kernels[on] = ex.step_kernel()
    on, off = kernels[True], kernels[False]
    assert on is not None and off is not None
    assert len(on.compiled_epilogues()) - len(off.compiled_epilogues()) == CONV_WEIGHTS
    # the gradient is already in the weight's order: the GEMM writes the node's output and the
    # update runs over it in place (no copy through the scratch)
    in_place = "gemm, epilogue in place"
    assert on.window_forms[in_place] - off.window_forms[in_place] == CONV_WEIGHTS
    assert sum(on.window_forms.values()) == sum(off.window_forms.values())


@pytest.mark.parametrize("name", ["digits_cnn", "resnet18", "mobilenet_v2"])
def test_cnn_jobs_train_bit_identically_with_the_updates_fused(name: str) -> None:
    job = vision_job(name, steps=3, batch_size=2, samples=8)
    loss_on, state_on, n_on = _state_bits(job, True, "cpu")
    loss_off, state_off, n_off = _state_bits(job, False, "cpu")
    convs = sum(1 for n in build_training_graph(job.program.model, job.program.loss, job.program.optimizer,
                                                 peephole=False).graph.nodes if n.label == "conv_grad_weight")
    assert n_off - n_on == convs > 0  # every convolution's weight gradient took its update
    assert loss_on == loss_off
    assert all(state_on[k] == state_off[k] for k in state_on)


def test_the_scalarvm_twin_runs_a_fused_weight_gradient() -> None:
    """The fused node is an ordinary descriptor: the on-chain VM's twin ends on the backend's
    bits at its first, middle and last element (the chain, then the update's instructions)."""
    prog, batch = _conv_program(OPTIMIZERS["momentum + weight decay"][0])
    g = prog.graph
    ex = StepExecutor(g, make_runner("cpu"))
    st = ex.run_plain(ex.initial_state(prog.initial_state()), batch(1)).state  # momenta not zero
    data = batch(2)
    res = ex.run_plain(st, data)
    d = next(n.index for n in g.nodes if n.label == "conv_grad_weight+sgd_buf" and n.desc.K > 1)
    ins = ex.node_inputs(d, st, res.outputs, data)
    assert [s.kind for s in g.nodes[d].inputs[-2:]] == [SourceKind.PREV_STEP_NODE_OUTPUT] * 2  # p, buf
    want = res.outputs[d].view(np.uint32)
    for e in (0, want.size // 2, want.size - 1):
        assert vm.run_states(g.nodes[d].desc, ins, e)[-1].regs[0] == int(want[e])

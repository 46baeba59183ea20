"""Fewer full-size cross-entropy nodes, the same bits: ``GraphBuilder.node`` builds a node equal to
an earlier one (descriptor and storages read) once (the CE backward's max, sub_exp and sum of the
scores are the forward's), and the training CE's ``nll`` node reads the scores, m and log(s)
instead of a log_softmax node (``losses.NLL_FROM_SCORES``). Both switched off, the builder gives
the graph as it was before (but the backward's count of the positions an ignore index keeps,
now built with the forward's ``ce_weight`` program); every loss and final parameter must be the
same bits either way, and the same as the code before the rewrites computed (``BEFORE``)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import verde_chain.graph.builder as graph_builder
from verde_chain.examples.digits import digits_job
from verde_chain.examples.lm import LMConfig, hf_model, lm_job
from verde_chain.graph.backend import make_runner
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import GraphError
from verde_chain.graph.executor import PlainState, StepExecutor
from verde_chain.graph.structure import SourceKind
from verde_chain.job import Job
from verde_chain.repops import library, reference
from verde_chain.repops.isa import Op
from verde_chain.repops.library import I, const, losses

STEPS = 3
BACKENDS = ("cpu", "reference")


@contextmanager
def rewrites(on: bool) -> Iterator[None]:
    """Build with both rewrites on (today's graphs) or off (the graphs before them)."""
    saved = graph_builder.CSE, losses.NLL_FROM_SCORES
    graph_builder.CSE = losses.NLL_FROM_SCORES = on
    try:
        yield
    finally:
        graph_builder.CSE, losses.NLL_FROM_SCORES = saved


def _make(name: str) -> Any:
    """A job factory: the digits MLP (SGD with momentum) or a tiny language model (AdamW)."""
    if name == "digits":
        return lambda: digits_job(steps=STEPS, batch_size=16, checkpoint_interval=0)
    cfg = LMConfig(name)
    model = hf_model(cfg, seed=1)  # one model for both builds
    return lambda: lm_job(cfg, steps=STEPS, model=model, checkpoint_interval=0)


def _train(job: Job, backend: str) -> tuple[list[bytes], dict[str, bytes]]:
    """The loss of every step and every final state tensor, as raw bits."""
    g = job.program.graph
    runner = make_runner(backend)
    assert backend == "reference" or runner is not reference.run  # the C++ backend, not its fallback
    ex = StepExecutor(g, runner)
    st: PlainState = ex.initial_state(job.init_state)
    losses_ = []
    for s in range(1, STEPS + 1):
        res = ex.run_plain(st, job.batch(s))
        losses_.append(res.outputs[g.named["loss"]].tobytes())
        st = res.state
    return losses_, {sl.name: st.tensors[sl.producer].tobytes() for sl in g.states}


@pytest.mark.parametrize("name", ["digits", "gpt2", "llama", "bert"])
def test_fewer_ce_nodes_and_every_bit_the_same(name: str) -> None:
    make = _make(name)
    with rewrites(False):
        before = make()
    with rewrites(True):
        after = make()
    gb, ga = before.program.graph, after.program.graph
    # CSE: the backward's reduce_max, sub_exp and reduce_sum of the scores (and with an ignore
    # index its count of the positions kept: the forward's weights and their sum); no log_softmax
    merged = ["ce_bwd/reduce_max", "ce_bwd/sub_exp", "ce_bwd/reduce_sum", "ce/log_softmax"]
    if after.spec.loss.ignore_index is not None:
        merged += ["ce_bwd/ce_weight", "ce_bwd/reduce_sum"]
    gone = Counter(n.label for n in gb.nodes) - Counter(n.label for n in ga.nodes)
    assert gone == Counter(merged) and len(ga.nodes) == len(gb.nodes) - len(merged)
    ce_bwd = next(n for n in ga.nodes if n.label == "ce_bwd/ce_bwd")
    assert ga.nodes[ce_bwd.inputs[0].index].label == "ce/sub_exp"  # the forward's exp terms, read twice
    runs = {(on, be): _train(job, be) for on, job in ((False, before), (True, after)) for be in BACKENDS}
    first = runs[(False, "cpu")]
    assert len(set(first[0])) == STEPS  # it trained
    for key, got in runs.items():
        assert got == first, key


# sha256 of the 3 losses and the final state (by name) computed by the code before both rewrites
# (1e46d04, C++ backend; before the peephole pass too, which keeps every bit): digits 31 nodes,
# gpt2 291, llama 388, bert 376
BEFORE = {
    "digits": "a3d0c0651e686d0426e58ef36cf1bb440364cda24e2d73b973a8a5e67b0f0b8e",
    "gpt2": "1bdabd15974b1448719191359bc8df296eb119c07585d194d2ba51a13e5405b5",
    "llama": "6172be44a08aa25430647b2baf4bb14ff5172fa28c100f4de1d4387a084fff24",
    "bert": "d4426a2c5029058b253c76e68d5100be294d90db389ec869abf38d04c3803c04",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(BEFORE))
def test_every_bit_as_the_code_before_computed_it(name: str, backend: str) -> None:
    """Against values stored from the code before the rewrites (not only with them switched
    off): the backward's count of kept positions is the forward's ce_weight node now, not a node
    of its own, which no switch restores."""
    losses_, state = _train(_make(name)(), backend)
    h = hashlib.sha256(b"".join(losses_))
    for k in sorted(state):
        h.update(k.encode() + state[k])
    assert h.hexdigest() == BEFORE[name]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("shape", "reduction", "weights", "ignore"), [
    ((6, 5), "mean", False, None),
    ((6, 5), "mean", True, None),
    ((3, 5, 4), "mean", False, 2),
    ((3, 5, 4), "sum", True, 1),
    ((3, 5, 4), "none", True, 2),
    ((6, 5), "mean", True, 3),
])
def test_softmax_cross_entropy_outputs_are_the_same_bits(
    shape: tuple[int, ...], reduction: str, weights: bool, ignore: int | None, backend: str
) -> None:
    """The ONNX composite (loss and log_prob) with the nll node reading the scores or the
    log_softmax node: the same bits, for every reduction, with weights and an ignore index."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    lab = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.float32)
    ins = [x, lab] + ([rng.random(shape[1]).astype(np.float32)] if weights else [])
    outs = {}
    for on in (False, True):
        with rewrites(on):
            comp = library.softmax_cross_entropy(shape, reduction, weights, ignore)
        outs[on] = [o.tobytes() for o in comp.run(ins, make_runner(backend))]
    assert outs[True] == outs[False]
    # nll_loss (log-probabilities in) keeps its descriptors: the nll node of the old composite
    with rewrites(False):
        old = library.softmax_cross_entropy(shape, reduction, weights, ignore)
    nll = library.nll_loss(shape, reduction, weights, ignore)
    assert [n.desc for n in nll.nodes] == [n.desc for n in old.nodes[5:]]


def test_training_ce_builds_no_log_softmax_but_log_prob_is_there_when_wanted() -> None:
    ce = library.softmax_cross_entropy((4, 7), "mean", ignore_index=-100)
    for want, n_lsm in (([0], 0), ([0, 1], 1), ([1], 1)):
        b = GraphBuilder()
        x, lab = b.batch_field("x", (4, 7)), b.batch_field("y", (4,))
        b.composite(ce, b.unpack(x), b.unpack(lab), want=want, label="ce")
        assert [lbl for lbl in b._labels if lbl.endswith("log_softmax")] == ["ce/log_softmax"] * n_lsm


def _fill_node(b: GraphBuilder, x: Ref, label: str, c: float = 2.0) -> Ref:
    return b.map(label, (const(1, c), I(Op.MUL, 0, 0, 1)), x)


def test_cse_merges_equal_nodes_whatever_the_view_or_label() -> None:
    b = GraphBuilder()
    x = b.unpack(b.batch_field("x", (2, 6)))
    y1 = _fill_node(b, x, "twice")
    n = b.num_nodes
    y2 = _fill_node(b, b.view(x, (2, 6)), "again")  # another label
    assert (y2.kind, y2.key) == (y1.kind, y1.key) and b.num_nodes == n
    # a view of another shape reads the same flat storage: the same descriptor reads the same bits
    y3 = b.node(library.elementwise("twice", [(12,)], (const(1, 2.0), I(Op.MUL, 0, 0, 1))), b.view(x, (12,)))
    assert y3.key != y1.key  # its descriptor has another output shape: another node
    assert _fill_node(b, x, "thrice", 3.0).key != y1.key  # another program
    assert _fill_node(b, y1, "twice").key != y1.key  # another input
    b.cse_barrier()
    assert _fill_node(b, x, "twice").key not in (y1.key, y3.key)  # nothing merges across a barrier
    with rewrites(False):
        off = GraphBuilder()
    xo = off.unpack(off.batch_field("x", (2, 6)))
    assert _fill_node(off, xo, "a").key != _fill_node(off, xo, "a").key


def test_two_states_merged_into_one_producer_are_refused() -> None:
    """Every producer the training graph builds reads its own state, so none merges with another
    state's; two states whose producers are equal nodes are refused by ``finish``, clearly."""
    b = GraphBuilder()
    x = b.unpack(b.batch_field("x", (3,)))
    b.state("a", (3,), "param")
    b.state("b", (3,), "param")
    p1, p2 = _fill_node(b, x, "p"), _fill_node(b, x, "p")
    assert p1.key == p2.key
    with pytest.raises(GraphError, match="two states share a producer node"):
        b.finish({"a": p1, "b": p2}, {})
    b2 = GraphBuilder()
    x2 = b2.unpack(b2.batch_field("x", (3,)))
    s1, s2 = b2.state("a", (3,), "param"), b2.state("b", (3,), "param")
    q1 = b2.binary("add", s1, x2)
    q2 = b2.binary("add", s2, x2)  # reads its own state: never merged
    assert q1.key != q2.key
    assert len(b2.finish({"a": q1, "b": q2}, {}).nodes) == 3


def test_shard_blocks_read_only_their_own_nodes() -> None:
    """S > 1: a node equal to one of an earlier shard's block is built again in its own block."""
    job = digits_job(steps=2, batch_size=16, checkpoint_interval=0, shards=2)
    g = job.program.graph
    blocks = g.shard_blocks
    for k, (lo, hi) in enumerate(blocks):
        for n in g.nodes[lo:hi]:
            assert all(lo <= s.index < hi for s in n.inputs if s.kind == SourceKind.NODE_OUTPUT), (k, n.label)
    assert blocks[0][1] - blocks[0][0] == blocks[1][1] - blocks[1][0]

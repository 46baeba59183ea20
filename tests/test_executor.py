"""Executor: bit-determinism, checkpoints (verified), resume, recomputation, openings, traces,
and the referee's view of a node (structure leaf, input sources, C_0 pseudo step)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_graph_helpers import build
from torch import nn

from verde_chain.commit import merkle, node_hash, step_commitment, tensor_root, verify_element
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.data import batch_leaf, batch_root_list
from verde_chain.graph.errors import CheckpointError, ShapeMismatchError
from verde_chain.graph.executor import TrainingRun
from verde_chain.graph.structure import SourceKind, TrainingGraph, structure_leaf
from verde_chain.graph.training import OptimizerSpec, TrainingProgram

T = 6
rng = np.random.default_rng(11)
X = rng.standard_normal((40, 5)).astype(np.float32)
Y = rng.integers(0, 3, 40).astype(np.float32)


@pytest.fixture(scope="module")
def prog() -> TrainingProgram:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    return build(m, torch.zeros(4, 5), opt=OptimizerSpec("adam", lr=0.01))


def batches(p: TrainingProgram):  # type: ignore[no-untyped-def]
    def batch(s: int) -> np.ndarray:
        idx = np.arange(4 * (s - 1), 4 * s) % len(X)
        return p.batch(s, {"x": X[idx]}, Y[idx])

    return batch


def new_run(p: TrainingProgram, interval: int = 0, out: Path | None = None) -> TrainingRun:
    return TrainingRun(p.graph, p.initial_state(), batches(p), T, interval, out)


def test_same_commitments_whatever_the_checkpoint_interval(prog: TrainingProgram, tmp_path: Path) -> None:
    a = new_run(prog, 2, tmp_path / "a")
    b = new_run(prog, 3, tmp_path / "b")
    c = new_run(prog, 0)
    assert a.run() == b.run() == c.run()
    assert a.commitments == b.commitments == c.commitments
    assert len(set(a.commitments.values())) == T + 1  # every step changes the state
    assert (tmp_path / "a" / "checkpoints" / "step_00000004.npz").exists()
    assert not (tmp_path / "b" / "checkpoints" / "step_00000004.npz").exists()


def test_resume_from_checkpoint_gives_identical_final_commitment(prog: TrainingProgram, tmp_path: Path) -> None:
    full = new_run(prog).run()
    first = new_run(prog, 2, tmp_path)
    first.run(until=3)  # "crash" after step 3; latest checkpoint is step 2
    second = new_run(prog, 2, tmp_path)
    assert second.resume() == 2
    assert second.run() == full


def test_recomputed_commitments_equal_the_run(prog: TrainingProgram, tmp_path: Path) -> None:
    for out in (None, tmp_path):
        r = new_run(prog, 4, out)
        r.run()
        for j in range(T + 1):
            assert r.commitment(j) == r.commitments[j]


def test_step_commitment_is_the_root_of_node_hashes(prog: TrainingProgram) -> None:
    r = new_run(prog)
    r.run(until=2)
    res = r.recompute_step(2)
    assert step_commitment(res.node_hashes) == res.commitment == r.commitments[2]
    for node in prog.graph.nodes:
        ins, out = r.node_tensors(2, node.index)
        assert tensor_root(out) == res.roots[node.index]
        in_roots = [tensor_root(a) for a in ins]
        assert node_hash(node.index, node.desc_hash, in_roots, [res.roots[node.index]]) == res.node_hashes[node.index]


def test_openings_and_trace_bind_to_the_commitment(prog: TrainingProgram) -> None:
    r = new_run(prog)
    r.run(until=3)
    d = next(n.index for n in prog.graph.nodes if n.label == "matmul")
    root, opening = r.open_output(3, d, 5)
    assert root == r.recompute_step(3).roots[d]
    bits = verify_element(root, opening)
    steps = r.trace(3, d, 5)
    assert len(steps) == prog.graph.nodes[d].desc.num_steps
    assert steps[-1].post.regs[0] == bits
    for a, b in itertools.pairwise(steps):
        assert a.post == b.pre


def referee_checks_node(graph: TrainingGraph, r: TrainingRun, s: int, d: int, c0_state: dict[str, np.ndarray]) -> None:
    """What the L2 referee checks (docs/training.md): structure leaf vs graph root, each input
    root justified by an opened node of C_s / C_{s-1} (C_0's pseudo nodes for s = 1) or the batch."""
    node = graph.nodes[d]
    leaves = graph.structure_leaves()
    merkle.verify(graph.root(), structure_leaf(d, node.desc_hash, node.inputs), d, len(leaves), graph.structure_proof(d))
    cur = r.recompute_step(s)
    if s == 1:
        prev_leaves = graph.initial_leaves(c0_state)
        prev_root = r.c0
    else:
        prev = r.recompute_step(s - 1)
        prev_leaves, prev_root = prev.node_hashes, prev.commitment
    ins, _ = r.node_tensors(s, d)
    for src, arr in zip(node.inputs, ins):
        root = tensor_root(arr)
        if src.kind == SourceKind.NODE_OUTPUT:
            assert src.index < d
            parent = graph.nodes[src.index]
            leaf = cur.node_hashes[src.index]
            pin = [tensor_root(a) for a in r.node_tensors(s, src.index)[0]]
            assert leaf == node_hash(src.index, parent.desc_hash, pin, [root])
            merkle.verify(cur.commitment, leaf, src.index, len(cur.node_hashes), merkle.merkle_proof(cur.node_hashes, src.index))
        elif src.kind == SourceKind.PREV_STEP_NODE_OUTPUT:
            leaf = prev_leaves[src.index]
            parent = graph.nodes[src.index]
            if s == 1:
                assert leaf == node_hash(src.index, parent.desc_hash, [], [root])
            else:
                pin = [tensor_root(a) for a in r.node_tensors(s - 1, src.index)[0]]
                assert leaf == node_hash(src.index, parent.desc_hash, pin, [root])
            merkle.verify(prev_root, leaf, src.index, len(prev_leaves), merkle.merkle_proof(prev_leaves, src.index))
        else:
            assert src.index == 0 and root == cur.batch_root
            roots = [r.recompute_step(k).batch_root for k in range(1, T + 1)]
            leaves = [batch_leaf([x]) for x in roots]
            merkle.verify(batch_root_list(roots), batch_leaf([root]), s - 1, T, merkle.merkle_proof(leaves, s - 1))


def test_every_node_input_is_justified_like_the_referee_does(prog: TrainingProgram) -> None:
    r = new_run(prog)
    r.run(until=2)
    cache: dict[int, object] = {}
    recompute = r.recompute_step

    def cached(step: int):  # type: ignore[no-untyped-def]
        if step not in cache:
            cache[step] = recompute(step)
        return cache[step]

    r.recompute_step = cached  # type: ignore[method-assign]
    kinds = {s.kind for n in prog.graph.nodes for s in n.inputs}
    assert kinds == {SourceKind.NODE_OUTPUT, SourceKind.PREV_STEP_NODE_OUTPUT, SourceKind.BATCH}
    for s in (1, 2):
        for d in range(len(prog.graph.nodes)):
            referee_checks_node(prog.graph, r, s, d, prog.initial_state())


def _ckpt(tmp_path: Path, prog: TrainingProgram) -> tuple[TrainingRun, Path, Path]:
    r = new_run(prog, 2, tmp_path)
    r.run()
    store = CheckpointStore(tmp_path, prog.graph)
    npz, man = store.paths(4)
    return r, npz, man


def test_corrupt_tensor_in_checkpoint_is_detected(prog: TrainingProgram, tmp_path: Path) -> None:
    r, npz, _ = _ckpt(tmp_path, prog)
    with np.load(npz) as z:
        arrays = {k: z[k].copy() for k in z.files}
    name = prog.graph.states[0].name
    arrays[name].reshape(-1)[0] = np.nextafter(arrays[name].reshape(-1)[0], np.float32(np.inf))  # one ulp
    np.savez(npz, **arrays)
    with pytest.raises(CheckpointError, match=name):
        CheckpointStore(tmp_path, prog.graph).load(4)
    with pytest.raises(CheckpointError):
        r.commitment(5)  # recomputation refuses the corrupt checkpoint instead of using it


def test_truncated_or_mismatched_checkpoints_are_refused(prog: TrainingProgram, tmp_path: Path) -> None:
    _, npz, man = _ckpt(tmp_path, prog)
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="unreadable"):
        CheckpointStore(tmp_path, prog.graph).load(4)
    m = json.loads(man.read_text())
    m["graph_root"] = "0x" + "00" * 32
    man.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="another graph"):
        CheckpointStore(tmp_path, prog.graph).load(4)
    man2 = CheckpointStore(tmp_path, prog.graph).paths(2)[1]
    m2 = json.loads(man2.read_text())
    m2["state_root"] = "0x" + "11" * 32
    man2.write_text(json.dumps(m2))
    with pytest.raises(CheckpointError, match="state root"):
        CheckpointStore(tmp_path, prog.graph).load(2)


def test_wrong_batch_size_is_refused(prog: TrainingProgram) -> None:
    r = new_run(prog)
    with pytest.raises(ShapeMismatchError):
        r.exec.run_step(r.init, np.zeros(prog.graph.batch_numel + 1, dtype=np.float32))

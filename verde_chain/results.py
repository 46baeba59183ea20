"""A job's result as its client reads it: the tensors an accepted C_T commits to, opened.

What a client gets out of a job (its *deliverable*) is part of the final state: an inference
job's outputs buffers (every batch's predictions, docs/training.md "Every output is committed in
C_T"), a training job's trained parameters. Each is the output of its producer node at step T,
so it is opened against C_T like any node output (``commit.NodeOpening``): the tensor's root and
the node's input roots make the node hash, whose Merkle proof leads to C_T.

A trainer publishes the opening of its result next to the job's bundle once the result is
revealed on chain (``results/<C_T hex>.npz`` and ``.json``); ``verde-chain job results``
checks a published opening against the ACCEPTED result and refuses it on any mismatch, or, when
none is published (or ``--recompute``), re-executes the job itself and refuses if its own C_T is
not the accepted one. Either way the outputs it writes are the ones C_T commits to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verde_chain.commit import LEAF_ELEMS, NodeOpening, verify_node_output
from verde_chain.commit.merkle import proof_from_levels
from verde_chain.dispute.world import World
from verde_chain.errors import CommitmentError, VerdeError
from verde_chain.graph.structure import StateSlot
from verde_chain.graph.world import TrainingWorld
from verde_chain.job import Job, inference_outputs

DELIVERABLE_ROLE = {"inference": "outputs", "train": "param"}


class ResultError(VerdeError):
    """A published result does not open the accepted C_T (or cannot be read)."""


@dataclass
class ResultOpening:
    """The deliverable tensors of one result (state slot name -> flat float32) with the opening
    of each against ``result`` (C_T)."""

    result: bytes
    tensors: dict[str, np.ndarray]
    openings: dict[str, NodeOpening]


def deliverables(job: Job) -> list[StateSlot]:
    """The state slots a client gets out of the job (module docstring)."""
    role = DELIVERABLE_ROLE[job.spec.kind]
    return [s for s in job.program.graph.states if s.role == role]


def open_result(job: Job, world: World) -> ResultOpening:
    """The opening of the result ``world`` computes (its own C_T: a dishonest world opens its
    own, wrong, result consistently)."""
    T = job.spec.steps
    leaves = world.node_levels(T)
    tensors, openings = {}, {}
    for slot in deliverables(job):
        d = slot.producer
        n_chunks = -(-slot.numel // LEAF_ELEMS)
        raw = b"".join(world.output_chunk(T, d, i) for i in range(n_chunks))
        tensors[slot.name] = np.frombuffer(raw, dtype=">u4")[: slot.numel].astype(np.uint32).view(np.float32)
        proof = tuple(proof_from_levels(leaves, d))
        openings[slot.name] = NodeOpening(d, tuple(world.node_reveal(T, d).input_roots), world.num_nodes, proof)
    return ResultOpening(world.step_commitment(T), tensors, openings)


def verify_result(job: Job, opening: ResultOpening, accepted: bytes) -> dict[str, np.ndarray]:
    """The deliverable of the ``accepted`` result, if ``opening`` opens it; ``ResultError``
    otherwise. Inference: per model output, every sample's outputs (``inference_outputs``);
    training: each parameter in its shape."""
    if opening.result != accepted:
        raise ResultError(f"the opening is of result 0x{opening.result.hex()}, the accepted result is "
                          f"0x{accepted.hex()}")
    graph = job.program.graph
    state = {}
    for slot in deliverables(job):
        t, op = opening.tensors.get(slot.name), opening.openings.get(slot.name)
        if t is None or op is None:
            raise ResultError(f"the opening lacks {slot.name!r}")
        t = np.ascontiguousarray(t, dtype=np.float32).reshape(-1)
        if t.size != slot.numel or op.index != slot.producer:
            raise ResultError(f"{slot.name!r}: {t.size} elements from node {op.index}, the job's is {slot.numel} "
                              f"from node {slot.producer}")
        try:
            verify_node_output(accepted, graph.nodes[slot.producer].desc_hash, op, t)
        except CommitmentError as exc:
            raise ResultError(f"{slot.name!r} does not open the accepted result 0x{accepted.hex()[:16]}... "
                              f"({exc.name}): refused") from exc
        state[slot.name] = t.reshape(slot.shape)
    return inference_outputs(job, state) if job.spec.kind == "inference" else state


def save_result(opening: ResultOpening, directory: str | Path) -> Path:
    """``<directory>/<C_T hex>.npz`` (the tensors) and ``.json`` (the openings); returns the .npz."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = d / opening.result.hex()
    np.savez(stem.with_suffix(".npz"), **opening.tensors)
    meta = {name: {"index": op.index, "size": op.size, "input_roots": ["0x" + r.hex() for r in op.input_roots],
                   "proof": ["0x" + p.hex() for p in op.proof]} for name, op in opening.openings.items()}
    stem.with_suffix(".json").write_text(json.dumps({"result": "0x" + opening.result.hex(), "openings": meta}))
    return stem.with_suffix(".npz")


def load_result(directory: str | Path, result: bytes) -> ResultOpening | None:
    """The opening published for ``result`` under ``directory``, or None if there is none."""
    stem = Path(directory) / result.hex()
    if not stem.with_suffix(".json").exists():
        return None
    try:
        meta = json.loads(stem.with_suffix(".json").read_text())
        openings = {
            name: NodeOpening(int(m["index"]), tuple(bytes.fromhex(r[2:]) for r in m["input_roots"]), int(m["size"]),
                              tuple(bytes.fromhex(p[2:]) for p in m["proof"]))
            for name, m in meta["openings"].items()
        }
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            tensors = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultError(f"the published result {stem}.* cannot be read ({type(exc).__name__}: {exc})") from exc
    return ResultOpening(bytes.fromhex(meta["result"][2:]), tensors, openings)


def accepted_deliverable(job: Job, accepted: bytes, published: ResultOpening | None = None) -> dict[str, np.ndarray]:
    """The deliverable of the ``accepted`` result: from ``published`` (a trainer's opening) when
    there is one, else re-executed here; either way checked against ``accepted`` (``ResultError``
    when a published opening does not open it, or when our own re-execution ends elsewhere)."""
    if published is not None:
        return verify_result(job, published, accepted)
    world = TrainingWorld.from_job(job)
    own = world.step_commitment(job.spec.steps)
    if own != accepted:
        raise ResultError(f"re-executing the job ends at C_T 0x{own.hex()[:16]}..., not at the accepted "
                          f"0x{accepted.hex()[:16]}...: the accepted result is not this bundle's (refused)")
    return verify_result(job, open_result(job, world), accepted)

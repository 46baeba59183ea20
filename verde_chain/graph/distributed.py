"""Data-parallel execution of an S-shard training step on W processes (torch.distributed).

The job fixes S (``JobSpec.shards``): the training graph holds one block of nodes per
micro-batch shard and combines the shards' gradients in ascending shard order in its own nodes
(``graph/training.py``: ``combine_desc``). How many processes compute the shards is not part of
the program, so C_s is the same for any W <= S::

    rank r of W:  shards [r*S/W, (r+1)*S/W)      (contiguous; rank 0 always holds shard 0)
    1. run the nodes of its shards' blocks                      (forward, loss, backward)
    2. all-gather the block outputs the rest of the step reads   (each shard's gradients and
       loss, and block-produced state): every rank then holds every shard's tensors, bit for bit
    3. run the tail: the fixed-order combination, the optimizer, the carries   (replicated)
    4. on a committed step, all-gather the output roots of the block nodes (32 bytes each), so
       every rank hashes every node and gets the same C_s; rank 0 writes checkpoints and C_T

The collective moves bits, it never adds: the only sums are the graph's combination nodes, which
every rank runs on the same inputs in the same order. Resuming broadcasts rank 0's verified
checkpoint, so a run stopped with one W continues with any other.

``TorchCollective`` is the gloo (CPU) or NCCL (CUDA) process group of torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); ``train_cli`` sets that environment
itself for ``--workers W``. A peer that dies makes the collective fail: every other rank raises
``WorkerLostError`` (one line, the step it was on) instead of waiting.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any, Protocol

import numpy as np

from verde_chain.graph.backend import Runner
from verde_chain.graph.errors import GraphError
from verde_chain.graph.executor import _NOT_RUN, Executed, PlainState, StepExecutor, StepState, Tamper, TrainingRun
from verde_chain.graph.structure import SourceKind, TrainingGraph

ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The exit status of a rank that stopped because a collective failed (a peer was lost): the
# launcher reads it as a consequence, so it names the rank that was lost, not the one that noticed.
PEER_LOST_STATUS = 3


class WorkerLostError(GraphError):
    """A collective failed: another rank died (killed, crashed) or the rendezvous broke."""


class Collective(Protocol):
    rank: int
    world: int

    def all_gather(self, buf: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``buf`` (same dtype and size on all ranks), in rank order."""

    def broadcast(self, buf: np.ndarray, src: int = 0) -> np.ndarray:
        """Rank ``src``'s ``buf`` on every rank (same dtype and size on all ranks)."""


def distributed_env() -> bool:
    """True inside a torchrun-style process group of more than one rank."""
    return all(v in os.environ for v in ENV_VARS) and int(os.environ["WORLD_SIZE"]) > 1


class TorchCollective:
    """A torch.distributed process group: gloo on CPU, NCCL when ``cuda`` (tensors travel on
    the rank's GPU then)."""

    def __init__(self, cuda: bool = False, timeout_s: float = 600.0) -> None:
        import torch
        import torch.distributed as dist

        self._dist, self._torch = dist, torch
        self.device = "cpu"
        if cuda:
            local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
            self.device = f"cuda:{local % max(torch.cuda.device_count(), 1)}"
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.step = 0  # the step being run, for the error message

    def _lost(self, exc: Exception) -> WorkerLostError:
        why = (str(exc).splitlines() or [""])[0].split(" This is typically")[0]  # gloo's first sentence
        return WorkerLostError(
            f"rank {self.rank} of {self.world}: a collective of step {self.step} failed, another worker has "
            f"stopped ({type(exc).__name__}: {why})", rank=self.rank, step=self.step)

    def all_gather(self, buf: np.ndarray) -> list[np.ndarray]:
        t = self._torch.from_numpy(np.ascontiguousarray(buf)).to(self.device)
        out = [self._torch.empty_like(t) for _ in range(self.world)]
        try:
            self._dist.all_gather(out, t)
        except (RuntimeError, ConnectionError) as exc:
            raise self._lost(exc) from exc
        return [o.cpu().numpy() for o in out]

    def broadcast(self, buf: np.ndarray, src: int = 0) -> np.ndarray:
        t = self._torch.from_numpy(np.ascontiguousarray(buf).copy()).to(self.device)
        try:
            self._dist.broadcast(t, src)
        except (RuntimeError, ConnectionError) as exc:
            raise self._lost(exc) from exc
        return t.cpu().numpy()

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def shard_ranges(shards: int, world: int) -> list[range]:
    """The shards each rank computes: contiguous, sizes differing by at most one."""
    if not 1 <= world <= shards:
        raise GraphError(f"{world} workers for {shards} shards: a job runs on 1 to {shards} workers (its shards); "
                         "create it with more shards (--shards) to use more workers", workers=world, shards=shards)
    return [range(r * shards // world, (r + 1) * shards // world) for r in range(world)]


class ShardedExecutor(StepExecutor):
    """A ``StepExecutor`` that computes its rank's shards and gathers the others' (module
    docstring); the same outputs, roots and C_s as the one-process executor."""

    def __init__(self, graph: TrainingGraph, coll: Collective, runner: Runner | None = None) -> None:
        super().__init__(graph, runner)
        blocks = graph.shard_blocks
        if len(blocks) < 2:
            raise GraphError("this job has one shard: it runs in one process (create it with --shards S > 1)")
        self.coll = coll
        self.ranges = shard_ranges(len(blocks), coll.world)
        owner = {d: k for k, (lo, hi) in enumerate(blocks) for d in range(lo, hi)}
        self._tail = [d for d in range(len(graph.nodes)) if d not in owner]
        # block outputs the tail reads, or that are state (the next step's blocks read it on any rank)
        wanted = {s.index for d in self._tail for s in graph.nodes[d].inputs if s.kind == SourceKind.NODE_OUTPUT}
        wanted |= {s.producer for s in graph.states}
        self._exports = [sorted(d for d in range(lo, hi) if d in wanted) for lo, hi in blocks]
        self._numel = [math.prod(n.desc.out_shape) for n in graph.nodes]
        self._mine = [d for k in self.ranges[coll.rank] for d in range(*blocks[k])]
        self.comm_s = 0.0  # seconds spent in collectives (the benchmark's communication share)
        self.comm_bytes = 0  # bytes this rank received from the others

    def step_kernel(self, keep: Collection[int] | None = None) -> Any:
        return None  # the whole-step kernel runs every node; a rank runs its shards only

    def _gather(self, per_shard: list[list[int]], values: list[np.ndarray], width: int, dtype: Any) -> None:
        """Fill ``values[d]`` for every shard's listed nodes from the rank that computed it."""
        sizes = [sum(self._numel[d] if width == 0 else width for d in per_shard[k]) for k in range(len(per_shard))]
        cap = max(sum(sizes[k] for k in rng) for rng in self.ranges)
        local = np.zeros(cap, dtype=dtype)
        pos = 0
        for k in self.ranges[self.coll.rank]:
            for d in per_shard[k]:
                v = values[d].reshape(-1).view(dtype)
                local[pos : pos + v.size] = v
                pos += v.size
        t0 = time.perf_counter()
        everyone = self.coll.all_gather(local)
        self.comm_s += time.perf_counter() - t0
        self.comm_bytes += local.nbytes * (self.coll.world - 1)
        for r, got in enumerate(everyone):
            if r == self.coll.rank:
                continue
            pos = 0
            for k in self.ranges[r]:
                for d in per_shard[k]:
                    n = self._numel[d] if width == 0 else width
                    values[d] = got[pos : pos + n].copy()
                    pos += n

    def _execute(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None,
                 keep: Collection[int] | None = None, commit: bool = False) -> Executed:
        outputs: list[np.ndarray] = [_NOT_RUN] * len(self.graph.nodes)
        if isinstance(self.coll, TorchCollective):
            self.coll.step = prev.step + 1
        self._run_nodes(self._mine, outputs, prev, batch, tamper)
        self._gather(self._exports, outputs, 0, np.float32)
        self._run_nodes(self._tail, outputs, prev, batch, tamper)
        return Executed(outputs, None, None, None)

    def _roots(self, arena: np.ndarray | None, layout: Any, tensors: list[np.ndarray], nodes: list[int] | None) -> np.ndarray:
        if nodes is not None:  # state roots: the state is on every rank
            return super()._roots(arena, layout, tensors, nodes)
        local = [d for d in range(len(tensors)) if tensors[d] is not _NOT_RUN]
        table = np.zeros((len(tensors), 32), dtype=np.uint8)
        table[local] = super()._roots(None, None, [tensors[d] for d in local], local)
        rows = [table[d] for d in range(len(tensors))]
        self._gather([list(range(lo, hi)) for lo, hi in self.graph.shard_blocks], rows, 32, np.uint8)
        return np.stack(rows)


def distributed_run(run: TrainingRun, coll: Collective, resume: bool) -> int:
    """Bring every rank's run to the same start: step 0, or (``resume``) rank 0's latest
    verified checkpoint broadcast to all. Returns the start step."""
    producers = [s.producer for s in run.graph.states]
    step = np.zeros(1, dtype=np.int64)
    if resume and coll.rank == 0:
        step[0] = run.resume()
    step = coll.broadcast(step)
    if not resume or step[0] == 0:
        return int(step[0])
    st = run.state
    flat = np.concatenate([st.tensors[p] for p in producers]) if coll.rank == 0 else np.zeros(
        sum(s.numel for s in run.graph.states), dtype=np.float32)
    c = np.frombuffer(st.commitment, dtype=np.uint8).copy() if coll.rank == 0 and isinstance(st, StepState) else (
        np.zeros(32, dtype=np.uint8))
    flat, c = coll.broadcast(flat), coll.broadcast(c)
    if coll.rank != 0:
        tensors, pos = {}, 0
        for s in run.graph.states:
            tensors[s.producer] = flat[pos : pos + s.numel].copy()
            pos += s.numel
        run.start_from(StepState(int(step[0]), tensors, {}, bytes(c)))
    return int(step[0])


def worker_info(coll: Collective, shards: int) -> list[Mapping[str, int]]:
    """Every rank's process id and shards, gathered (what shows the ranks were processes)."""
    rng = shard_ranges(shards, coll.world)[coll.rank]
    rows = coll.all_gather(np.array([coll.rank, os.getpid(), rng.start, len(rng)], dtype=np.int64))
    return [{"rank": int(r[0]), "pid": int(r[1]), "first_shard": int(r[2]), "shards": int(r[3])} for r in rows]

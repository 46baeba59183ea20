"""``--workers W`` for the trainer and challenger bots: train a job's plan on W processes.

A job of S > 1 shards (``JobSpec.shards``) can be computed by up to S processes with the same
commitments (``graph/distributed.py``). An honest plan's world is then trained by
``verde-chain train BUNDLE --workers W --out RUN`` (the processes it launches; ``--resume``
continues an interrupted run from its checkpoints), and the world takes over the run's verified
checkpoints: every later question of a dispute is answered from them in this process, and C_T is
recomputed here from the last one and compared with the workers' (a mismatch is refused, never
submitted). A cheating strategy's world, a one-shard job or ``W = 1`` train in this process
(``strategies.train``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from verde_chain.agents.errors import AgentError
from verde_chain.agents.strategies import Plan, ProgressFn, train
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.world import TrainingWorld


def parallel_world(plan: Plan, shards: int, workers: int) -> TrainingWorld | None:
    """The plan's world if W processes can train it (an honest world of a sharded job), else None."""
    w = plan.world
    if not isinstance(w, TrainingWorld) or type(w) is not TrainingWorld:  # a subclass: a cheat's world
        return None
    return w if workers > 1 and shards > 1 and w.fault is None and not plan.tamper_result else None


def train_on_workers(plan: Plan, bundle: Path, shards: int, workers: int, run_dir: Path,
                     progress: ProgressFn | None = None) -> bytes:
    """The plan's result, trained on ``min(workers, shards)`` processes where it can be
    (module docstring), else in this process."""
    world = parallel_world(plan, shards, workers)
    if world is None:
        return train(plan, progress)
    resume = ["--resume"] if (run_dir / "checkpoints").is_dir() else []
    cmd = [sys.executable, "-m", "verde_chain.cli", "train", str(bundle), "--workers", str(min(workers, shards)),
           "--out", str(run_dir), "--json", *resume]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise AgentError(f"training on {workers} workers failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    final = bytes.fromhex(json.loads(r.stdout.strip().splitlines()[-1])["final_commitment"][2:])
    store = CheckpointStore(run_dir, world.graph)
    for step in store.steps():
        world.adopt(store.load(step))
    mine = plan.result()  # recomputed here from the last checkpoint at or before T
    if mine != final:
        raise AgentError(f"the workers' C_T 0x{final.hex()[:16]}... differs from this process's 0x{mine.hex()[:16]}...")
    if progress:
        progress(world.num_steps, world.num_steps)
    return mine

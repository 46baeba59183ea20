"""Bots' --workers: an honest plan of a sharded job trained on W processes gives the one-process
result, and the world answers from the workers' checkpoints; a cheat's plan trains in-process."""

from __future__ import annotations

from pathlib import Path

from verde_chain.agents.strategies import train, trainer_plan
from verde_chain.agents.workers import parallel_world, train_on_workers
from verde_chain.examples.digits import digits_job
from verde_chain.job import save_job


def test_an_honest_plan_trains_on_workers_and_answers_from_their_checkpoints(tmp_path: Path) -> None:
    job = digits_job(steps=6, shards=2, checkpoint_interval=2)
    save_job(job, tmp_path / "bundle")
    here = trainer_plan("honest", job)
    want = train(here)
    plan = trainer_plan("honest", job)
    seen: list[tuple[int, int]] = []
    got = train_on_workers(plan, tmp_path / "bundle", 2, 2, tmp_path / "run", lambda i, n: seen.append((i, n)))
    assert got == want and seen == [(6, 6)]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*.json")) == [
        "step_00000000.json", "step_00000002.json", "step_00000004.json", "step_00000006.json"]
    # the workers' checkpoints serve a dispute: any step's commitment and node reveal as if trained here
    assert plan.world.step_commitment(3) == here.world.step_commitment(3)
    assert plan.world.node_reveal(3, 5) == here.world.node_reveal(3, 5)
    cheat = trainer_plan("bitflip:2:5:0:3", job)
    assert parallel_world(cheat, 2, 2) is None and parallel_world(plan, 1, 2) is None
    assert parallel_world(plan, 2, 1) is None and parallel_world(plan, 2, 2) is plan.world

"""A user's own job on the market: a bundle posted as it is, a bad bundle refused without taking a
bot down, and the accepted result read back (``job results``) checked against C_T."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.bots import STEPS, TERMS, World, finished
from tests.support.cli import assert_refused, run_cli
from verde_chain.agents.catalog import Bundles, build_job
from verde_chain.agents.trainer import TrainerBot
from verde_chain.graph.world import TrainingWorld
from verde_chain.job import Job, inference_outputs, job_from_torch, load_job, save_job
from verde_chain.market.types import JobStatus

pytestmark = pytest.mark.chain


def _inference_job() -> Job:
    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    X = np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32)
    return job_from_torch(module, torch.zeros(2, 4), (X, None), steps=3, kind="inference", name="tiny-classifier")


def _fresh(world: World, tmp_path: Path) -> World:
    """The world with a bundle directory of its own (the module's shared one stays intact)."""
    return dataclasses.replace(world, bundles=tmp_path / "bundles", bots=[])


def _results(world: World, job_id: int, *extra: str) -> list[str]:
    url = str(getattr(world.w3.provider, "endpoint_uri", ""))
    return ["job", "results", str(job_id), "--rpc-url", url, "--market", world.market.address,
            "--bundles", str(world.bundles), *extra]


def test_a_bad_bundle_is_refused_and_the_next_job_is_served(world: World, tmp_path: Path) -> None:
    world = _fresh(world, tmp_path)
    client = world.client()
    said: list[str] = []
    trainer = TrainerBot(world.w3, world.artifacts, world.cfg("trainer-2", 2), log=said.append)
    world.bots += [trainer, world.trainer(3)]
    bad_id = client.post(TERMS, world.job)
    # the published files no longer match the posted commitments (another dataset under the same name)
    d = Bundles(world.bundles).root / world.job.spec.hash().hex()
    np.savez(d / "data.npz", X=np.zeros_like(world.job.dataset.X), Y=world.job.dataset.Y)
    assert trainer.tick() is False  # no exception: the job is refused, the bot keeps serving
    assert any(m.startswith(f"[trainer-2] refused job {bad_id}: bundle") and "refused" in m for m in said), said
    assert trainer.store.job(bad_id)["state"] == "skipped"  # type: ignore[index]
    good = build_job("digits", STEPS, seed=8)
    good_id = client.post(TERMS, good)
    world.run(finished(client, good_id, world.bots))
    chain_job = world.market.job(good_id)
    assert chain_job.status == JobStatus.FINALIZED
    assert chain_job.accepted_result == TrainingWorld.from_job(good).step_commitment(STEPS)
    assert trainer.address in (s.trainer for s in world.market.slots(good_id))
    assert not world.market.slots(bad_id)  # nobody staked on the bad one


def test_job_results_gives_every_output_of_an_inference_job_checked(world: World, tmp_path: Path) -> None:
    world = _fresh(world, tmp_path)
    job = _inference_job()
    bundle = save_job(job, tmp_path / "my-job").parent
    client = world.client()
    world.trainer(2), world.trainer(3), world.challenger()
    refused = run_cli(*_results(world, 1), cwd=tmp_path)
    assert_refused(refused, "no job 1")
    job_id = client.post(TERMS, load_job(bundle))
    assert world.market.job(job_id).terms.bundle_uri == Bundles(world.bundles).uri(job.spec.hash())
    assert_refused(run_cli(*_results(world, job_id), cwd=tmp_path), f"job {job_id} is not finalized yet")
    world.run(finished(client, job_id, world.bots))
    accepted = world.market.job(job_id).accepted_result
    published = Bundles(world.bundles).results_dir(job.spec.hash()) / f"{accepted.hex()}.npz"
    assert published.exists()  # the trainers published the opening of their result at the reveal

    honest = job.make_run()
    honest.run()
    final = {s.name: honest.state.tensors[s.producer] for s in job.program.graph.states}
    want = inference_outputs(job, final)["output"]
    assert want.shape == (6, 3)  # every sample of the three batches, not only the last batch's
    for how in ((), ("--recompute",)):
        out = tmp_path / f"outputs{len(how)}.npz"
        r = run_cli(*_results(world, job_id, "--out", str(out), *how), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"accepted C_T 0x{accepted.hex()}" in r.stdout
        with np.load(out) as z:
            assert np.array_equal(z["output"], want)

    # a published opening that does not open the accepted C_T is refused, never written out
    with np.load(published) as z:
        tensors = {k: z[k].copy() for k in z.files}
    tensors["outputs:output"][0] += np.float32(1)
    np.savez(published, **tensors)
    out = tmp_path / "never.npz"
    assert_refused(run_cli(*_results(world, job_id, "--out", str(out)), cwd=tmp_path),
                   "does not open the accepted result", "refused")
    assert not out.exists()
    shutil.rmtree(Bundles(world.bundles).root / job.spec.hash().hex())
    assert_refused(run_cli(*_results(world, job_id), cwd=tmp_path), "no bundle for spec")


def test_a_bundle_gone_bad_after_the_join_is_refused_not_fatal(world: World, tmp_path: Path) -> None:
    """A trainer restarted after joining finds the bundle no longer matches: it refuses the job on
    one line instead of failing on every start."""
    world = _fresh(world, tmp_path)
    client = world.client()
    trainer = TrainerBot(world.w3, world.artifacts, world.cfg("trainer-2", 2), log=lambda m: None)
    job_id = client.post(TERMS, world.job)
    trainer.tick()
    assert trainer.store.job(job_id)["state"] == "joined"  # type: ignore[index]
    trainer.close()
    (Bundles(world.bundles).root / world.job.spec.hash().hex() / "init.npz").unlink()
    said: list[str] = []
    reborn = TrainerBot(world.w3, world.artifacts, world.cfg("trainer-2", 2), log=said.append)
    assert f"[trainer-2] resuming job {job_id} (joined)" in said
    reborn.tick()
    assert reborn.store.job(job_id)["state"] == "skipped"  # type: ignore[index]
    assert any(m.startswith(f"[trainer-2] refused job {job_id}: bundle") for m in said), said
    reborn.close()

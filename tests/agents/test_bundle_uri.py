"""Bots on separate processes fetch job bundles over HTTP by the job's bundleUri (no shared
directory): a `verde-chain trainer run` process refuses the job whose server is tampered, with
the reason, and stakes on the same job posted with an honest server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.bots import TERMS, World
from verde_chain.agents.bot import BotConfig
from verde_chain.agents.client import ClientBot
from verde_chain.agents.wallet import account
from verde_chain.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _spawn(args: list[str], log: Path) -> subprocess.Popen[str]:
    out = open(log, "a")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen([sys.executable, "-m", "verde_chain.cli", *args], cwd=REPO, stdout=out,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _serve(root: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = _spawn(["bundles", "serve", str(root), "--port", str(port)], log)
    while "serving" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.chain
def test_trainer_process_fetches_over_http_and_refuses_a_tampered_server(world: World) -> None:
    h = world.job.spec.hash().hex()
    bad_root = world.tmp / "tampered"
    shutil.copytree(world.bundles / h, bad_root / h)
    with np.load(bad_root / h / "data.npz") as z:
        X, Y = z["X"].copy(), z["Y"]
    X[0, 0] += 1.0
    np.savez(bad_root / h / "data.npz", X=X, Y=Y)
    procs = []
    try:
        good, good_url = _serve(world.bundles, world.tmp / "good.log")
        bad, bad_url = _serve(bad_root, world.tmp / "bad.log")
        procs += [good, bad]
        url = getattr(world.w3.provider, "endpoint_uri", "")
        own = world.tmp / "trainer-bundles"  # the trainer's own directory: empty, nothing shared
        log = world.tmp / "trainer.log"
        procs.append(_spawn(["trainer", "run", "--rpc-url", str(url), "--market", world.market.address, "--account",
                             "2", "--db", str(world.tmp / "t.sqlite"), "--bundles", str(own), "--poll", "0.1"], log))
        jobs = []
        for index, base in ((1, bad_url), (5, good_url)):  # two clients post the same job, one URI each
            cfg = BotConfig(str(url), world.market.address, index, str(world.tmp / f"c{index}.sqlite"),
                            str(world.bundles), name=f"client-{index}", bundle_url=base)
            jobs.append(ClientBot(world.w3, world.artifacts, cfg, log=lambda m: None).post(TERMS, world.job))
        assert [world.market.job(j).terms.bundle_uri for j in jobs] == [f"{bad_url}/{h}", f"{good_url}/{h}"]
        trainer = account(2).address
        end = time.monotonic() + 300
        while not any(s.trainer == trainer for s in world.market.slots(jobs[1])):
            assert time.monotonic() < end, log.read_text()[-3000:]
            assert procs[-1].poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    text = log.read_text()
    assert f"refused job {jobs[0]}: bundle {bad_url}/{h} refused (tampered: dataset_root)" in text, text[-3000:]
    assert not any(s.trainer == trainer for s in world.market.slots(jobs[0]))
    assert (own / h / "job.json").exists()  # downloaded, verified, kept

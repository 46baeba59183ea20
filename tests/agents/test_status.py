"""`verde-chain job status` / `dispute status`: human tables and --json, mid-game and after it,
read from a market where the bots played a real dispute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.bots import TERMS, World, finished, node_of, reveal_time
from verde_chain import cli
from verde_chain.dispute.types import Phase

pytestmark = pytest.mark.chain
REPO = Path(__file__).resolve().parents[2]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    return rc, capsys.readouterr().out


def test_status_mid_game_and_after(world: World, anvil: Any, capsys: pytest.CaptureFixture[str]) -> None:
    client = world.client()
    honest, cheat = world.trainer(2), world.trainer(3, f"bitflip:2:{node_of(world.job, 'matmul')}:1:3")
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    at = ["--rpc-url", anvil.rpc_url, "--market", world.market.address]
    in_l2 = lambda: any(ch.games.game(g).phase.level == 2 for g in ch.store.games())
    for _ in range(20):  # both trainers commit; before the deadline nothing is public
        if all(s.status.name == "COMMITTED" for s in world.market.slots(job_id)) and len(world.market.slots(job_id)) == 2:
            break
        for b in world.bots:
            b.tick()
    rc, out = _cli(capsys, "job", "status", *at, str(job_id), "--json")
    js = json.loads(out)
    assert js["phase"] == "commit" and [s["status"] for s in js["slots"]] == ["COMMITTED", "COMMITTED"]
    assert {s["result"] for s in js["slots"]} == {"0x" + "00" * 32}
    rc, out = _cli(capsys, "job", "status", *at, str(job_id))
    assert "OPEN, commit phase (results committed, none public)" in out
    for _ in range(50):
        if in_l2():
            break
        for b in world.bots:
            b.tick()
        reveal_time(world, job_id)
    assert in_l2()
    (gid, _), = ch.store.games().items()

    rc, out = _cli(capsys, "dispute", "status", *at, str(gid), "--json")
    st = json.loads(out)
    assert rc == 0 and st["level"] == 2 and st["phase"].startswith("L2") and st["winner"] is None
    assert st["interval"]["unit"] == "nodes" and st["step"] == 2 and st["active"] is True
    assert st["to_move"] in (cheat.address, ch.address) and st["events"]["Bisected"] >= 1
    rc, out = _cli(capsys, "job", "status", *at, str(job_id), "--json")
    js = json.loads(out)
    assert js["status"] == "OPEN" and js["active_disputes"] == 1 and js["phase"] in ("reveal", "challenge")
    assert [s["status"] for s in js["slots"]] == ["REVEALED", "REVEALED"]
    assert js["reveal_deadline"] == world.market.reveal_deadline(job_id)
    assert js["disputes"][0]["game_id"] == gid and js["disputes"][0]["active"] is True

    world.run(finished(client, job_id, world.bots))
    rc, out = _cli(capsys, "dispute", "status", *at, str(gid), "--json")
    st = json.loads(out)
    assert st["phase"] == Phase.RESOLVED.name and st["resolution"] == "STEP" and st["winner"] == ch.address
    assert st["active"] is False and st["events"]["Stepped"] == 1
    rc, out = _cli(capsys, "dispute", "status", *at, str(gid))
    assert rc == 0 and f"game {gid}" in out and "resolved by STEP" in out and ch.address in out

    # the real entry point, as a user runs it
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", "job", "status", *at, str(job_id)],
                       capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "FINALIZED" in r.stdout and "REJECTED" in r.stdout and "SETTLED" in r.stdout
    assert honest.address in r.stdout and cheat.address in r.stdout
    rc, out = _cli(capsys, "job", "status", *at, str(job_id), "--json")
    js = json.loads(out)
    assert js["accepted_result"] == "0x" + world.market.job(job_id).accepted_result.hex()
    assert js["disputes"][0]["winner"] == ch.address and js["phase"] == "finalized"


def test_status_of_unknown_ids_is_a_clear_error(world: World, anvil: Any, capsys: pytest.CaptureFixture[str]) -> None:
    at = ["--rpc-url", anvil.rpc_url, "--market", world.market.address]
    assert cli.main(["job", "status", *at, "7"]) == 2
    assert "no job 7" in capsys.readouterr().err
    assert cli.main(["dispute", "status", *at, "99"]) == 2
    assert "no game 99" in capsys.readouterr().err


@pytest.mark.parametrize("sub", [["client"], ["trainer", "run"], ["challenger", "run"], ["job", "status"],
                                 ["dispute", "status"]])
def test_bot_commands_have_help(sub: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", *sub, "--help"], capture_output=True, text=True,
                       cwd=REPO, timeout=60, check=False)
    assert r.returncode == 0 and "usage: verde-chain " + " ".join(sub) in r.stdout

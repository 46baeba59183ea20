"""The explorer's chain view on Anvil, without a browser: a dispute the bots really play, read
live and afresh; addresses with nothing (or the wrong thing) deployed; a chain that goes back; and
`verde-chain demo --explorer` serving its own run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from web3 import Web3

from tests.support.bots import TERMS, World, finished, node_of, reveal_time
from verde_chain import cli
from verde_chain.agents.catalog import Bundles
from verde_chain.agents.trace import game_trace, narrowing
from verde_chain.chain import anvil as anvil_mod
from verde_chain.dispute.types import Phase
from verde_chain.explorer.chain_view import ChainView
from verde_chain.explorer.errors import NoContracts
from verde_chain.repops.program import instruction_at

pytestmark = pytest.mark.chain
REPO = Path(__file__).resolve().parents[2]


def _view(world: World, anvil: Any) -> ChainView:
    return ChainView(world.w3, world.artifacts, world.market.address, anvil.rpc_url, world.bundles)


def _tick_until(world: World, cond: Any, rounds: int = 200) -> None:
    for _ in range(rounds):
        if cond():
            return
        for b in world.bots:
            b.tick()
        for job_id in range(1, world.market.job_count() + 1):
            reveal_time(world, job_id)
    assert cond()


def test_a_played_dispute_read_live_and_afresh(world: World, anvil: Any) -> None:
    client = world.client()
    honest, cheat = world.trainer(2), world.trainer(3, f"bitflip:2:{node_of(world.job, 'matmul')}:1:3")
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    live = _view(world, anvil)
    in_l3 = lambda: any(ch.games.game(g).phase.level == 3 for g in ch.store.games())
    _tick_until(world, in_l3)
    mid = live.snapshot()
    (gid,) = ch.store.games()
    d = mid["disputes"][str(gid)]
    assert d["phase"].startswith("L3") and d["end"] is None and d["node_label"] == "matmul"
    assert [lv["state"] for lv in d["levels"]] == ["settled", "settled", "active", "waiting"]
    assert d["clocks"]["running"] == ("defender" if ch.games.game(gid).phase.mover == 0 else "challenger")

    world.run(finished(client, job_id, world.bots))
    end = live.snapshot()  # the same view, read on from where it stopped
    fresh = _view(world, anvil).snapshot()  # a new view, read from block 0
    for key in ("moves", "levels", "parties", "end"):
        assert end["disputes"][str(gid)][key] == fresh["disputes"][str(gid)][key], key
    d = fresh["disputes"][str(gid)]
    v = ch.games.game(gid)

    # every level narrowed exactly as agents/trace.py reads it, each step credited to a mover
    start = next(e.block for e in world.market.logs("DisputeOpened", 0) if e.args["gameId"] == gid)
    expect = narrowing(game_trace(ch.games, gid, start))
    for lv in d["levels"]:
        got = [(iv["lo"], iv["hi"], iv["total"]) for iv in lv["intervals"]]
        assert got == [(iv.lo, iv.hi, iv.total) for iv in expect[lv["level"]]], lv["level"]
        assert len(got) >= 2 and all(iv["by"] in ("defender", "challenger") for iv in lv["intervals"])
    assert [lv["state"] for lv in d["levels"]] == ["settled", "settled", "settled", "ended"]

    # moves: one per event-emitting transaction; gas per party is what the receipts say
    calls = Counter(m["function"] for m in d["moves"])
    assert calls["openDispute"] == 1 and calls["step"] == 1 and calls["revealNode"] == 1
    assert calls["choose"] == d["events"]["Chosen"] and calls["postClaims"] == d["events"]["Bisected"] + d["events"][
        "SubtreeRevealed"]
    for role, bot in (("defender", cheat), ("challenger", ch)):
        mine = [m for m in d["moves"] if m["sender"] == bot.address]
        gas = sum(int(world.w3.eth.get_transaction_receipt(m["tx"])["gasUsed"]) for m in mine)
        assert d["parties"][role]["gas"] == gas > 0 and d["parties"][role]["moves"] == len(mine)
    times = [m["time"] for m in d["moves"]]
    assert times == sorted(times) and all(m["role"] in ("defender", "challenger") for m in d["moves"])

    # the end: the cheat's own site, and the instruction the job's graph has there
    f = cheat.plan(job_id).fault
    assert f is not None and (d["step"], d["node"], d["element"]) == (f.step, f.node, f.element)
    e = d["end"]
    assert e["resolution"] == "STEP" and e["winner"] == ch.address and e["winner_role"] == "challenger"
    ins = e["instruction"]
    desc = world.job.program.graph.nodes[v.node_index].desc
    assert ins["op"] == instruction_at(desc, ins["micro_step"])[0].op.name and ins["micro_step"] == v.lo
    assert ins["micro_steps"] == desc.num_steps and ins["element"] == f.element
    assert ins["defender_claim_holds"] is False and ins["agreed_pre"] != ins["claimed_post"]
    assert d["element_value"]["bits"] != ins["result"]["bits"] or ins["micro_step"] + 1 < ins["micro_steps"]

    # the job page's data: generic spec and slot fields, the market's events, the model from the bundle
    j = fresh["jobs"][str(job_id)]
    assert j["status"] == "FINALIZED" and j["model"]["name"] == world.job.spec.name
    assert set(j["terms"]) >= {"token", "reward", "trainer_stake", "min_challenge_bond", "submission_deadline",
                              "challenge_window", "clock_seconds", "num_steps", "num_nodes", "slots"}
    by_slot = {s["trainer"]: s for s in j["slots"]}
    assert by_slot[honest.address]["status"] == "SETTLED" and by_slot[cheat.address]["status"] == "REJECTED"
    assert "checkpoint_root" in by_slot[honest.address]  # every Slot field, not a chosen few
    names = [ev["name"] for ev in j["events"]]
    assert names[0] == "JobPosted" and names[-1] == "JobFinalized" and "DisputeSettled" in names
    assert j["reward"] == str(TERMS.reward)  # beyond 2**53: a string, exact for the page


def test_a_timeout_ends_where_the_clock_ran_out(world: World, anvil: Any) -> None:
    client = world.client()
    world.trainer(2)
    world.trainer(3, f"silent:3:2:{node_of(world.job, 'matmul')}:1")  # answers 3 times, then never again
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    world.run(finished(client, job_id, world.bots))
    (gid,) = ch.store.games()
    d = _view(world, anvil).snapshot()["disputes"][str(gid)]
    e = d["end"]
    assert e["resolution"] == "TIMEOUT" and e["winner_role"] == "challenger" and e["loser_role"] == "defender"
    assert e["instruction"] is None and e["phase_before"] in {p.name for p in Phase if p.mover == 0}
    last = d["moves"][-1]
    assert last["function"] == "claimTimeout" and last["phase"] == "RESOLVED" and last["role"] == "challenger"
    assert d["parties"]["defender"]["moves"] == 3
    stopped = Phase[e["phase_before"]].level
    assert [lv["state"] for lv in d["levels"]] == [
        "settled" if lvl < stopped else "ended" if lvl == stopped else "not reached" for lvl in (1, 2, 3, 4)]
    assert d["clocks"]["running"] is None


def test_no_contracts_or_not_a_market_is_said_plainly(world: World, anvil: Any,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = "0x" + "12" * 20
    with pytest.raises(NoContracts, match=f"no contracts deployed at {Web3.to_checksum_address(nowhere)} on chain"):
        ChainView(world.w3, world.artifacts, nowhere, anvil.rpc_url).check_deployed()
    game = world.market.game_address()
    with pytest.raises(NoContracts, match=f"{game} on chain 31337 is not a JobMarket"):
        ChainView(world.w3, world.artifacts, game, anvil.rpc_url).check_deployed()
    assert cli.main(["explorer", "--rpc-url", anvil.rpc_url, "--market", nowhere, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no contracts deployed at" in err


def test_a_chain_that_goes_back_is_read_anew(world: World, anvil: Any) -> None:
    view = _view(world, anvil)
    snap = anvil_mod.snapshot(world.w3)
    client = world.client()
    client.post(TERMS, world.job)
    first = view.snapshot()
    assert list(first["jobs"]) == ["1"] and first["jobs"]["1"]["events"][0]["name"] == "JobPosted"
    anvil_mod.revert(world.w3, snap)  # as if the node restarted from an older state
    anvil_mod.mine(world.w3, 30)  # ... and grew past the height the view had seen, on other blocks
    again = view.snapshot()
    assert again["jobs"] == {} and again["chain"]["block"] > first["chain"]["block"]
    client.post(TERMS, world.job)
    third = view.snapshot()
    assert [e["block"] for e in third["jobs"]["1"]["events"]] != [e["block"] for e in first["jobs"]["1"]["events"]]
    assert len(third["jobs"]["1"]["events"]) == 1  # the old chain's events are gone from the cache


def test_missing_bundle_is_named(world: World, anvil: Any, tmp_path: Path) -> None:
    world.client().post(TERMS, world.job)
    view = ChainView(world.w3, world.artifacts, world.market.address, anvil.rpc_url, tmp_path / "empty")
    j = view.snapshot()["jobs"]["1"]
    assert j["model"] is None and j["model_note"].startswith("no bundle for spec 0x")
    Bundles(tmp_path / "empty").publish(world.job)
    view._bundle_failed.clear()  # skip the retry delay: a late-published bundle is picked up
    assert view.snapshot()["jobs"]["1"]["model"]["name"] == world.job.spec.name


@pytest.mark.slow
def test_demo_serves_its_own_run(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "verde_chain.cli", "demo", "--steps", "2", "--out", str(tmp_path), "--explorer",
         "--explorer-port", "0", "--explorer-hold"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    out: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "[explorer] still serving" in line:
                break
        text = "".join(out)
        url = re.search(r"\[explorer\] watch this run live at (http://127\.0\.0\.1:\d+/)", text)
        assert url is not None and f"[explorer] still serving {url.group(1)}" in text, text[-3000:]
        site = re.search(r"flipped bit \d+ of element (\d+) of node (\d+) \('([^']+)'\) at training step (\d+)", text)
        assert site is not None, text[-3000:]
        d = requests.get(url.group(1) + "api/disputes/1", timeout=30).json()["dispute"]
        assert d["phase"] == Phase.RESOLVED.name and d["end"]["resolution"] == "STEP"
        assert (d["element"], d["node"], d["node_label"], d["step"]) == (
            int(site.group(1)), int(site.group(2)), site.group(3), int(site.group(4)))
        assert d["end"]["winner_role"] == "challenger" and d["end"]["instruction"]["op"]
        assert requests.get(url.group(1), timeout=30).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

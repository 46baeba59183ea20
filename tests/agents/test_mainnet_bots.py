"""The shipped bots on a mainnet-shaped chain: 12 s blocks, a 30M block gas limit, the mainnet
market profile and the client's default terms (600 s clocks, windows of 50 and 300 blocks).

A client, an honest trainer, a bit-flipping trainer and an honest challenger each run with the
default policy (which accepts these terms at 12 s blocks) on the digits job. Only the waiting
periods are skipped (the chain's clock jumps to the next deadline when every bot is idle and no
game runs); the dispute itself is played move by move in real 12 s blocks. The honest side wins
by the one-step proof within its clocks, and no transaction of any bot used more than 5M gas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.bots import World, node_of
from verde_chain.agents.catalog import Bundles, build_job
from verde_chain.agents.client import JobOffer
from verde_chain.agents.system import Conductor
from verde_chain.chain.anvil import MAINNET_GAS_LIMIT, Anvil, increase_time
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.market_client import Market
from verde_chain.dispute.types import Phase, Resolution
from verde_chain.market.marketparams import MAINNET, split_forfeit
from verde_chain.market.types import ETH, JobStatus, SlotStatus

pytestmark = [pytest.mark.chain, pytest.mark.slow, pytest.mark.realtime]

MOVE_GAS_CAP = 5_000_000
OFFER = JobOffer()  # the client's defaults: digits, 6 steps, clock 600 s, reveal 600 s, challenge 3,600 s


@pytest.fixture(scope="module")
def mainnet_chain() -> Iterator[Anvil]:
    node = Anvil(block_time=12, gas_limit=MAINNET_GAS_LIMIT)
    try:
        yield node
    finally:
        node.stop()


def test_bots_on_a_mainnet_shaped_chain_with_default_terms(mainnet_chain: Anvil, artifacts: Any,
                                                           tmp_path: Path) -> None:
    w3 = mainnet_chain.web3()
    assert w3.eth.get_block("latest")["gasLimit"] == MAINNET_GAS_LIMIT
    deployer = w3.eth.accounts[0]
    game = deploy_contract(w3, artifacts, "DisputeGame", deploy_contract(w3, artifacts, "ScalarVM", sender=deployer).address,
                           sender=deployer)
    market = Market.deploy(w3, artifacts, game.address, MAINNET, sender=deployer)
    job = build_job(OFFER.kind, OFFER.steps, OFFER.job_seed)
    Bundles(tmp_path / "bundles").publish(job)
    world = World(w3, artifacts, market, tmp_path / "bundles", tmp_path, job)
    client = world.client()
    honest = world.trainer(2)
    cheat = world.trainer(3, f"bitflip:2:{node_of(job, 'matmul')}:1:3")
    ch = world.challenger()
    job_id = client.post(OFFER, job)
    conductor = Conductor(w3, artifacts, market.address, world.bots, log=lambda m: None)
    games_running = lambda: any(not g.get("done") for b in world.bots for g in b.store.games().values()) \
        or market.job(job_id).active_disputes > 0
    end = time.monotonic() + 1_500
    while (client.store.job(job_id) or {}).get("state") != "done" or games_running():
        assert time.monotonic() < end, "the job was not over after 25 minutes"
        if conductor.round() or games_running():
            time.sleep(0.5)  # a game is played in real blocks: no clock moves
            continue
        target = conductor.next_deadline()  # every bot idle, no game: skip the waiting period
        if target is not None:
            increase_time(w3, target - conductor.now() + 1)

    (opened,) = market.logs("DisputeOpened", 0)
    v = ch.games.game(int(opened.args["gameId"]))
    assert v.phase == Phase.RESOLVED and v.winner == ch.address and v.resolution == Resolution.STEP
    assert v.challenger_left > 0  # within its 600 s clock at 12 s a move
    bad = market.slot_of(job_id, cheat.address)
    assert market.slot(job_id, bad).status == SlotStatus.REJECTED
    assert market.job(job_id).status == JobStatus.FINALIZED
    assert market.job(job_id).accepted_result == honest.plans[job_id].result()
    burnt, paid = split_forfeit(OFFER.trainer_stake, MAINNET.burn_bps)
    assert world.withdrawn(honest) == OFFER.trainer_stake + OFFER.reward
    assert world.withdrawn(ch) == OFFER.min_challenge_bond + paid
    assert market.token_balance(ETH) == market.total_owed(ETH) == market.burned() == burnt
    gas = {b.name: max(t.gas_used or 0 for t in b.store.txs()) for b in world.bots}
    assert max(gas.values()) <= MOVE_GAS_CAP, gas
    moves = [t for t in ch.store.txs() + cheat.store.txs() if t.game_id is not None]
    assert len(moves) >= 10
    # the challenger also steps at once (anyone may); if the defender's own step lands in the same
    # block, the second one finds the game over, and says so by name
    assert all(t.status == "mined" or (t.kind, t.error) == ("step", "GameAlreadyResolved") for t in ch.store.txs())

"""Issue #13's dispute flood against the shipped trainer bot, in real time: 1 s blocks, an 8 s chess
clock, 20 disputes opened against one honest result in one block.

Before, the bot sent one transaction per receipt and played its games one after another: it
answered 8 of 16 games in time and lost the rest on time. Now it submits every due move at once
(pipelined nonces), most urgent clock first, and plays every game concurrently; here it must
answer all 20 games, win every one, and be paid every bond's unburned half. Nothing moves the
chain's clock while the games run: the bot keeps up with real 1 s blocks or loses.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3
from web3.exceptions import TransactionNotFound

from tests.support.bots import World, node_of
from verde_chain.agents.client import JobOffer
from verde_chain.agents.policy import Policy
from verde_chain.agents.strategies import challenger_plan
from verde_chain.chain.anvil import Anvil, increase_time
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.types import Phase, Resolution, Side
from verde_chain.job import Job
from verde_chain.market.marketparams import FAST, split_forfeit
from verde_chain.market.types import ETH, JobStatus, SlotStatus

pytestmark = [pytest.mark.chain, pytest.mark.slow]

CLOCK = 8  # the clock; the fast profile's floor is 10 blocks, so this market lowers it
DISPUTES = 20
FIRST_SYBIL = 5  # Anvil accounts 5 .. 24 open the disputes
PARAMS = replace(FAST, min_clock_seconds=CLOCK)
OFFER = JobOffer(kind="digits", steps=3, reward=10**18, trainer_stake=2 * 10**17, min_challenge_bond=2 * 10**16,
                 slots=1, submission_window=120, reveal_window=PARAMS.min_reveal_window,
                 challenge_window=PARAMS.min_challenge_window, arity=4, clock_seconds=CLOCK)


@pytest.fixture(scope="module")
def fast_chain() -> Iterator[Anvil]:
    node = Anvil(block_time=1, accounts=FIRST_SYBIL + DISPUTES)
    try:
        yield node
    finally:
        node.stop()


def rpc(w3: Web3, method: str, *params: Any) -> Any:
    res = w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
    assert "error" not in res, res
    return res.get("result")


class Sybils(threading.Thread):
    """The flood's challengers, on their own thread: each believes a faulty execution and makes
    `budget[game]` moves (0 to 3) before it goes silent, so the defender must answer each game a
    different number of times and then claim the timeout."""

    def __init__(self, w3: Web3, games: DisputeGameClient, job: Job, budget: dict[int, int]) -> None:
        super().__init__(daemon=True)
        lie = challenger_plan(f"lying:2:{node_of(job, 'matmul')}:1:3", job).world
        self.w3, self.games, self.budget = w3, games, budget
        self.players = {g: pl.Challenger(lie) for g in budget}
        self.made: Counter[int] = Counter()
        self.inflight: dict[int, Any] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for g, player in self.players.items():
                    if g in self.inflight:
                        try:
                            self.w3.eth.get_transaction_receipt(self.inflight[g])
                        except TransactionNotFound:
                            continue
                        del self.inflight[g]
                    v = self.games.game(g)
                    if v.phase == Phase.RESOLVED or v.phase.mover != Side.CHALLENGER or self.made[g] >= self.budget[g]:
                        continue
                    move = player.move(v, runner.seen_from_history(self.games, g))
                    if move is not None:
                        self.inflight[g] = self.games.move_call(g, move).transact({"from": v.challenger})
                        self.made[g] += 1
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


def test_dispute_flood_20_games_in_one_block_honest_trainer_bot_wins_every_game(
        fast_chain: Anvil, artifacts: Any, bundles: Path, job: Job, tmp_path: Path) -> None:
    w3 = fast_chain.web3()
    deployer = w3.eth.accounts[0]
    vm = deploy_contract(w3, artifacts, "ScalarVM", sender=deployer)
    game = deploy_contract(w3, artifacts, "DisputeGame", vm.address, sender=deployer)
    market = Market.deploy(w3, artifacts, game.address, PARAMS, sender=deployer)
    # the 8 s clock is shorter than a whole game takes at 1 s blocks (the default policy
    # refuses such a job); the flood's sybils stop within three moves, so this bot is told to take it
    world = World(w3, artifacts, market, bundles, tmp_path, job, policy=Policy(clock_margin=0.0))
    client, trainer = world.client(), world.trainer(2)
    job_id = client.post(OFFER, job)
    for _ in range(600):  # join, train, commit; then the reveal window opens and it reveals
        trainer.tick()
        s = market.slots(job_id)
        wait = market.job(job_id).terms.submission_deadline - market_now(w3) + 1
        if s and s[0].status == SlotStatus.COMMITTED and wait > 0:
            increase_time(w3, wait)
        if s and s[0].status == SlotStatus.REVEALED:
            break
        time.sleep(0.1)
    assert market.slot(job_id, 0).status == SlotStatus.REVEALED

    # the flood: 20 accounts dispute the honest result in one block (mining paused meanwhile),
    # each with a bond above what the 17th to 20th games are asked (two steps of 16)
    bond = 2 * OFFER.min_challenge_bond
    sybils = w3.eth.accounts[FIRST_SYBIL:FIRST_SYBIL + DISPUTES]
    rpc(w3, "evm_setIntervalMining", 0)
    hashes = [market.contract.functions.openDispute(job_id, 0, bond).transact({"from": s, "value": bond, "gas": 900_000})
              for s in sybils]
    rpc(w3, "evm_mine")
    rpc(w3, "evm_setIntervalMining", 1)
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=60) for h in hashes]
    assert all(r["status"] == 1 for r in receipts)
    assert len({r["blockNumber"] for r in receipts}) == 1
    opened = market.logs("DisputeOpened", 0)
    gids = [int(e.args["gameId"]) for e in opened]
    assert len(gids) == DISPUTES and market.job(job_id).active_disputes == DISPUTES
    games = DisputeGameClient(w3, game, artifacts)
    assert {games.game(g).defender_left for g in gids} == {CLOCK}

    sybil_side = Sybils(w3, games, job, {g: i % 4 for i, g in enumerate(gids)})
    sybil_side.start()
    deadline = time.monotonic() + 300
    try:
        while not all(games.game(g).phase == Phase.RESOLVED for g in gids):
            assert time.monotonic() < deadline, "the flood was not over after 300 s"
            assert sybil_side.error is None, sybil_side.error
            if not trainer.tick():
                time.sleep(0.1)
    finally:
        sybil_side.stop.set()
        sybil_side.join(30)
    assert sybil_side.error is None, sybil_side.error
    trainer.tick()  # settles its last timeout claims and records every resolution

    views = {g: games.game(g) for g in gids}
    assert {g: v.winner for g, v in views.items()} == {g: trainer.address for g in gids}
    assert {v.resolution for v in views.values()} == {Resolution.TIMEOUT}  # the sybils' clocks, never its own
    # it answered every game the sybils played, as often as they moved, and played them at once:
    # many of its moves share a block (one transaction per receipt would put one per block)
    mine = [t for t in trainer.store.txs() if t.game_id in views]
    assert all(t.status == "mined" for t in mine)
    assert all(rec["done"] and rec["won"] for rec in trainer.store.games().values())
    answers = Counter(t.game_id for t in mine if t.kind != "claimTimeout")
    assert all(answers[g] >= sybil_side.made[g] + 1 for g in gids), (answers, sybil_side.made)
    per_block = Counter(w3.eth.get_transaction_receipt(t.hash)["blockNumber"] for t in mine)
    assert max(per_block.values()) >= DISPUTES // 2, per_block

    # every bond forfeited: half burned, half to the defender; the job then pays it as usual
    burnt, paid = split_forfeit(bond, PARAMS.burn_bps)
    assert market.balance_of(trainer.address) == DISPUTES * paid
    assert market.burned() == DISPUTES * burnt
    increase_time(w3, market.challenge_deadline(job_id) - market_now(w3) + 1)
    for _ in range(100):
        if (trainer.store.job(job_id) or {}).get("state") == "done":
            break
        client.tick()
        trainer.tick()
        time.sleep(0.1)
    assert market.job(job_id).status == JobStatus.FINALIZED
    assert world.withdrawn(trainer) == DISPUTES * paid + OFFER.trainer_stake + OFFER.reward
    assert market.token_balance(ETH) == market.total_owed(ETH) == market.burned()


def market_now(w3: Web3) -> int:
    return int(w3.eth.get_block("latest")["timestamp"])

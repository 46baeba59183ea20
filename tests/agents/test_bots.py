"""The bots on Anvil: client, trainers and challengers driven in-process (and one as a real
subprocess killed with SIGKILL), each with its own SQLite file, over JSON-RPC.

Every scenario is a tiny digits job (T = 3) posted through the JobMarket and, when someone
cheats, disputed through the DisputeGame with the real ScalarVM one-step prover. Each ends with
the market's books checked: what it holds equals what it owes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from tests.support.bots import STEPS, TERMS, World, finished, node_of, reveal_time
from verde_chain.agents.bot import Bot
from verde_chain.agents.catalog import Bundles, check_against_chain
from verde_chain.agents.challenger import ChallengerBot
from verde_chain.agents.client import JobOffer
from verde_chain.agents.errors import CrashInjected, StrategyError
from verde_chain.agents.store import Store
from verde_chain.agents.strategies import (
    challenger_plan,
    parse_cheat,
    trainer_plan,
)
from verde_chain.agents.wallet import account
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.market_client import Market
from verde_chain.dispute.types import Phase, Resolution
from verde_chain.graph.world import OutputFault
from verde_chain.job import Job
from verde_chain.market.marketparams import FAST, split_forfeit
from verde_chain.market.types import ETH, JobStatus, SlotStatus, reward_share

REPO = Path(__file__).resolve().parents[2]
STAKE_BURN, STAKE_PAID = split_forfeit(2 * 10**17, FAST.burn_bps)  # TERMS' stake, forfeited
BOND_BURN, BOND_PAID = split_forfeit(10**17, FAST.burn_bps)  # TERMS' bond, forfeited


# -- off-chain pieces (no chain) -----------------------------------------------------------------

def test_account_keys_are_anvils_funded_accounts() -> None:
    # the standard test mnemonic's first accounts, as Anvil prints them
    assert account(0).address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert account(1).address == "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"


def test_strategies_parse_and_refuse_nonsense(job: Job) -> None:
    assert parse_cheat("2:19:5") == OutputFault(2, 19, 5, 0)
    assert parse_cheat("1:2:3:30") == OutputFault(1, 2, 3, 30)
    for bad in ("1:2", "a:b:c", "1:2:3:4:5"):
        with pytest.raises(StrategyError):
            parse_cheat(bad)
    with pytest.raises(StrategyError):
        trainer_plan("bitflip:9:0:0", job)  # step out of range
    with pytest.raises(StrategyError):
        trainer_plan("sneaky", job)
    with pytest.raises(StrategyError):
        challenger_plan("lazy", job)  # a trainer-only strategy
    for bad in ("micro:1:2:3", "micro:1:19:0:99999"):  # no micro-step; one past the program
        with pytest.raises(StrategyError):
            trainer_plan(bad, job)


def test_every_cheat_changes_the_result_and_honest_agree(job: Job) -> None:
    honest = trainer_plan("honest", job).result()
    assert challenger_plan("honest", job).result() == honest
    d = next(n.index for n in job.program.graph.nodes if n.label == "reduce_sum")  # the output bias's gradient
    for s in ("lazy", "poison", "inconsistent", "garbage", "silent", "bitflip", f"bitflip:2:{d}:1:3", f"micro:2:{d}:1:1"):
        assert trainer_plan(s, job, seed=1).result() != honest, s
    # a drawn cheat site is reproducible from the seed
    assert trainer_plan("bitflip", job, seed=5).fault == trainer_plan("bitflip", job, seed=5).fault


def test_bundle_must_match_the_posted_commitments(job: Job, bundles: Path) -> None:
    from verde_chain.market.types import JobTerms

    fetched = Bundles(bundles).fetch(job.spec.hash())
    spec = JobTerms(ETH, job.spec.hash(), "", job.spec.graph_root, job.spec.initial_commitment, job.spec.batch_root,
                    STEPS, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, job.spec.num_nodes)
    assert check_against_chain(fetched, spec) is None
    assert check_against_chain(fetched, spec.__class__(**{**spec.__dict__, "batch_root": b"\x01" * 32})) == "batchRoot"


# -- scenarios on chain ----------------------------------------------------------------------------

@pytest.mark.chain
def test_sender_finds_a_broadcast_transaction_it_never_marked_sent(w3: Web3, artifacts: Any, deploy: Callable[..., Any],
                                                                    tmp_path: Path) -> None:
    """A bot that died right after broadcasting (its row still says 'signed') finds the
    transaction by hash on restart; one that died before broadcasting has its row dropped, and
    the next transaction reuses the nonce."""
    from verde_chain.agents.wallet import Sender

    market = Market.deploy(w3, artifacts, deploy("GameMock").address, FAST)
    acct = account(6)
    store = Store(tmp_path / "s.sqlite")
    sender = Sender(w3, artifacts, acct, store)
    nonce = w3.eth.get_transaction_count(acct.address, "pending")
    fn = market.contract.functions.finalize(1)  # reverts (UnknownJob) when mined: status 0 is recorded too
    tx = fn.build_transaction({"from": acct.address, "nonce": nonce, "gas": 100_000, "gasPrice": w3.eth.gas_price,
                               "chainId": w3.eth.chain_id})
    signed = acct.sign_transaction(tx)
    store.add_tx(acct.address, nonce, "finalize", bytes(signed.raw_transaction), "0x" + bytes(signed.hash).hex(), None, 0)
    w3.eth.send_raw_transaction(signed.raw_transaction)  # ... and the bot dies here
    sender.crash_before_broadcast = True
    with pytest.raises(CrashInjected):  # a second one is signed and stored, never sent
        sender.send(market.contract.functions.withdraw(ETH), "withdraw", gas=100_000)
    reborn = Sender(w3, artifacts, acct, Store(tmp_path / "s.sqlite"))
    assert reborn.recover() == [2]
    rows = reborn.store.txs()
    assert [r.status for r in rows] == ["failed", "dropped"] and rows[0].gas_used and rows[0].gas_used > 21_000
    assert w3.eth.get_transaction_count(acct.address) == nonce + 1  # the dropped one never used its nonce


@pytest.mark.chain
def test_honest_job_is_accepted_and_paid(world: World) -> None:
    client = world.client()
    t0, t1 = world.trainer(2), world.trainer(3)
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    world.run(finished(client, job_id, world.bots))
    job = world.market.job(job_id)
    honest = trainer_plan("honest", world.job).result()
    assert job.status == JobStatus.FINALIZED and job.accepted_result == honest
    assert [s.status for s in world.market.slots(job_id)] == [SlotStatus.SETTLED, SlotStatus.SETTLED]
    assert world.market.logs("DisputeOpened", 0) == [] and ch.store.games() == {}
    # each trainer got its stake back and its share of the reward, and withdrew it
    paid = sorted([world.withdrawn(t0), world.withdrawn(t1)])
    assert paid == sorted(TERMS.trainer_stake + reward_share(TERMS.reward, 2, r) for r in (0, 1))
    assert world.market.balance_of(t0.address) == world.market.balance_of(t1.address) == 0
    world.solvent()


CHEATS = [
    ("bitflip-matmul", lambda j: f"bitflip:2:{node_of(j, 'matmul')}:1:3", Resolution.STEP),
    ("bitflip-exp", lambda j: f"bitflip:1:{node_of(j, 'ce/sub_exp')}:7:22", Resolution.STEP),  # read by ce_bwd too
    ("lazy", lambda j: "lazy:1", Resolution.TIMEOUT),
    ("poison", lambda j: "poison:2", Resolution.TIMEOUT),
    ("inconsistent", lambda j: "inconsistent", Resolution.TIMEOUT),
    ("garbage", lambda j: f"garbage:3:{node_of(j, 'matmul')}:0", Resolution.TIMEOUT),
]


@pytest.mark.chain
@pytest.mark.parametrize("name,strategy,resolution", CHEATS, ids=[c[0] for c in CHEATS])
def test_cheating_trainer_is_caught(world: World, name: str, strategy: Callable[[Job], str],
                                    resolution: Resolution) -> None:
    client = world.client()
    honest, cheat = world.trainer(2), world.trainer(3, strategy(world.job))
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    world.run(finished(client, job_id, world.bots))
    (gid, rec), = ch.store.games().items()
    v = ch.games.game(gid)
    assert v.winner == ch.address and rec["won"] and v.resolution == resolution, (v.resolution, cheat.store.games())
    if resolution == Resolution.STEP:  # narrowed to the very site of the flipped bit
        f = cheat.plan(job_id).fault
        assert f is not None and (v.step, v.node_index, v.element) == (f.step, f.node, f.element)
    slots = world.market.slots(job_id)
    assert slots[world.market.slot_of(job_id, cheat.address)].status == SlotStatus.REJECTED
    assert slots[world.market.slot_of(job_id, honest.address)].status == SlotStatus.SETTLED
    assert world.market.job(job_id).accepted_result == trainer_plan("honest", world.job).result()
    # the challenger gets its bond back plus the cheater's stake less the burned half; the honest
    # trainer the whole reward
    assert world.withdrawn(ch) == TERMS.min_challenge_bond + STAKE_PAID
    assert world.withdrawn(honest) == TERMS.trainer_stake + TERMS.reward
    assert world.withdrawn(cheat) == 0
    assert world.market.burned() == STAKE_BURN
    world.solvent()


@pytest.mark.chain
def test_rival_trainers_dispute_each_other_and_the_honest_one_wins(world: World) -> None:
    """No outside challenger: both trainers dispute differing rivals, each with a bond and its own
    result at stake. Every game (honest attacks cheater, cheater attacks honest) ends for the
    honest trainer, which gets its bond back, the cheater's stake (and bond, if the cheater
    attacked) less the burn, and the whole reward."""
    client = world.client()
    honest = world.trainer(2, rivals=True)
    cheat = world.trainer(3, f"bitflip:2:{node_of(world.job, 'sgd/sgd_param')}:3:7", rivals=True)
    job_id = client.post(TERMS, world.job)
    world.run(finished(client, job_id, world.bots))
    games = honest.store.games()
    assert sorted(g["role"] for g in games.values()) in (["challenger"], ["challenger", "defender"])
    assert all(g["won"] for g in games.values()) and not any(g["won"] for g in cheat.store.games().values())
    assert world.market.slot(job_id, world.market.slot_of(job_id, cheat.address)).status == SlotStatus.REJECTED
    defended = sum(1 for g in games.values() if g["role"] == "defender")
    assert world.withdrawn(honest) == (TERMS.trainer_stake + TERMS.reward + TERMS.min_challenge_bond + STAKE_PAID
                                       + defended * BOND_PAID)
    assert world.withdrawn(cheat) == 0
    world.solvent()


@pytest.mark.chain
def test_lying_challenger_loses_its_bond(world: World) -> None:
    client = world.client()
    honest = world.trainer(2)
    liar = world.challenger(5, f"lying:2:{node_of(world.job, 'sgd/sgd_param')}:4:9")
    job_id = client.post(JobOffer(**{**TERMS.__dict__, "slots": 1}), world.job)
    world.run(finished(client, job_id, world.bots))
    (gid, rec), = honest.store.games().items()
    v = honest.games.game(gid)
    assert v.winner == honest.address and rec["won"] and v.resolution == Resolution.STEP
    assert world.market.slot(job_id, 0).status == SlotStatus.SETTLED
    assert world.withdrawn(honest) == TERMS.trainer_stake + TERMS.reward + BOND_PAID
    assert world.withdrawn(liar) == 0 and world.market.balance_of(liar.address) == 0
    world.solvent()


@pytest.mark.chain
def test_silent_cheater_loses_on_time(world: World) -> None:
    client = world.client()
    honest, cheat = world.trainer(2), world.trainer(3, f"silent:3:2:{node_of(world.job, 'matmul')}:1")
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    world.run(finished(client, job_id, world.bots))
    (gid, _), = ch.store.games().items()
    v = ch.games.game(gid)
    assert v.winner == ch.address and v.resolution == Resolution.TIMEOUT
    assert cheat.store.moves(gid) == 3 and cheat.store.game(gid)["went_silent"]
    assert world.withdrawn(ch) == TERMS.min_challenge_bond + STAKE_PAID
    assert world.withdrawn(honest) == TERMS.trainer_stake + TERMS.reward
    world.solvent()


@pytest.mark.chain
def test_silent_challenger_loses_its_bond(world: World) -> None:
    client = world.client()
    honest = world.trainer(2)
    world.challenger(5, f"silent:2:2:{node_of(world.job, 'sgd/sgd_param')}:4")
    job_id = client.post(JobOffer(**{**TERMS.__dict__, "slots": 1}), world.job)
    world.run(finished(client, job_id, world.bots))
    (gid, rec), = honest.store.games().items()
    assert rec["won"] and honest.games.game(gid).resolution == Resolution.TIMEOUT
    assert world.withdrawn(honest) == TERMS.trainer_stake + TERMS.reward + BOND_PAID
    world.solvent()


@pytest.mark.chain
def test_challenger_crashes_mid_dispute_and_resumes_from_sqlite(world: World) -> None:
    """The honest challenger dies at the worst moment (a move signed and stored, not broadcast)
    in the middle of level 2; a new bot built from the same SQLite file drops the unsent
    transaction, re-derives its move from the chain and wins."""
    client = world.client()
    world.trainer(2)
    cheat = world.trainer(3, f"bitflip:2:{node_of(world.job, 'matmul')}:1:3")
    ch = world.challenger()
    job_id = client.post(TERMS, world.job)
    def at_l2_choice() -> bool:
        return any(ch.games.game(g).phase == Phase.L2_CHOOSE for g in ch.store.games())

    for _ in range(100):  # tick bot by bot (not round by round) to stop exactly at the challenger's L2 turn
        if at_l2_choice():
            break
        for b in world.bots:
            if at_l2_choice():
                break
            b.tick()
        reveal_time(world, job_id)
    assert at_l2_choice()
    ch.sender.crash_before_broadcast = True
    with pytest.raises(CrashInjected):
        ch.tick()
    (gid, _), = ch.store.games().items()
    assert ch.games.game(gid).phase == Phase.L2_CHOOSE  # the move never reached the chain
    db = ch.cfg.db
    ch.close()
    world.bots.remove(ch)  # the old bot object is gone for good: nothing of it is reused
    reborn = ChallengerBot(world.w3, world.artifacts, world.cfg("challenger-4", 4), log=lambda m: None)
    assert [t.status for t in reborn.store.txs() if t.game_id == gid][-1] == "dropped"
    assert reborn.cfg.db == db and gid in reborn.store.games()
    world.bots.append(reborn)
    world.run(finished(client, job_id, world.bots))
    v = reborn.games.game(gid)
    assert v.winner == reborn.address and v.resolution == Resolution.STEP
    assert world.market.slot(job_id, world.market.slot_of(job_id, cheat.address)).status == SlotStatus.REJECTED
    assert world.withdrawn(reborn) == TERMS.min_challenge_bond + STAKE_PAID
    world.solvent()


def _spawn_challenger(world: World, db: Path) -> subprocess.Popen[str]:
    return _spawn(world, "challenger", 4, db)


def _spawn(world: World, role: str, account_index: int, db: Path) -> subprocess.Popen[str]:
    url = getattr(world.w3.provider, "endpoint_uri", "")
    cmd = [sys.executable, "-m", "verde_chain.cli", role, "run", "--rpc-url", str(url),
           "--market", world.market.address, "--account", str(account_index), "--db", str(db),
           "--bundles", str(world.bundles), "--poll", "0.1"]
    log = open(db.with_suffix(".log"), "a")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait(cond: Callable[[], bool], others: list[Bot], timeout: float, proc: subprocess.Popen[str],
          each: Callable[[], None] = lambda: None) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        assert proc.poll() is None, f"challenger exited with {proc.returncode}"
        for b in others:
            b.tick()
        each()
        time.sleep(0.05)


@pytest.mark.chain
def test_challenger_process_sigkilled_mid_dispute_still_wins(world: World) -> None:
    """A real `verde-chain challenger run` process is SIGKILLed in the middle of the game and
    restarted on the same database; it finishes the game and wins. (One clock jump, to the reveal
    window; otherwise the in-process bots tick in real time while the subprocess follows the chain
    by itself.)"""
    client = world.client()
    world.trainer(2)
    cheat = world.trainer(3, f"bitflip:2:{node_of(world.job, 'matmul')}:1:3")
    job_id = client.post(TERMS, world.job)
    db = world.tmp / "challenger-proc.sqlite"
    game = lambda: world.market.logs("DisputeOpened", 0)
    phase = lambda: cheat.games.game(1 if not game() else int(game()[0].args["gameId"])).phase
    proc = _spawn_challenger(world, db)
    try:
        _wait(lambda: bool(game()) and phase().level >= 2 and phase() != Phase.RESOLVED, [client, *world.bots[1:]],
              120, proc, lambda: reveal_time(world, job_id))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        mid = phase()
        assert mid != Phase.RESOLVED
        proc = _spawn_challenger(world, db)
        _wait(lambda: phase() == Phase.RESOLVED, world.bots[1:], 120, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    gid = int(game()[0].args["gameId"])
    v = cheat.games.game(gid)
    assert v.winner == account(4).address and v.resolution == Resolution.STEP, v.resolution
    assert len(game()) == 1  # the restarted bot did not open a second dispute
    said = re.search(rf"resuming game {gid} at L([234]) as the challenger \((my|their) move\), (\d+) s on my clock",
                     db.with_suffix(".log").read_text())
    assert said and int(said[1]) >= mid.level and 0 < int(said[3]) <= TERMS.clock_seconds, said
    assert world.market.slot(job_id, world.market.slot_of(job_id, cheat.address)).status == SlotStatus.REJECTED
    world.solvent()


@pytest.mark.chain
def test_trainer_process_sigkilled_between_commit_and_reveal_still_reveals(world: World) -> None:
    """A real `verde-chain trainer run` process is SIGKILLed once its commitment is mined and
    before the reveal window opens. The salt was stored before the commitment was sent, so the
    process restarted on the same database reveals the same C_T in the window, keeps its stake and
    is paid."""
    client = world.client()
    job_id = client.post(replace(TERMS, slots=1), world.job)
    db = world.tmp / "trainer-proc.sqlite"
    slot = lambda: world.market.slots(job_id)
    proc = _spawn(world, "trainer", 2, db)
    try:
        _wait(lambda: bool(slot()) and slot()[0].status == SlotStatus.COMMITTED, [client], 180, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        rec = Store(db).job(job_id) or {}
        # the commitment is mined; the salt and C_T were stored before it was sent (the record may
        # not say "committed" yet: the kill can land between the receipt and that write)
        assert rec["state"] in ("joined", "committed") and len(rec["salt"]) == 66 and len(rec["result"]) == 66
        reveal_time(world, job_id)
        proc = _spawn(world, "trainer", 2, db)
        _wait(lambda: slot()[0].status == SlotStatus.REVEALED, [client], 180, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert slot()[0].result == trainer_plan("honest", world.job).result()
    assert len(world.market.logs("ResultCommitted", 0)) == 1  # committed once, before the kill
    increase_time(world.w3, world.market.challenge_deadline(job_id) - int(world.w3.eth.get_block("latest")["timestamp"]) + 1)
    world.run(lambda: (client.store.job(job_id) or {}).get("state") == "done")
    assert world.market.job(job_id).accepted_result == slot()[0].result
    assert world.market.balance_of(account(2).address) == TERMS.trainer_stake + TERMS.reward  # not withdrawn: it was stopped
    world.solvent()

"""A mainnet-shaped chain: 12 s blocks, a 30M block gas limit, the mainnet market profile and the
default job terms (clock, windows, bond). A 200-step job over real RepOps kernels (refereed by
the real ScalarVM) runs its whole life: post, join, commit, reveal, an honest challenger disputes
the cheater, the game is played move by move in real 12 s blocks, finalize, withdraw. The honest
side wins with the default clocks, and no transaction uses more than 5M gas (read from receipts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from web3 import Web3

from verde_chain.agents.client import JobOffer
from verde_chain.chain.anvil import MAINNET_GAS_LIMIT, Anvil, increase_time
from verde_chain.chain.compile import Artifact
from verde_chain.chain.deploy import deploy_contract, deploy_market
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.cheats import MicroFault
from verde_chain.dispute.kernel_world import KernelJob, KernelWorld
from verde_chain.dispute.types import Resolution
from verde_chain.market.marketparams import MAINNET, split_forfeit
from verde_chain.market.types import ETH, ZERO32, JobTerms, SlotStatus, commitment

pytestmark = [pytest.mark.chain, pytest.mark.slow, pytest.mark.realtime]

BLOCK_SECONDS = 12
MOVE_GAS_CAP = 5_000_000
T, N, K = 200, 20, 16
CHEAT_STEP = 137


@pytest.fixture(scope="module")
def mainnet_chain() -> Iterator[Anvil]:
    node = Anvil(block_time=BLOCK_SECONDS, gas_limit=MAINNET_GAS_LIMIT)
    try:
        yield node
    finally:
        node.stop()


def send_all(w3: Web3, calls: list[tuple[Any, str, int]]) -> list[Any]:
    """Send several transactions (call, sender, value) without waiting between them, so they can
    share a block; return their receipts."""
    hashes = [fn.transact({"from": sender, "value": value}) for fn, sender, value in calls]
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=120) for h in hashes]
    assert all(r["status"] == 1 for r in receipts), receipts
    return receipts


def test_mainnet_shaped_chain_honest_side_wins_with_default_clocks(mainnet_chain: Anvil,
                                                                    artifacts: dict[str, Artifact]) -> None:
    w3 = mainnet_chain.web3()
    assert w3.eth.get_block("latest")["gasLimit"] == MAINNET_GAS_LIMIT
    deployer, client_acct, good, cheater, challenger = w3.eth.accounts[:5]
    game = deploy_contract(w3, artifacts, "DisputeGame", deploy_contract(w3, artifacts, "ScalarVM", sender=deployer).address,
                           sender=deployer)
    market = Market(w3, artifacts, deploy_market(w3, artifacts, game.address, MAINNET, sender=deployer))
    offer = JobOffer()  # the default clock, windows, stake, bond and reward
    job = KernelJob(T, seed=3)
    honest = KernelWorld(job)
    liar = KernelWorld(job, MicroFault(CHEAT_STEP, 3, 5, job.nodes[3][0].num_steps, bit=0))  # a lie in W
    c_true, c_bad = honest.step_commitment(T), liar.step_commitment(T)
    assert c_true != c_bad
    now = int(w3.eth.get_block("latest")["timestamp"])
    terms = JobTerms(
        token=ETH, spec_hash=b"\x42" * 32, bundle_uri="https://bundles.example/kernel-job", graph_root=job.graph_root,
        initial_commitment=honest.step_commitment(0), batch_root=job.batch_root, num_steps=T, checkpoint_interval=N,
        reward=offer.reward, trainer_stake=offer.trainer_stake, min_challenge_bond=offer.min_challenge_bond, slots=2,
        submission_deadline=now + offer.submission_window, reveal_window=offer.reveal_window,
        challenge_window=offer.challenge_window, arity=K, clock_seconds=offer.clock_seconds, num_nodes=job.num_nodes,
    )
    f = market.contract.functions
    receipts = send_all(w3, [(f.postJob(terms.as_tuple()), client_acct, terms.reward)])
    job_id = 1
    salts = {good: b"\x01" * 32, cheater: b"\x02" * 32}
    results = {good: c_true, cheater: c_bad}
    receipts += send_all(w3, [(f.join(job_id), t, terms.trainer_stake) for t in (good, cheater)])
    receipts += send_all(w3, [(f.commit(job_id, commitment(results[t], ZERO32, salts[t], t)), t, 0)
                              for t in (good, cheater)])
    increase_time(w3, terms.submission_deadline - int(w3.eth.get_block("latest")["timestamp"]) + 1)
    receipts += send_all(w3, [(f.reveal(job_id, results[t], ZERO32, salts[t]), t, 0) for t in (good, cheater)])
    bad_slot = market.slot_of(job_id, cheater)
    bond = market.required_bond(job_id, bad_slot)
    receipts += send_all(w3, [(f.openDispute(job_id, bad_slot, bond), challenger, bond)])
    (opened,) = market.logs("DisputeOpened", 0)
    gid = int(opened.args["gameId"])
    gclient = DisputeGameClient(w3, game, artifacts)
    out = runner.play(gclient, gid, pl.Defender(liar), pl.Challenger(honest), lambda s: increase_time(w3, s))
    # the honest challenger won on the chain's own 12 s blocks, by the one-step proof, not on time
    assert out.winner == challenger and out.resolution == Resolution.STEP
    assert out.final is not None and out.final.step == CHEAT_STEP and out.final.checkpoint_interval == N
    assert market.slot(job_id, bad_slot).status is SlotStatus.REJECTED
    increase_time(w3, market.challenge_deadline(job_id) - int(w3.eth.get_block("latest")["timestamp"]) + 1)
    receipts += send_all(w3, [(f.finalize(job_id), client_acct, 0)])
    assert market.job(job_id).accepted_result == c_true
    burnt, paid = split_forfeit(terms.trainer_stake, MAINNET.burn_bps)
    assert market.balance_of(challenger) == bond + paid
    assert market.balance_of(good) == terms.trainer_stake + terms.reward
    receipts += send_all(w3, [(f.withdraw(ETH), who, 0) for who in (good, challenger)])
    assert w3.eth.get_balance(market.address) == market.total_owed() == market.burned() == burnt
    # no transaction of the job's life, game moves included, came near the block: all <= 5M gas
    gas = [int(r["gasUsed"]) for r in receipts] + [m.gas for m in gclient.moves]
    assert len(gclient.moves) == out.total_moves("defender") + out.total_moves("challenger")
    assert max(gas) <= MOVE_GAS_CAP, max(gas)

"""Deploy the whole system (ScalarVM -> DisputeGame -> JobMarket) and drive bots in one process.

``Conductor`` runs bots round-robin on one thread (deterministic, no locking) and, when a whole
round does nothing, moves the chain's clock to the next deadline that could unblock someone (a
submission or challenge deadline, or the clock of the party to move in a game). On a real network
time passes by itself; on Anvil this lets a scenario that spans hours of protocol time run in
seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from web3 import Web3

from verde_chain.chain.anvil import increase_time
from verde_chain.chain.compile import Artifact
from verde_chain.chain.deploy import DeploymentRecord, deploy_contract, deploy_market
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.dispute.types import Phase
from verde_chain.errors import ChainError
from verde_chain.market.marketparams import MAINNET, MarketParams
from verde_chain.market.types import JobStatus

if TYPE_CHECKING:
    from verde_chain.agents.bot import Bot

# Constructor-less helpers deployed next to the system (kept: tools and tests use them).
HELPER_CONTRACTS = ["MerkleHarness"]
SYSTEM_CONTRACTS = ["ScalarVM", "DisputeGame", "JobMarket"]


def deploy_full_system(w3: Web3, artifacts: Mapping[str, Artifact], rpc_url: str, sender: str | None = None,
                       params: MarketParams = MAINNET) -> tuple[DeploymentRecord, dict[str, Any]]:
    """Deploy the system; the JobMarket gets `params` (immutable; the mainnet profile by default)."""
    sender = sender or w3.eth.accounts[0]
    out: dict[str, Any] = {n: deploy_contract(w3, artifacts, n, sender=sender) for n in HELPER_CONTRACTS}
    out["ScalarVM"] = deploy_contract(w3, artifacts, "ScalarVM", sender=sender)
    out["DisputeGame"] = deploy_contract(w3, artifacts, "DisputeGame", out["ScalarVM"].address, sender=sender)
    out["JobMarket"] = deploy_market(w3, artifacts, out["DisputeGame"].address, params, sender=sender)
    names = HELPER_CONTRACTS + SYSTEM_CONTRACTS
    record = DeploymentRecord(
        chain_id=w3.eth.chain_id, rpc_url=rpc_url, block=w3.eth.block_number, deployer=sender,
        contracts={n: out[n].address for n in names}, abi_hashes={n: artifacts[n].abi_hash for n in names},
        market_params=asdict(params),
    )
    return record, out


class Conductor:
    def __init__(self, w3: Web3, artifacts: Mapping[str, Artifact], market: str, bots: Sequence[Bot],
                 log: Callable[[str], None] = print, on_round: Callable[[], None] | None = None) -> None:
        self.w3 = w3
        self.market = Market.at(w3, artifacts, market)
        self.games = DisputeGameClient(w3, w3.eth.contract(address=Web3.to_checksum_address(self.market.game_address()),
                                                           abi=artifacts["DisputeGame"].abi), artifacts)
        self.bots = list(bots)
        self.log = log
        self.on_round = on_round
        self.time_jumps = 0

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def next_deadline(self) -> int | None:
        """The earliest future moment at which some deadline passes (None if nothing is pending)."""
        now = self.now()
        cands = []
        for job_id in range(1, self.market.job_count() + 1):
            job = self.market.job(job_id)
            if job.status == JobStatus.OPEN:
                cands += [job.terms.submission_deadline, job.terms.reveal_deadline, job.terms.challenge_deadline]
        for gid in range(1, self.games.game_count() + 1):
            v = self.games.game(gid)
            if v.phase not in (Phase.NONE, Phase.RESOLVED):
                cands.append(v.expires_at)
        future = [c for c in cands if c >= now]
        return min(future) if future else None

    def round(self) -> bool:
        busy = False
        for bot in self.bots:
            busy |= bot.tick()
        if self.on_round:
            self.on_round()
        return busy

    def run(self, until: Callable[[], bool], max_rounds: int = 2_000) -> int:
        """Run rounds until `until()`; returns the number of rounds."""
        for n in range(1, max_rounds + 1):
            if until():
                return n
            if not self.round():
                if any(bot.sender.in_flight() for bot in self.bots):
                    continue  # a move still waits for its block: moving the clock now would charge it
                target = self.next_deadline()
                if target is None:
                    if until():
                        return n
                    raise ChainError("bots are idle and no deadline is pending, but the scenario is not done")
                increase_time(self.w3, target - self.now() + 1)
                self.time_jumps += 1
        raise ChainError(f"scenario not done after {max_rounds} rounds")

"""Helpers of the bot tests: the scenario world (a market on Anvil and the bots playing on it), the
client's offer, and the condition that a job is finished."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from verde_chain.agents.bot import Bot, BotConfig
from verde_chain.agents.catalog import Bundles, build_job
from verde_chain.agents.challenger import ChallengerBot
from verde_chain.agents.client import ClientBot, JobOffer
from verde_chain.agents.policy import Policy
from verde_chain.agents.system import Conductor
from verde_chain.agents.trainer import TrainerBot
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.market_client import Market
from verde_chain.job import Job
from verde_chain.market.marketparams import FAST
from verde_chain.market.types import ETH, SlotStatus

STEPS = 3
TERMS = JobOffer(kind="digits", steps=STEPS, reward=10**18, trainer_stake=2 * 10**17, min_challenge_bond=10**17,
                 slots=2, submission_window=3_600, challenge_window=3_600, arity=4, clock_seconds=600)


def node_of(job: Job, label: str) -> int:
    return [n.index for n in job.program.graph.nodes if n.label == label][-1]


@dataclass
class World:
    w3: Web3
    artifacts: Any
    market: Market
    bundles: Path
    tmp: Path
    job: Job
    bots: list[Bot] = field(default_factory=list)
    policy: Policy = field(default_factory=Policy)  # every bot's (a token world allows its token)

    def cfg(self, name: str, index: int, strategy: str = "honest", seed: int = 0) -> BotConfig:
        url = getattr(self.w3.provider, "endpoint_uri", "")
        return BotConfig(str(url), self.market.address, index, str(self.tmp / f"{name}.sqlite"), str(self.bundles),
                         strategy, seed, name, policy=self.policy)

    def client(self) -> ClientBot:
        bot = ClientBot(self.w3, self.artifacts, self.cfg("client", 1), log=lambda m: None)
        self.bots.append(bot)
        return bot

    def trainer(self, index: int, strategy: str = "honest", seed: int = 0, rivals: bool = False) -> TrainerBot:
        cfg = self.cfg(f"trainer-{index}", index, strategy, seed)
        bot = TrainerBot(self.w3, self.artifacts, cfg, log=lambda m: None, dispute_rivals=rivals)
        self.bots.append(bot)
        return bot

    def challenger(self, index: int = 4, strategy: str = "honest") -> ChallengerBot:
        cfg = self.cfg(f"challenger-{index}", index, strategy)
        bot = ChallengerBot(self.w3, self.artifacts, cfg, log=lambda m: None)
        self.bots.append(bot)
        return bot

    def run(self, until: Callable[[], bool]) -> Conductor:
        c = Conductor(self.w3, self.artifacts, self.market.address, self.bots, log=lambda m: None)
        c.run(until, max_rounds=400)
        return c

    def solvent(self) -> None:
        held = self.market.held(ETH, self.w3.eth.accounts, range(1, 10))
        assert self.market.token_balance(ETH) == self.market.total_owed(ETH) == held

    def withdrawn(self, bot: Bot) -> int:
        return sum(int(e.args["amount"]) for e in self.market.logs("Withdrawn", 0) if e.args["account"] == bot.address)


def reveal_time(world: World, job_id: int) -> None:
    """Once every slot of the job has committed, move the chain past the submission deadline so
    the trainers can reveal (for tests that tick bots by hand instead of running the Conductor)."""
    job = world.market.job(job_id)
    slots = world.market.slots(job_id)
    now = int(world.w3.eth.get_block("latest")["timestamp"])
    if now <= job.terms.submission_deadline and len(slots) == job.terms.slots \
            and all(s.status == SlotStatus.COMMITTED for s in slots):
        increase_time(world.w3, job.terms.submission_deadline - now + 1)


def finished(client: ClientBot, job_id: int, bots: list[Bot]) -> Callable[[], bool]:
    return lambda: ((client.store.job(job_id) or {}).get("state") == "done"
                    and all(g.get("done") for b in bots for g in b.store.games().values()))


# Fixtures shared by the bot, status and explorer tests (imported by their conftest.py): one tiny
# digits job per module, its published bundle, a fresh market.
@pytest.fixture(scope="module")
def job() -> Job:
    return build_job("digits", STEPS)


@pytest.fixture(scope="module")
def bundles(job: Job, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundles")
    Bundles(root).publish(job)
    return root


@pytest.fixture
def world(w3: Web3, artifacts: Any, deploy: Callable[..., Any], bundles: Path, tmp_path: Path, job: Job) -> World:
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    market = Market.deploy(w3, artifacts, game.address, FAST)
    return World(w3, artifacts, market, bundles, tmp_path, job)

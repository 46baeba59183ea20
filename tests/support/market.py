"""Helpers of the job-market tests: a JobMarket (fast profile) over the real DisputeGame on the toy
stepper, or over GameMock; the parties, the amounts (to the wei, the burned share from the twin
``split_forfeit``), commit-reveal and the solvency check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from eth_utils import keccak
from web3 import Web3

from verde_chain.chain.market_client import Market
from verde_chain.chain.tx import transact
from verde_chain.dispute import bisection
from verde_chain.errors import ContractRevert, CustomError
from verde_chain.market.marketparams import FAST, split_forfeit
from verde_chain.market.types import ETH, JobTerms, commitment

BOND = FAST.floor(ETH)  # the fast profile's floor (the ERC-20 fixtures get the same floor)
STAKE = 3 * BOND + 1  # odd: the burned half of a forfeit rounds down, the winner gets the odd wei
REWARD = 10**17 + 3  # not divisible by 2 or 3: the remainder must go somewhere, not stay as dust
SUBMIT_WINDOW = 3_600
REVEAL_WINDOW = 600
CHALLENGE_WINDOW = 7_200
C_0 = keccak(b"C_0")
TRUE_RESULT = keccak(b"honest C_T")
STAKE_BURN, STAKE_PAID = split_forfeit(STAKE, FAST.burn_bps)
BOND_BURN, BOND_PAID = split_forfeit(BOND, FAST.burn_bps)


def wrong_result(tag: str = "") -> bytes:
    return keccak(b"wrong C_T " + tag.encode())


@dataclass
class Env:
    w3: Web3
    artifacts: Any
    chain: Any
    market: Market
    game: Any
    token: str  # ETH or the TestToken address
    token_contract: Any
    client: str
    trainers: list[str]
    challenger: str
    outsider: str
    mock: bool = False  # GameMock (test decides winners) instead of DisputeGame + ToyStepper
    game_ids: list[int] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # more parties (sybils) that may be owed something

    @property
    def accounts(self) -> list[str]:
        """Every account that may be owed something: the node's accounts, a contract client, sybils."""
        return list(dict.fromkeys([*self.w3.eth.accounts, self.client, *self.extra]))

    def terms(self, **over: Any) -> JobTerms:
        now = self.chain.timestamp()
        fields: dict[str, Any] = {
            "token": self.token,
            "spec_hash": keccak(b"job spec"),
            "bundle_uri": "https://bundles.example/job-spec",
            "graph_root": keccak(b"graph"),
            "initial_commitment": C_0,
            "batch_root": keccak(b"batches"),
            "num_steps": 1000,
            "checkpoint_interval": 100,
            "reward": REWARD,
            "trainer_stake": STAKE,
            "min_challenge_bond": BOND,
            "slots": 3,
            "submission_deadline": now + SUBMIT_WINDOW,
            "reveal_window": REVEAL_WINDOW,
            "challenge_window": CHALLENGE_WINDOW,
            "arity": 8,
            "clock_seconds": 600,
            "num_nodes": 4,
        }
        fields.update(over)
        return JobTerms(**fields)

    def post(self, **over: Any) -> int:
        job_id, _ = self.market.post_job(self.terms(**over), sender=self.client)
        return job_id

    def game_state(self, game_id: int) -> dict[str, Any]:
        """The real DisputeGame's Game struct as a dict keyed by field name."""
        fn = self.game.functions.getGame(game_id)
        names = [c["name"] for c in fn.abi["outputs"][0]["components"]]
        return dict(zip(names, fn.call()))

    def _answer(self, game_id: int, job_id: int, defender_slot: int) -> None:
        """An honest defender (result == TRUE_RESULT) answers at once with its first L1 claims;
        a cheater never answers. Either way the other side then runs out of clock."""
        if self.mock or self.market.slot(job_id, defender_slot).result != TRUE_RESULT:
            return
        g = self.game_state(game_id)
        n = bisection.parts(g["lo"], g["hi"], g["arity"], g["checkpointInterval"])
        claims = [keccak(b"step claim %d" % i) for i in range(1, n)]
        transact(self.w3, self.game.functions.postClaims(game_id, claims), self.artifacts, sender=g["defender"])

    def resolve(self, game_id: int, defender_wins: bool) -> None:
        """End a game with the given winner: the mock is told; the real game is timed out on the
        party to move (the defender if it never answered, else the challenger)."""
        if self.mock:
            transact(self.w3, self.game.functions.resolve(game_id, defender_wins), self.artifacts)
            return
        g = self.game_state(game_id)
        assert (self.game.functions.turn(game_id).call() == g["challenger"]) == defender_wins
        try:
            transact(self.w3, self.game.functions.claimTimeout(game_id), self.artifacts, sender=self.outsider)
        except ContractRevert as exc:
            assert exc.name == "ClockNotExpired", exc
            self.chain.increase_time(self.market.job(self.market.dispute(game_id).job_id).terms.clock_seconds + 1)
            transact(self.w3, self.game.functions.claimTimeout(game_id), self.artifacts, sender=self.outsider)
        g = self.game_state(game_id)
        assert g["winner"] == (g["defender"] if defender_wins else g["challenger"])

    def dispute(self, job_id: int, slot: int, sender: str | None = None, bond: int | None = BOND) -> int:
        """Open an outside dispute (`bond` None: what the market asks now) and let an honest
        defender answer its first round."""
        gid, _ = self.market.open_dispute(job_id, slot, bond, sender=sender or self.challenger)
        self.game_ids.append(gid)
        self._answer(gid, job_id, slot)
        return gid

    def rival(self, job_id: int, defender_slot: int, own_slot: int, bond: int | None = BOND) -> int:
        sender = self.market.slot(job_id, own_slot).trainer
        gid, _ = self.market.dispute_rival(job_id, defender_slot, own_slot, sender=sender, bond=bond)
        self.game_ids.append(gid)
        self._answer(gid, job_id, defender_slot)
        return gid

    def salt(self, trainer: str) -> bytes:
        return keccak(b"salt of " + bytes.fromhex(trainer[2:]))

    def commit(self, job_id: int, result: bytes, trainer: str) -> bytes:
        """Commit `result` (checkpoint root derived from it) for `trainer`; returns the commitment."""
        c = commitment(result, keccak(b"ckpt" + result), self.salt(trainer), trainer)
        self.market.commit(job_id, c, sender=trainer)
        return c

    def reveal(self, job_id: int, result: bytes, trainer: str) -> None:
        self.market.reveal(job_id, result, keccak(b"ckpt" + result), self.salt(trainer), sender=trainer)

    def past_submission(self, job_id: int) -> None:
        """To the first second of the reveal window."""
        self.chain.increase_time(self.market.job(job_id).terms.submission_deadline - self.chain.timestamp() + 1)

    def past_reveal(self, job_id: int) -> None:
        self.chain.increase_time(self.market.reveal_deadline(job_id) - self.chain.timestamp() + 1)

    def past_challenge(self, job_id: int) -> None:
        self.chain.increase_time(self.market.challenge_deadline(job_id) - self.chain.timestamp() + 1)

    def assert_solvent(self) -> None:
        for tok in {ETH, self.token}:
            held = self.market.held(tok, self.accounts, self.game_ids)
            assert self.market.token_balance(tok) == self.market.total_owed(tok) == held, tok

    def withdraw_all(self) -> dict[str, int]:
        """Every account withdraws everything it is owed; returns the amounts."""
        out = {}
        for a in self.accounts:
            if self.market.balance_of(a, self.token):
                out[a] = self.market.withdraw(self.token, sender=a)
        return out


TOKEN_FUNDS = 10**24


def make_env(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any, token_kind: str, mock: bool) -> Env:
    if mock:
        game = deploy("GameMock")
    else:
        game = deploy("DisputeGame", deploy("ToyStepper").address)
    acc = w3.eth.accounts
    token_contract = None
    token = ETH
    params = FAST
    if token_kind == "token":
        token_contract = deploy("TestToken")
        token = token_contract.address
        params = FAST.with_token(token, BOND)
        for a in acc:
            transact(w3, token_contract.functions.mint(a, TOKEN_FUNDS), artifacts)
    market = Market.deploy(w3, artifacts, game.address, params)
    return Env(w3, artifacts, chain, market, game, token, token_contract, acc[1], [acc[2], acc[3], acc[4]], acc[5],
               acc[6], mock)


def join_and_commit(env: Env, job_id: int, results: list[bytes], trainers: list[str] | None = None) -> list[int]:
    slots = []
    for trainer, result in zip(trainers or env.trainers, results):
        slot, _ = env.market.join(job_id, sender=trainer)
        env.commit(job_id, result, trainer)
        slots.append(slot)
    return slots


def join_and_submit(env: Env, job_id: int, results: list[bytes], trainers: list[str] | None = None) -> list[int]:
    """Join, commit, wait out the submission deadline and reveal: the results stand, disputable."""
    slots = join_and_commit(env, job_id, results, trainers)
    env.past_submission(job_id)
    for trainer, result in zip(trainers or env.trainers, results):
        env.reveal(job_id, result, trainer)
    return slots


def expect(error: str, fn: Callable[[], Any], **fields: Any) -> ContractRevert:
    with pytest.raises(ContractRevert) as ei:
        fn()
    assert ei.value.name == error, ei.value
    for k, v in fields.items():
        assert ei.value.fields[k] == v, (k, ei.value.fields)
    return ei.value


def twin_error(fn: Callable[[], Any]) -> CustomError:
    """The CustomError a Python twin raises (fails the test if it raises none)."""
    with pytest.raises(CustomError) as err:
        fn()
    return err.value

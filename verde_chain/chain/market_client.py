"""Typed web3 client of ``contracts/market/JobMarket.sol``: every call, view and event, with decoded errors.

Bots (client, trainers, challengers) use this instead of raw web3 so that

* job parameters travel as one typed, hashable ``JobTerms`` (``verde_chain.market.types``, the
  Solidity tuple, same field order),
* results are committed (``commit``, with ``market.types.commitment`` computing the preimage's
  hash) before the submission deadline and revealed (``reveal``) in the reveal window after it,
* every revert surfaces as ``ContractRevert`` carrying the custom error's name and fields
  (``err.name == "SubmissionClosed"``, ``err.fields["deadline"]``), and
* ERC-20 approvals are handled here: a payment in a token approves exactly what the call pulls.

Money flow (see docs/protocol.md, "Job market"): deposits go into escrow, every settlement is a
credit to an internal balance (or to the burned total), and only ``withdraw(token)`` moves funds
out (pull payments).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from web3 import Web3
from web3.contract import Contract
from web3.logs import DISCARD
from web3.types import TxReceipt

from verde_chain.chain.compile import Artifact
from verde_chain.chain.deploy import deploy_market
from verde_chain.chain.tx import call, transact
from verde_chain.market.marketparams import MarketParams
from verde_chain.market.types import (
    ETH,
    ZERO32,
    Dispute,
    DisputeKind,
    Job,
    JobStatus,
    JobTerms,
    MarketEvent,
    Slot,
    SlotStatus,
    commitment,
)

EVENT_NAMES = (
    "JobPosted", "TrainerJoined", "ResultCommitted", "ResultRevealed", "DisputeOpened", "DisputeSettled",
    "StakeForfeited", "Burned", "Credited", "JobFinalized", "Withdrawn",
)


class Market:
    """A deployed JobMarket plus the artifacts needed to decode its reverts."""

    def __init__(self, w3: Web3, artifacts: Mapping[str, Artifact], contract: Contract) -> None:
        self.w3 = w3
        self.artifacts = artifacts
        self.contract = contract

    @classmethod
    def deploy(cls, w3: Web3, artifacts: Mapping[str, Artifact], game: str, params: MarketParams,
               sender: str | None = None) -> Market:
        return cls(w3, artifacts, deploy_market(w3, artifacts, game, params, sender=sender))

    @classmethod
    def at(cls, w3: Web3, artifacts: Mapping[str, Artifact], address: str) -> Market:
        return cls(w3, artifacts, w3.eth.contract(address=Web3.to_checksum_address(address), abi=artifacts["JobMarket"].abi))

    @property
    def address(self) -> str:
        return str(self.contract.address)

    # -- plumbing -------------------------------------------------------------------------------

    def _tx(self, fn_call: Any, sender: str | None, value: int = 0) -> TxReceipt:
        return transact(self.w3, fn_call, self.artifacts, sender=sender, value=value)

    def _call(self, fn_call: Any) -> Any:
        return call(fn_call, self.artifacts)

    def _pay(self, token: str, amount: int, sender: str | None) -> int:
        """Prepare a payment: approve `amount` for a token and return the msg.value to send."""
        if int(token, 16) == 0:
            return amount
        if amount:
            erc20 = self.w3.eth.contract(address=Web3.to_checksum_address(token), abi=self.artifacts["IERC20"].abi)
            transact(self.w3, erc20.functions.approve(self.address, amount), self.artifacts, sender=sender)
        return 0

    # -- transactions ---------------------------------------------------------------------------

    def post_job(self, terms: JobTerms, sender: str | None = None) -> tuple[int, TxReceipt]:
        value = self._pay(terms.token, terms.reward, sender)
        receipt = self._tx(self.contract.functions.postJob(terms.as_tuple()), sender, value)
        return int(self.events(receipt, "JobPosted")[0].args["jobId"]), receipt

    def join(self, job_id: int, sender: str) -> tuple[int, TxReceipt]:
        terms = self.job(job_id).terms
        value = self._pay(terms.token, terms.trainer_stake, sender)
        receipt = self._tx(self.contract.functions.join(job_id), sender, value)
        return int(self.events(receipt, "TrainerJoined")[0].args["slot"]), receipt

    def commit(self, job_id: int, commitment: bytes, sender: str) -> TxReceipt:
        """Commit to a result (``commitment(result, checkpoint_root, salt, sender)``) by the
        submission deadline; keep the salt secret until ``reveal``."""
        return self._tx(self.contract.functions.commit(job_id, commitment), sender)

    def commit_result(self, job_id: int, result: bytes, salt: bytes, sender: str,
                      checkpoint_root: bytes = ZERO32) -> TxReceipt:
        """Commit to `result` for `sender` (the commitment computed here with the same `salt` that
        ``reveal`` will need)."""
        return self.commit(job_id, commitment(result, checkpoint_root, salt, sender), sender)

    def reveal(self, job_id: int, result: bytes, checkpoint_root: bytes, salt: bytes, sender: str) -> TxReceipt:
        """Open the commitment in the reveal window (after the submission deadline)."""
        return self._tx(self.contract.functions.reveal(job_id, result, checkpoint_root, salt), sender)

    def open_dispute(self, job_id: int, slot: int, bond: int | None, sender: str) -> tuple[int, TxReceipt]:
        """Dispute slot `slot`'s revealed result; `bond` None locks what ``required_bond`` asks now."""
        bond = self.required_bond(job_id, slot) if bond is None else bond
        value = self._pay(self.job(job_id).terms.token, bond, sender)
        receipt = self._tx(self.contract.functions.openDispute(job_id, slot, bond), sender, value)
        return int(self.events(receipt, "DisputeOpened")[0].args["gameId"]), receipt

    def dispute_rival(self, job_id: int, defender_slot: int, own_slot: int, sender: str,
                      bond: int | None = None) -> tuple[int, TxReceipt]:
        """A trainer disputes a rival's different result with a bond (None: ``required_bond``)."""
        bond = self.required_bond(job_id, defender_slot) if bond is None else bond
        value = self._pay(self.job(job_id).terms.token, bond, sender)
        receipt = self._tx(self.contract.functions.disputeRival(job_id, defender_slot, own_slot, bond), sender, value)
        return int(self.events(receipt, "DisputeOpened")[0].args["gameId"]), receipt

    def finalize(self, job_id: int, sender: str | None = None) -> TxReceipt:
        return self._tx(self.contract.functions.finalize(job_id), sender)

    def withdraw(self, token: str, sender: str) -> int:
        receipt = self._tx(self.contract.functions.withdraw(token), sender)
        return int(self.events(receipt, "Withdrawn")[0].args["amount"])

    # -- views ----------------------------------------------------------------------------------

    def game_address(self) -> str:
        """The DisputeGame this market opens its games in."""
        return str(self._call(self.contract.functions.game()))

    def max_slots(self) -> int:
        return int(self._call(self.contract.functions.MAX_SLOTS()))

    def params(self) -> MarketParams:
        """The parameters the market was deployed with (immutable)."""
        return MarketParams.from_tuple(self._call(self.contract.functions.marketParams()))

    def job_count(self) -> int:
        return int(self._call(self.contract.functions.jobCount()))

    def job(self, job_id: int) -> Job:
        raw = self._call(self.contract.functions.getJob(job_id))
        terms_raw, client, status, taken, active, reward_held, accepted = raw
        return Job(JobTerms(*terms_raw), client, JobStatus(status), taken, active, reward_held, bytes(accepted))

    def slot(self, job_id: int, slot: int) -> Slot:
        trainer, status, against, as_rival, stake, com, result, ckpt, beaten_by, beaten_winner = self._call(
            self.contract.functions.getSlot(job_id, slot))
        return Slot(trainer, SlotStatus(status), against, as_rival, stake, bytes(com), bytes(result), bytes(ckpt),
                    beaten_by, beaten_winner)

    def slots(self, job_id: int) -> list[Slot]:
        return [self.slot(job_id, i) for i in range(self.job(job_id).slots_taken)]

    def slot_of(self, job_id: int, trainer: str) -> int:
        return int(self._call(self.contract.functions.slotOf(job_id, trainer)))

    def dispute(self, game_id: int) -> Dispute:
        job_id, kind, active, dslot, cslot, challenger, bond = self._call(self.contract.functions.getDispute(game_id))
        return Dispute(job_id, DisputeKind(kind), active, dslot, cslot, challenger, bond)

    def balance_of(self, account: str, token: str = ETH) -> int:
        return int(self._call(self.contract.functions.balanceOf(account, token)))

    def total_owed(self, token: str = ETH) -> int:
        return int(self._call(self.contract.functions.totalOwed(token)))

    def burned(self, token: str = ETH) -> int:
        """Forfeits burned in `token`: held by the market for ever, withdrawable by nobody."""
        return int(self._call(self.contract.functions.burned(token)))

    def reveal_deadline(self, job_id: int) -> int:
        return int(self._call(self.contract.functions.revealDeadline(job_id)))

    def challenge_deadline(self, job_id: int) -> int:
        return int(self._call(self.contract.functions.challengeDeadline(job_id)))

    def required_bond(self, job_id: int, slot: int) -> int:
        """The bond a new dispute against `slot` must lock now (doubles per 16 games running against it)."""
        return int(self._call(self.contract.functions.requiredBond(job_id, slot)))

    def has_disputed(self, job_id: int, slot: int, challenger: str) -> bool:
        return bool(self._call(self.contract.functions.hasDisputed(job_id, slot, challenger)))

    def held(self, token: str, accounts: Iterable[str], game_ids: Iterable[int] = ()) -> int:
        """Recompute what the market owes in `token` from its parts: rewards + stakes held by every
        job in that token, bonds of the given disputes still active, withdrawable balances of the
        given accounts, and the burned total. Equal to ``total_owed`` and the token balance when
        the books are right."""
        total = 0
        token_key = int(token, 16)
        for job_id in range(1, self.job_count() + 1):
            job = self.job(job_id)
            if int(job.terms.token, 16) != token_key:
                continue
            total += job.reward_held + sum(s.stake_held for s in self.slots(job_id))
        for gid in game_ids:
            d = self.dispute(gid)
            if d.active and int(self.job(d.job_id).terms.token, 16) == token_key:
                total += d.bond
        return total + sum(self.balance_of(a, token) for a in set(accounts)) + self.burned(token)

    def rivals(self, job_id: int, own_slot: int) -> list[int]:
        """Slots a trainer in `own_slot` should dispute: standing results that differ from its own."""
        slots = self.slots(job_id)
        own = slots[own_slot].result
        return [i for i, s in enumerate(slots) if i != own_slot and s.standing and s.result != own]

    def token_balance(self, token: str) -> int:
        if int(token, 16) == 0:
            return int(self.w3.eth.get_balance(self.contract.address))
        erc20 = self.w3.eth.contract(address=Web3.to_checksum_address(token), abi=self.artifacts["IERC20"].abi)
        return int(erc20.functions.balanceOf(self.address).call())

    # -- events ---------------------------------------------------------------------------------

    def events(self, receipt: TxReceipt, name: str | None = None) -> list[MarketEvent]:
        """Decode the market's logs in a receipt (optionally only those named `name`)."""
        out: list[MarketEvent] = []
        for ev_name in (name,) if name else EVENT_NAMES:
            ev = getattr(self.contract.events, ev_name)()
            for log in ev.process_receipt(receipt, errors=DISCARD):
                out.append(_event(ev_name, log))
        return sorted(out, key=lambda e: (e.block, e.log_index))

    def logs(self, name: str, from_block: int = 0, to_block: int | str = "latest") -> list[MarketEvent]:
        """Every `name` event the market emitted in a block range (for bots following the chain)."""
        ev = getattr(self.contract.events, name)()
        return [_event(name, log) for log in ev.get_logs(from_block=from_block, to_block=to_block)]


def _event(name: str, log: Any) -> MarketEvent:
    return MarketEvent(name, dict(log["args"]), log["blockNumber"], log["logIndex"], bytes(log["transactionHash"]))

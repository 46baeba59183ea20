"""The trainer bot: takes jobs, stakes, trains with RepOps, commits to C_T, reveals it, defends it.

Per job, the state lives on chain (``getSlot``): no slot -> join; JOINED -> train and commit
(the salt is stored before the commitment is sent); COMMITTED -> reveal once the submission
deadline has passed; REVEALED -> defend the games opened against it (and, with
``dispute_rivals``, dispute every rival trainer whose C_T differs from its own, with a bond and
its own result at stake: results are deterministic, so one of the two is wrong); after
``JobFinalized`` -> withdraw.
"""

from __future__ import annotations

import os

from verde_chain.agents.bot import Bot
from verde_chain.agents.catalog import check_against_chain
from verde_chain.agents.errors import AgentError, InsufficientFunds
from verde_chain.agents.strategies import Plan, trainer_plan
from verde_chain.agents.wallet import retry
from verde_chain.errors import ContractRevert
from verde_chain.market.types import ZERO32, JobStatus, SlotStatus, commitment

REVEAL_GAS = 200_000  # a reveal measures 65k (docs/benchmarks.md)


class TrainerBot(Bot):
    role = "trainer"
    EVENTS = ("JobPosted", "DisputeOpened", "JobFinalized")

    def __init__(self, *args, max_jobs: int = 1, dispute_rivals: bool = False,  # type: ignore[no-untyped-def]
                 **kw) -> None:
        super().__init__(*args, **kw)
        self.max_jobs = max_jobs
        self.dispute_rivals = dispute_rivals

    def plan(self, job_id: int) -> Plan:
        if job_id not in self.plans:
            terms = retry(lambda: self.market.job(job_id)).terms
            job = self.bundles.fetch(terms.spec_hash, terms.bundle_uri)
            self.plans[job_id] = trainer_plan(self.cfg.strategy, job, self.cfg.seed)
        return self.plans[job_id]

    def tick(self) -> bool:
        acted = False
        for ev in self.poll():
            if ev.name == "JobPosted":
                self._consider(int(ev.args["jobId"]))
            elif ev.name == "DisputeOpened" and self.address in (ev.args["defender"], ev.args["challenger"]):
                self.add_game(ev)
            elif ev.name == "JobFinalized" and self.store.job(int(ev.args["jobId"])) is not None:
                self.store.update_job(int(ev.args["jobId"]), finalized=True)
        self.commit_cursor()
        for job_id, rec in self.store.jobs().items():
            if rec.get("state") in ("joining", "joined", "committed", "submitted"):
                acted |= self._advance(job_id, rec)
        acted |= self.play_games()
        return acted

    def _consider(self, job_id: int) -> None:
        if self.store.job(job_id) is not None:
            return
        active = sum(1 for r in self.store.jobs().values()
                     if r.get("state") in ("joining", "joined", "committed", "submitted"))
        if active >= self.max_jobs:
            self.store.update_job(job_id, state="skipped", reason="busy")
            return
        job = retry(lambda: self.market.job(job_id))
        try:
            bundle = self.bundles.fetch(job.terms.spec_hash, job.terms.bundle_uri)
        except AgentError as exc:
            self.store.update_job(job_id, state="skipped", reason=str(exc))
            self.log(f"refused job {job_id}: {exc}")
            return
        bad = check_against_chain(bundle, job.terms)
        if bad:
            self.store.update_job(job_id, state="skipped", reason=f"bundle disagrees with chain on {bad}")
            self.log(f"refused job {job_id}: its bundle disagrees with the posted {bad}")
            return
        why = self.refuses(job_id, job.terms, bundle, "staking")
        if why is not None:
            self.store.update_job(job_id, state="skipped", reason=f"policy: {why}")
            return
        self.store.update_job(job_id, state="joining")

    def _slot(self, job_id: int) -> int | None:
        try:
            return retry(lambda: self.market.slot_of(job_id, self.address))
        except ContractRevert as exc:
            if exc.name == "NotATrainer":
                return None
            raise

    def _advance(self, job_id: int, rec: dict) -> bool:  # type: ignore[type-arg]
        job = retry(lambda: self.market.job(job_id))
        slot = self._slot(job_id)
        if slot is None:
            if job.status != JobStatus.OPEN or self.now() > job.terms.submission_deadline \
                    or job.slots_taken >= job.terms.slots:
                self.store.update_job(job_id, state="skipped", reason="could not join")
                return False
            try:
                self.pay(self.market.contract.functions.join(job_id), "join", job.terms.token, job.terms.trainer_stake)
            except InsufficientFunds:
                return False  # logged once by pay; retried each poll until funded or the deadline passes
            except ContractRevert as exc:
                self.store.update_job(job_id, state="skipped", reason=exc.name)
                self.log(f"job {job_id}: join refused: {exc.name}")
                return False
            slot = self._slot(job_id)
            self.log(f"job {job_id}: joined slot {slot}, staked {self.units(job.terms.token, job.terms.trainer_stake)} "
                     f"({self.cfg.strategy})")
            self.store.update_job(job_id, state="joined", slot=slot)
            return True
        s = retry(lambda: self.market.slot(job_id, slot))
        if s.status == SlotStatus.JOINED:
            if self.now() > job.terms.submission_deadline:
                return False
            try:
                plan = self.plan(job_id)
            except AgentError as exc:  # the bundle went bad since the join (or the strategy cannot play this job)
                self.store.update_job(job_id, state="skipped", reason=str(exc))
                self.log(f"refused job {job_id}: {exc}; my stake on it is lost")
                return False
            every = max(1, job.terms.num_steps // 10)  # ~10 progress lines per job, however long
            result = self.train(plan, job.terms.spec_hash, lambda i, n: self.log(f"job {job_id}: trained step {i}/{n}")
                                if i % every == 0 or i == n else None)
            # the salt is stored before the commitment is sent, so a restart can still reveal it
            salt = rec.get("salt") or "0x" + os.urandom(32).hex()
            self.store.update_job(job_id, slot=slot, result="0x" + result.hex(), salt=salt)
            com = commitment(result, ZERO32, bytes.fromhex(salt[2:]), self.address)
            self.sender.send(self.market.contract.functions.commit(job_id, com), "commit")
            self.store.update_job(job_id, state="committed")
            self.log(f"job {job_id}: committed to C_T = 0x{result.hex()[:16]}... (revealed after the deadline)")
            return True
        if s.status == SlotStatus.COMMITTED:
            now = self.now()
            if now <= job.terms.submission_deadline or now > job.terms.reveal_deadline:
                return False
            rec = self.store.job(job_id) or rec
            result, salt = bytes.fromhex(rec["result"][2:]), bytes.fromhex(rec["salt"][2:])
            # a fixed gas, no estimate: the reveal is valid only after a deadline, and a node
            # estimates against its latest block, whose time on a quiet dev chain is long past
            self.sender.send(self.market.contract.functions.reveal(job_id, result, ZERO32, salt), "reveal",
                             gas=REVEAL_GAS)
            self.store.update_job(job_id, state="submitted", slot=slot)
            self.log(f"job {job_id}: revealed C_T = 0x{result.hex()[:16]}...")
            # the opening of what C_T commits (verde_chain/results.py), published only now: before
            # the reveal it would hand the result to anyone who wants to copy it
            self.bundles.publish_result(self.bundles.fetch(job.terms.spec_hash), self.plan(job_id).world)
            return True
        if rec.get("state") != "submitted":
            self.store.update_job(job_id, state="submitted", slot=slot, result="0x" + s.result.hex())
        if self.dispute_rivals and job.status == JobStatus.OPEN and s.status == SlotStatus.REVEALED \
                and self.now() <= job.terms.challenge_deadline and self._dispute_rivals(job_id, slot):
            return True
        if job.status == JobStatus.FINALIZED:
            self._withdraw(job.terms.token)
            self.store.update_job(job_id, state="done", slot_status=s.status.name)
            self.log(f"job {job_id}: finalized; my slot ended {s.status.name}")
            return True
        return False

    def _dispute_rivals(self, job_id: int, own_slot: int) -> bool:
        mine = {g["slot"] for g in self.store.games().values() if g["job_id"] == job_id and g["role"] == "challenger"}
        token = retry(lambda: self.market.job(job_id)).terms.token
        for rival in retry(lambda: self.market.rivals(job_id, own_slot)):
            if rival in mine or retry(lambda r=rival: self.market.has_disputed(job_id, r, self.address)):  # type: ignore[misc]
                continue
            bond = retry(lambda r=rival: self.market.required_bond(job_id, r))  # type: ignore[misc]
            if self.refuses_bond(job_id, bond):
                continue
            try:
                self.pay(self.market.contract.functions.disputeRival(job_id, rival, own_slot, bond), "disputeRival",
                         token, bond)
            except InsufficientFunds:
                return False  # logged once by pay; retried while the window is open
            except ContractRevert as exc:
                self.log(f"job {job_id}: disputeRival against slot {rival} refused: {exc.name}")
                continue
            self.log(f"job {job_id}: slot {rival}'s result differs from mine; disputed it with a "
                     f"{self.units(token, bond)} bond and my own result at stake")
            return True  # the DisputeOpened event (next tick) records the game
        return False

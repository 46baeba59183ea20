"""The client bot: publishes a job bundle, posts the job with its reward, follows it, finalizes
it after the challenge window and collects the outcome (and any refund).

Posting is made idempotent across crashes: the spec hash is stored before ``postJob`` is sent,
and on restart a ``JobPosted`` event from this account with that hash is looked for first.
"""

from __future__ import annotations

from dataclasses import dataclass

from verde_chain.agents.bot import Bot
from verde_chain.agents.catalog import build_job
from verde_chain.agents.wallet import retry
from verde_chain.bundles.server import bundle_uri
from verde_chain.errors import ContractRevert
from verde_chain.job import Job
from verde_chain.market.types import ETH, JobStatus, JobTerms

FINALIZE_GAS = 3_000_000  # finalize loops over at most MAX_SLOTS = 32 slots


@dataclass(frozen=True)
class JobOffer:
    """What the client offers and demands, in seconds and in the smallest unit of `token` (wei for
    ETH, the default; an ERC-20 address pays reward, stakes and bonds in that token)."""

    kind: str = "digits"
    steps: int = 6
    reward: int = 10**18
    trainer_stake: int = 2 * 10**17
    min_challenge_bond: int = 10**17
    slots: int = 2
    submission_window: int = 3_600
    challenge_window: int = 3_600
    arity: int = 4
    clock_seconds: int = 600
    job_seed: int = 7
    token: str = ETH
    reveal_window: int = 600


class ClientBot(Bot):
    role = "client"
    EVENTS = ("JobPosted", "ResultRevealed", "DisputeOpened", "DisputeSettled", "JobFinalized")

    def plan(self, job_id: int):  # type: ignore[no-untyped-def]
        raise NotImplementedError("the client plays no games")

    def post(self, offer: JobOffer, job: Job | None = None) -> int:
        """Post a job (once: a restarted client finds its earlier post on chain). `job` overrides
        the catalog's job built from `offer` (kind/steps/job_seed)."""
        job = job or build_job(offer.kind, offer.steps, offer.job_seed)
        spec_hash = self.bundles.publish(job)
        pending = self.store.get("posting")
        if pending == spec_hash.hex():
            for ev in retry(lambda: self.market.logs("JobPosted", self.cfg.start_block)):
                if ev.args["client"] == self.address and bytes(ev.args["specHash"]) == spec_hash:
                    return self._record(int(ev.args["jobId"]), offer)
        self.store.put("posting", spec_hash.hex())
        now = self.now()
        terms = JobTerms(
            token=offer.token, spec_hash=spec_hash,
            bundle_uri=bundle_uri(self.cfg.bundle_url, spec_hash) or self.bundles.uri(spec_hash),
            graph_root=job.spec.graph_root,
            initial_commitment=job.spec.initial_commitment, batch_root=job.spec.batch_root,
            num_steps=job.spec.steps, checkpoint_interval=max(1, job.spec.checkpoint_interval),
            reward=offer.reward, trainer_stake=offer.trainer_stake, min_challenge_bond=offer.min_challenge_bond,
            slots=offer.slots, submission_deadline=now + offer.submission_window,
            reveal_window=offer.reveal_window, challenge_window=offer.challenge_window, arity=offer.arity,
            clock_seconds=offer.clock_seconds,
            num_nodes=job.spec.num_nodes,
        )
        # (a restart between an approve and postJob finds the allowance in place: see Bot.pay)
        receipt = self.pay(self.market.contract.functions.postJob(terms.as_tuple()), "postJob", offer.token,
                           offer.reward)
        job_id = int(self.market.events(receipt, "JobPosted")[0].args["jobId"])
        self.log(f"posted job {job_id}: {offer.kind}, {offer.steps} steps, {len(job.program.graph.nodes)} nodes, "
                 f"reward {self.units(offer.token, offer.reward)}, {offer.slots} trainer slots")
        return self._record(job_id, offer)

    def _record(self, job_id: int, offer: JobOffer) -> int:
        self.store.update_job(job_id, state="posted", kind=offer.kind, steps=offer.steps)
        self.store.put("posting", None)
        return job_id

    def tick(self) -> bool:
        acted = False
        for ev in self.poll():
            jid = int(ev.args["jobId"])
            rec = self.store.job(jid)
            if rec is None:
                continue
            if ev.name == "ResultRevealed":
                self.log(f"job {jid}: slot {ev.args['slot']} revealed 0x{bytes(ev.args['result']).hex()[:16]}...")
            elif ev.name == "DisputeOpened":
                self.log(f"job {jid}: dispute {ev.args['gameId']} opened against slot {ev.args['defenderSlot']}")
            elif ev.name == "DisputeSettled":
                who = "defender" if ev.args["defenderWon"] else "challenger"
                token = retry(lambda j=jid: self.market.job(j)).terms.token  # type: ignore[misc]
                self.log(f"job {jid}: dispute {ev.args['gameId']} settled for the {who}; "
                         f"{self.units(token, int(ev.args['paid']))} moved")
        self.commit_cursor()
        for jid, rec in self.store.jobs().items():
            if rec.get("state") == "posted":
                acted |= self._follow(jid)
        return acted

    def _follow(self, job_id: int) -> bool:
        job = retry(lambda: self.market.job(job_id))
        if job.status == JobStatus.OPEN:
            if self.now() <= job.terms.challenge_deadline or job.active_disputes:
                return False
            try:
                self.sender.send(self.market.contract.functions.finalize(job_id), "finalize", gas=FINALIZE_GAS)
            except ContractRevert as exc:
                if exc.name != "JobAlreadyFinalized":
                    if self.store.job(job_id).get("finalize_error") != exc.name:  # type: ignore[union-attr]
                        self.store.update_job(job_id, finalize_error=exc.name)
                        self.log(f"job {job_id}: finalize refused: {exc.name}")
                    return False
            job = retry(lambda: self.market.job(job_id))
        accepted = job.accepted_result
        self._withdraw(job.terms.token)
        survivors = [s for s in self.market.slots(job_id) if s.result == accepted and accepted != b"\x00" * 32]
        self.store.update_job(job_id, state="done", accepted="0x" + accepted.hex(),
                              trainers=[s.trainer for s in survivors])
        if accepted == b"\x00" * 32:
            self.log(f"job {job_id}: finalized with no accepted result (reward refunded)")
        else:
            self.log(f"job {job_id}: finalized; accepted C_T 0x{accepted.hex()[:16]}... from "
                     f"{', '.join(s.trainer for s in survivors)}")
        return True

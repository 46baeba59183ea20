"""The challenger bot: watches submissions, re-executes the job, disputes results that differ
from its own, and plays the games to the end.

Whether a (job, slot) still needs a dispute is re-derived on every tick from the chain (the slot
still REVEALED, the challenge window open, no game of ours against it), so a crash between
opening a dispute and recording it cannot open a second one: the ``DisputeOpened`` event is read
back on restart before anything is sent.
"""

from __future__ import annotations

from verde_chain.agents.bot import Bot
from verde_chain.agents.catalog import check_against_chain
from verde_chain.agents.errors import AgentError, InsufficientFunds
from verde_chain.agents.strategies import Plan, challenger_plan
from verde_chain.agents.wallet import retry
from verde_chain.errors import ContractRevert
from verde_chain.market.types import ETH, SlotStatus


class ChallengerBot(Bot):
    role = "challenger"
    EVENTS = ("ResultRevealed", "DisputeOpened", "DisputeSettled", "JobFinalized")

    def __init__(self, *args, bond: int | None = None, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.bond = bond

    def plan(self, job_id: int) -> Plan:
        if job_id not in self.plans:
            terms = retry(lambda: self.market.job(job_id)).terms
            job = self.bundles.fetch(terms.spec_hash, terms.bundle_uri)
            bad = check_against_chain(job, terms)
            if bad:
                raise AgentError(f"job {job_id}: bundle disagrees with the posted {bad}")
            self.plans[job_id] = challenger_plan(self.cfg.strategy, job, self.cfg.seed)
        return self.plans[job_id]

    def tick(self) -> bool:
        acted = False
        for ev in self.poll():
            a = ev.args
            if ev.name == "ResultRevealed":
                key = f"{a['jobId']}:{a['slot']}"
                watch = self.store.get("watch", {})
                watch.setdefault(key, {"result": "0x" + bytes(a["result"]).hex(), "state": "new"})
                self.store.put("watch", watch)
            elif ev.name == "DisputeOpened" and a["challenger"] == self.address:
                self.add_game(ev)
                self._mark(f"{a['jobId']}:{a['defenderSlot']}", "disputed", game=int(a["gameId"]))
            elif ev.name in ("DisputeSettled", "JobFinalized"):
                self.store.put("withdraw_due", True)
        self.commit_cursor()
        for key, w in self.store.get("watch", {}).items():
            if w["state"] == "new":
                acted |= self._check(key, w)
        acted |= self.play_games()
        if self.store.get("withdraw_due") and all(r.get("done") for r in self.store.games().values()):
            self.store.put("withdraw_due", False)
            for token in self._tokens_owed_in():
                acted |= self._withdraw(token)
        return acted

    def _tokens_owed_in(self) -> list[str]:
        """Every token a watched job pays in (ETH first): winnings are credited in the job's token."""
        jobs = {int(key.split(":")[0]) for key in self.store.get("watch", {})}
        tokens = {retry(lambda j=j: self.market.job(j)).terms.token for j in jobs}  # type: ignore[misc]
        return sorted(tokens | {ETH}, key=lambda t: int(t, 16))

    def _mark(self, key: str, state: str, **extra: object) -> None:
        watch = self.store.get("watch", {})
        watch.setdefault(key, {"result": None})
        watch[key].update(state=state, **extra)
        self.store.put("watch", watch)

    def _check(self, key: str, w: dict) -> bool:  # type: ignore[type-arg]
        job_id, slot = (int(x) for x in key.split(":"))
        job = retry(lambda: self.market.job(job_id))
        s = retry(lambda: self.market.slot(job_id, slot))
        if s.trainer == self.address:
            self._mark(key, "own")
            return False
        try:
            plan = self.plan(job_id)
        except AgentError as exc:
            self._mark(key, "skipped", reason=str(exc))
            self.log(f"refused job {job_id}: cannot re-execute it ({exc})")
            return False
        why = self.refuses(job_id, job.terms, self.bundles.fetch(job.terms.spec_hash), "re-executing or disputing")
        if why is not None:
            self._mark(key, "refused", reason=f"policy: {why}")
            return False
        # remembered (for this strategy and seed) so a check that must wait, for an unaffordable
        # bond, does not re-execute the job on every poll
        by = f"{self.cfg.strategy}/{self.cfg.seed}"
        if w.get("mine") and w.get("mine_by") == by:
            mine = bytes.fromhex(w["mine"][2:])
        else:
            mine = self.train(plan, job.terms.spec_hash, None)
            self._mark(key, "new", mine="0x" + mine.hex(), mine_by=by)
        if mine == s.result:
            self._mark(key, "agreed")
            self.log(f"job {job_id} slot {slot}: result 0x{s.result.hex()[:16]}... matches my re-execution")
            return True
        if s.status != SlotStatus.REVEALED or self.now() > job.terms.challenge_deadline:
            self._mark(key, "missed")
            return False
        bond = max(self.bond or 0, retry(lambda: self.market.required_bond(job_id, slot)))
        if self.refuses_bond(job_id, bond):
            self._mark(key, "refused", reason=f"bond {bond}")
            return False
        try:
            self.pay(self.market.contract.functions.openDispute(job_id, slot, bond), "openDispute", job.terms.token, bond)
        except InsufficientFunds:
            return False  # logged once by pay; the slot stays "new" and is retried until the window closes
        except ContractRevert as exc:
            self._mark(key, "refused", reason=exc.name)
            self.log(f"job {job_id} slot {slot}: openDispute refused: {exc.name}")
            return False
        self.log(f"job {job_id} slot {slot}: result 0x{s.result.hex()[:16]}... differs from mine "
                 f"0x{mine.hex()[:16]}...; disputed with a {self.units(job.terms.token, bond)} bond")
        self._mark(key, "disputing")  # the DisputeOpened event (next tick) records the game
        return True

"""Read-only views for ``verde-chain job status`` and ``verde-chain dispute status``."""

from __future__ import annotations

from typing import Any

from verde_chain.agents.tokens import TokenInfo, token_info
from verde_chain.agents.trace import interval
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.dispute.types import Phase
from verde_chain.market.types import Job, JobStatus


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def job_status(market: Market, games: DisputeGameClient, job_id: int) -> dict[str, Any]:
    job = market.job(job_id)
    s = job.terms
    # amounts stay integers in the smallest unit (exact, for machines); `token` says how to read them
    tok = token_info(market.w3, market.artifacts, s.token)
    disputes = []
    for ev in market.logs("DisputeOpened", 0):
        if int(ev.args["jobId"]) != job_id:
            continue
        gid = int(ev.args["gameId"])
        d = market.dispute(gid)
        v = games.game(gid)
        disputes.append({
            "game_id": gid, "defender_slot": d.defender_slot, "challenger": d.challenger, "kind": d.kind.name,
            "bond": d.bond, "bond_posted": int(ev.args["bond"]), "active": d.active, "phase": v.phase.name,
            "winner": v.winner if v.phase == Phase.RESOLVED else None,
        })
    now = int(market.w3.eth.get_block("latest")["timestamp"])
    return {
        "job_id": job_id, "status": job.status.name, "phase": job_phase(job, now), "client": job.client,
        "token": tok.as_dict(),
        "spec_hash": _hex(s.spec_hash), "num_steps": s.num_steps, "num_nodes": s.num_nodes, "arity": s.arity,
        "reward": s.reward, "reward_held": job.reward_held, "trainer_stake": s.trainer_stake,
        "min_challenge_bond": s.min_challenge_bond, "submission_deadline": s.submission_deadline,
        "reveal_deadline": s.reveal_deadline, "challenge_deadline": s.challenge_deadline,
        "clock_seconds": s.clock_seconds,
        "active_disputes": job.active_disputes, "accepted_result": _hex(job.accepted_result),
        "slots": [{"slot": i, "trainer": sl.trainer, "status": sl.status.name, "stake_held": sl.stake_held,
                   "result": _hex(sl.result)} for i, sl in enumerate(market.slots(job_id))],
        "disputes": disputes,
    }


def job_phase(job: Job, now: int) -> str:
    """Where a job stands in the commit-reveal protocol at `now` (the latest block's time)."""
    t = job.terms
    if job.status == JobStatus.FINALIZED:
        return "finalized"
    if now <= t.submission_deadline:
        return "commit"  # trainers join and commit; no result is public yet
    if now <= t.reveal_deadline:
        return "reveal"  # trainers open their commitments; disputes open from each reveal
    if now <= t.challenge_deadline:
        return "challenge"
    return "disputes running" if job.active_disputes else "ready to finalize"


def dispute_status(market: Market, games: DisputeGameClient, game_id: int, now: int) -> dict[str, Any]:
    d = market.dispute(game_id)
    v = games.game(game_id)
    iv = interval(v)
    counts: dict[str, int] = {}
    for name, _ in games.history(game_id):
        counts[name] = counts.get(name, 0) + 1
    elapsed = max(0, now - v.turn_started_at)
    tok = token_info(market.w3, market.artifacts, market.job(d.job_id).terms.token)
    # `bond` is what the market still holds (0 once settled); the event keeps what was posted
    posted = next((int(ev.args["bond"]) for ev in market.logs("DisputeOpened", 0) if int(ev.args["gameId"]) == game_id),
                  d.bond)
    return {
        "token": tok.as_dict(), "bond_posted": posted,
        "game_id": game_id, "job_id": d.job_id, "kind": d.kind.name, "bond": d.bond, "active": d.active,
        "defender": v.defender, "challenger": v.challenger, "phase": v.phase.name,
        "level": v.phase.level if v.phase not in (Phase.NONE, Phase.RESOLVED) else None,
        "interval": None if iv is None else {"unit": iv.unit, "lo": iv.lo, "hi": iv.hi, "total": iv.total},
        "to_move": v.to_move, "defender_clock_left": v.defender_left, "challenger_clock_left": v.challenger_left,
        "turn_elapsed": elapsed if v.to_move else None,
        "step": v.step, "node": v.node_index, "element": v.element,
        "winner": v.winner if v.phase == Phase.RESOLVED else None,
        "resolution": v.resolution.name if v.phase == Phase.RESOLVED else None,
        "events": counts,
    }


PHASE_TEXT = {
    "commit": "commit phase (results committed, none public)", "reveal": "reveal phase",
    "challenge": "challenge window open", "disputes running": "waiting for its disputes",
    "ready to finalize": "ready to finalize", "finalized": "finalized",
}


def format_job(st: dict[str, Any]) -> str:
    t = st["token"]
    tok = TokenInfo(t["address"], t["symbol"], t["decimals"])
    u = tok.format
    paid_in = "ETH" if tok.is_eth else f"{tok.symbol} ({tok.address}" + (
        f", {tok.decimals} decimals)" if tok.decimals is not None else ", no decimals(): raw units)")
    lines = [f"job {st['job_id']}: {st['status']}, {PHASE_TEXT[st['phase']]}  client {st['client']}",
             f"  spec {st['spec_hash']}  {st['num_steps']} steps, {st['num_nodes']} nodes, arity {st['arity']}",
             f"  paid in {paid_in}",
             (f"  reward {u(st['reward'])} (held {u(st['reward_held'])}), stake {u(st['trainer_stake'])}, "
              f"min bond {u(st['min_challenge_bond'])}"),
             (f"  submission deadline {st['submission_deadline']}, reveal deadline {st['reveal_deadline']}, "
              f"challenge deadline {st['challenge_deadline']}, clock {st['clock_seconds']} s"),
             f"  accepted result {st['accepted_result']}", "",
             f"  {'slot':<5}{'trainer':<44}{'status':<11}{'stake held':>22}  result"]
    for s in st["slots"]:
        lines.append(f"  {s['slot']:<5}{s['trainer']:<44}{s['status']:<11}{u(s['stake_held']):>22}  "
                     f"{s['result'][:18]}...")
    if st["disputes"]:
        lines += ["", (f"  {'game':<6}{'slot':<6}{'kind':<9}{'challenger':<44}{'phase':<11}{'active':<8}"
                       f"{'bond posted':>22}  winner")]
        for d in st["disputes"]:
            lines.append(f"  {d['game_id']:<6}{d['defender_slot']:<6}{d['kind']:<9}{d['challenger']:<44}"
                         f"{d['phase']:<11}{d['active']!s:<8}{u(d['bond_posted']):>22}  {d['winner'] or '-'}")
    return "\n".join(lines)


def format_dispute(st: dict[str, Any]) -> str:
    iv = st["interval"]
    t = st["token"]
    bond = TokenInfo(t["address"], t["symbol"], t["decimals"]).format(st["bond_posted"])
    lines = [
        f"game {st['game_id']} (job {st['job_id']}, {st['kind']}, bond {bond}): {st['phase']}",
        f"  defender   {st['defender']}  clock left {st['defender_clock_left']} s",
        f"  challenger {st['challenger']}  clock left {st['challenger_clock_left']} s",
    ]
    if iv:
        lines.append(f"  level {st['level']}: {iv['unit']} [{iv['lo']}, {iv['hi']}] of [0, {iv['total']}]"
                     f"  (step {st['step']}, node {st['node']}, element {st['element']})")
        lines.append(f"  to move: {st['to_move']} ({st['turn_elapsed']} s into its turn)")
    if st["winner"]:
        lines.append(f"  resolved by {st['resolution']}: winner {st['winner']}")
    lines.append("  events: " + ", ".join(f"{k} x{v}" for k, v in sorted(st["events"].items())))
    return "\n".join(lines)

"""What a restarted bot says it picks up: each game still running (its level, whose move, the
time left on this bot's chess clock) and each job still in progress, read from its SQLite file
and the chain, so whoever restarts a bot sees at once where it stands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verde_chain.agents.wallet import retry
from verde_chain.dispute.types import GameView, Phase, Side

if TYPE_CHECKING:
    from verde_chain.agents.bot import Bot

FINAL_JOB_STATES = ("done", "skipped")


def my_clock(v: GameView, me: str, now: int) -> int:
    """Seconds left on ``me``'s clock: the stored figure, less the running turn when it is ours."""
    left = v.defender_left if me == v.defender else v.challenger_left
    side = Side.DEFENDER if me == v.defender else Side.CHALLENGER
    return max(0, left - (now - v.turn_started_at)) if v.phase.mover == side else left


def resume_lines(bot: Bot) -> list[str]:
    """One line per game and job a bot restarted from its file takes up again (none when fresh)."""
    lines = []
    now = bot.now()
    for gid, rec in bot.store.games().items():
        if rec.get("done"):
            continue
        v = retry(lambda g=gid: bot.games.game(g))  # type: ignore[misc]
        if v.phase == Phase.RESOLVED:
            lines.append(f"resuming game {gid}: it was resolved while I was away ({v.resolution.name})")
            continue
        turn = "my move" if v.to_move == bot.address else "their move"
        lines.append(f"resuming game {gid} at L{v.phase.level} as the {rec.get('role', '?')} ({turn}), "
                     f"{my_clock(v, bot.address, now)} s on my clock")
    for jid, rec in bot.store.jobs().items():
        if rec.get("state") not in FINAL_JOB_STATES:
            lines.append(f"resuming job {jid} ({rec.get('state')})")
    return lines

"""What a bot accepts before it locks money in a job: the policy checked before a trainer stakes
(``join``) and before a challenger or rival bonds (``openDispute``, ``disputeRival``).

A market's bounds (``market/marketparams.py``) keep the worst trap jobs off a well-deployed
market, but a bot cannot trust whoever deployed the market it is pointed at, nor that bounds
chosen for 12 s blocks suit its own speed. So each bot checks every job against its own
``Policy`` (typed, with defaults; ``verde-chain trainer run --policy FILE.json``) and the
conditions it measures itself (``Conditions``: the chain's block interval, the gas price, the
market's burn share, how long its own moves take to land), and refuses with one line naming the
rule, the job's value and its limit:

  token        the job's token is on the allow-list                (default: ETH only)
  clock        clockSeconds >= margin x moves of one side of a game x its move latency
  stake        trainerStake <= max_stake_to_share x its reward share (reward / slots)
  bond         minChallengeBond's unburned share pays a whole defence at the current gas price
               (ETH; an ERC-20's bond is compared with the policy's own price in that token)
  windows      reveal and challenge windows of at least min_window_blocks blocks
  horizon      everything is settled (challenge deadline + two clocks) within `horizon` seconds
  max bond     a challenger or rival locks at most `max_bond` in one dispute (if set)

The trap jobs of issue #13 (a 1 s clock, a 2^64-1 clock or deadline, a 1 s challenge window, a
20,000 wei bond, an unknown token) each fail one rule (``tests/agents/test_policy.py``).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from verde_chain.agents.errors import AgentError
from verde_chain.job import Job
from verde_chain.market.marketparams import BPS, DAY, DEFENCE_GAS
from verde_chain.market.types import ETH, JobTerms


@dataclass(frozen=True)
class Policy:
    """A bot's limits (amounts in the job token's smallest unit, times in seconds)."""

    tokens: tuple[str, ...] = (ETH,)  # tokens the bot accepts payment and stakes in
    clock_margin: float = 1.5  # clock >= margin x (one side's moves in a game) x (move latency)
    max_stake_to_share: float = 2.0  # stake at most this many times the trainer's reward share
    defence_gas: int = DEFENCE_GAS  # gas of one whole honest defence, paid by a forfeited bond
    min_window_blocks: int = 50  # reveal and challenge windows, in block intervals
    horizon: int = 60 * DAY  # the longest the bot lets a stake or bond stay locked
    max_bond: int | None = None  # the most it locks in one dispute (None: whatever the market asks)
    token_bonds: tuple[tuple[str, int], ...] = ()  # ERC-20: (token, the least a forfeited bond must pay)

    @classmethod
    def from_json(cls, path: str | Path) -> Policy:
        """A policy file: a JSON object with any of the fields above (the rest keep their defaults)."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise AgentError(f"policy file {path}: {exc}") from exc
        known = {f.name for f in fields(cls)}
        if not isinstance(raw, dict) or set(raw) - known:
            extra = sorted(set(raw) - known) if isinstance(raw, dict) else raw
            raise AgentError(f"policy file {path}: unknown fields {extra}; known: {', '.join(sorted(known))}")
        try:
            if "tokens" in raw:
                raw["tokens"] = tuple(_address(t) for t in raw["tokens"])
            if "token_bonds" in raw:
                raw["token_bonds"] = tuple((_address(t), _number(a, int)) for t, a in raw["token_bonds"])
            for name in ("clock_margin", "max_stake_to_share"):
                if name in raw:
                    raw[name] = _number(raw[name], float)
            for name in ("defence_gas", "min_window_blocks", "horizon"):
                if name in raw:
                    raw[name] = _number(raw[name], int)
            if raw.get("max_bond") is not None:
                raw["max_bond"] = _number(raw["max_bond"], int)
        except (TypeError, ValueError) as exc:
            raise AgentError(f"policy file {path}: {exc}") from exc
        return cls(**raw)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _address(value: Any) -> str:
    if not (isinstance(value, str) and len(value) == 42 and value.startswith("0x")):
        raise ValueError(f"{value!r} is not a 0x-prefixed 20-byte address")
    int(value, 16)
    return value


def _number(value: Any, kind: type[int | float]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or (kind is int and not float(value).is_integer()):
        raise ValueError(f"{value!r} is not a non-negative {kind.__name__}")
    return kind(value)


@dataclass(frozen=True)
class Conditions:
    """What the bot measured just before it decides."""

    now: int  # the chain's time
    block_interval: float  # seconds between blocks (median of recent ones, at least 1)
    gas_price: int  # wei per gas now
    burn_bps: int  # the market's burned share of a forfeit
    move_latency: float  # seconds of clock one of its moves costs (measured, or two block intervals)


def side_moves(terms: JobTerms, job: Job | None = None) -> int:
    """An upper bound on the moves one side makes in a game of this job: the defender's posts of
    every bisection round at each level, its node and chunk reveals and the final step. Without the
    bundle, elements and instructions per node are taken at their 2^32 / 2^16 limits."""
    k = terms.arity

    def rounds(n: int) -> int:
        return max(1, math.ceil(math.log(max(2, n), k)))

    numel = max((n.desc.numel for n in job.program.graph.nodes), default=1) if job else 2**32
    micro = max((n.desc.num_steps for n in job.program.graph.nodes), default=1) if job else 2**16
    interval = max(1, terms.checkpoint_interval)
    level1 = rounds(math.ceil(terms.num_steps / interval)) + (rounds(interval) if interval > 1 else 0)
    return level1 + rounds(terms.num_nodes) + 1 + rounds(numel) + 1 + 1 + rounds(micro) + 1


def refusal(terms: JobTerms, policy: Policy, cond: Conditions, job: Job | None, role: str) -> str | None:
    """Why `role` ("trainer" or "challenger") will not take part in this job, or None. The
    trainer checks everything; a challenger, whose bond comes back when it is right, checks the
    token, its clock, the windows and the horizon."""
    token = int(terms.token, 16)
    if token not in {int(t, 16) for t in policy.tokens}:
        return f"token {terms.token} is not on my allow-list ({', '.join(policy.tokens)})"
    moves = side_moves(terms, job)
    need = policy.clock_margin * moves * cond.move_latency
    if terms.clock_seconds < need:
        return (f"clock {terms.clock_seconds} s is below the {need:.0f} s I need ({policy.clock_margin} x {moves} "
                f"moves x {cond.move_latency:.1f} s per move)")
    window = policy.min_window_blocks * cond.block_interval
    for name, value in (("reveal window", terms.reveal_window), ("challenge window", terms.challenge_window)):
        if value < window:
            return f"{name} {value} s is shorter than {policy.min_window_blocks} blocks ({window:.0f} s)"
    settled = terms.submission_deadline + terms.reveal_window + terms.challenge_window + 2 * terms.clock_seconds
    if settled - cond.now > policy.horizon:
        return (f"money would be locked until {settled - cond.now} s from now, beyond my horizon of "
                f"{policy.horizon} s (deadline, windows and clock)")
    if role != "trainer":
        return None
    share = terms.reward / max(1, terms.slots)
    if terms.trainer_stake > policy.max_stake_to_share * share:
        return (f"stake {terms.trainer_stake} is more than {policy.max_stake_to_share} x my reward share "
                f"{share:.0f}")
    paid = terms.min_challenge_bond * (BPS - cond.burn_bps) // BPS
    if token == 0:
        defence = policy.defence_gas * cond.gas_price
        if paid < defence:
            return (f"bond {terms.min_challenge_bond} pays a defender {paid} wei when forfeited, less than a "
                    f"defence costs ({policy.defence_gas} gas x {cond.gas_price} wei = {defence})")
        return None
    # gas is paid in ETH: a token's bond is compared with the bot's own price of a defence in it
    least = next((amount for t, amount in policy.token_bonds if int(t, 16) == token), 0)
    if paid < least:
        return f"bond {terms.min_challenge_bond} pays a defender {paid} when forfeited, less than my {least}"
    return None


def bond_refusal(bond: int, policy: Policy) -> str | None:
    """Why the bot will not lock `bond` in one dispute (the price rises while games run), or None."""
    if policy.max_bond is not None and bond > policy.max_bond:
        return f"the dispute asks a bond of {bond}, above my limit of {policy.max_bond}"
    return None


def block_interval(timestamps: list[int]) -> float:
    """Seconds between blocks: the median gap of consecutive timestamps (robust to the odd long gap
    of a quiet dev chain), at least 1."""
    gaps = [b - a for a, b in itertools.pairwise(timestamps)]
    return max(1.0, float(statistics.median(gaps))) if gaps else 1.0

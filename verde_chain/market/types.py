"""Python twin of ``contracts/market/JobTypes.sol``: the market's enums and structs, and its pure rules.

Pure data (no web3): the bots, the CLI and the tests read and build these; the web3 client
(``verde_chain.chain.market_client``) encodes them as the contract's ABI tuples. Enum numbers and
struct field orders are the Solidity ones. ``JobTerms`` is what a client posts on chain (money,
deadlines, game parameters and the job's commitments); the off-chain job it commits to by
``spec_hash`` is ``verde_chain.job.JobSpec``.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from enum import IntEnum
from typing import Any

from verde_chain.errors import CustomError

ETH = "0x0000000000000000000000000000000000000000"
ZERO32 = b"\x00" * 32
MAX_SLOTS = 32  # JobMarket.MAX_SLOTS


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    FINALIZED = 2


class SlotStatus(IntEnum):
    EMPTY = 0
    JOINED = 1
    SUBMITTED = 2
    REJECTED = 3
    SETTLED = 4


class DisputeKind(IntEnum):
    NONE = 0
    OUTSIDE = 1
    RIVAL = 2


@dataclass(frozen=True)
class JobTerms:
    """What a client posts (twin of the Solidity ``JobTerms`` struct, same field order)."""

    token: str
    spec_hash: bytes
    graph_root: bytes
    initial_commitment: bytes
    batch_root: bytes
    num_steps: int
    checkpoint_interval: int
    reward: int
    trainer_stake: int
    min_challenge_bond: int
    slots: int
    submission_deadline: int
    challenge_window: int
    arity: int
    clock_seconds: int
    num_nodes: int

    def as_tuple(self) -> tuple[Any, ...]:
        return astuple(self)

    @property
    def challenge_deadline(self) -> int:
        return self.submission_deadline + self.challenge_window


def validate(terms: JobTerms, now: int) -> None:
    """Twin of JobTypes.validate + postJob's own checks: raise the ``InvalidJobTerms(field, value)``
    the market would revert with for `terms` posted at time `now` (the first failing check)."""
    t = terms
    checks: list[tuple[str, bool, int | bytes]] = [
        ("numSteps", t.num_steps == 0, t.num_steps),
        ("checkpointInterval", t.checkpoint_interval == 0 or t.checkpoint_interval > t.num_steps,
         t.checkpoint_interval),
        ("slots", t.slots == 0, t.slots),
        ("trainerStake", t.trainer_stake == 0, t.trainer_stake),
        ("minChallengeBond", t.min_challenge_bond == 0, t.min_challenge_bond),
        ("submissionDeadline", t.submission_deadline <= now, t.submission_deadline),
        ("challengeWindow", t.challenge_window == 0, t.challenge_window),
        ("arity", not (2 <= t.arity <= 256 and t.arity & (t.arity - 1) == 0), t.arity),
        ("clockSeconds", t.clock_seconds == 0, t.clock_seconds),
        ("numNodes", t.num_nodes == 0, t.num_nodes),
        ("initialCommitment", t.initial_commitment == ZERO32, t.initial_commitment),
        ("graphRoot", t.graph_root == ZERO32, t.graph_root),
        ("slots", t.slots > MAX_SLOTS, t.slots),
        ("reward", t.reward == 0, t.reward),
    ]
    for name, bad, value in checks:
        if bad:
            v = int.from_bytes(value, "big") if isinstance(value, bytes) else value
            raise CustomError("InvalidJobTerms", field=name, value=v)


def reward_share(reward: int, n: int, rank: int) -> int:
    """Twin of JobTypes.share: equal shares, the first survivor (slot order) takes the remainder."""
    base = reward // n
    return base + (reward - base * n) if rank == 0 else base


@dataclass(frozen=True)
class Job:
    """A job as the market stores it (twin of the Solidity ``Job`` struct)."""

    terms: JobTerms
    client: str
    status: JobStatus
    slots_taken: int
    active_disputes: int
    reward_held: int
    accepted_result: bytes


@dataclass(frozen=True)
class Slot:
    trainer: str
    status: SlotStatus
    stake_held: int
    result: bytes
    checkpoint_root: bytes


@dataclass(frozen=True)
class Dispute:
    job_id: int
    kind: DisputeKind
    active: bool
    defender_slot: int
    challenger_slot: int
    challenger: str
    bond: int


@dataclass(frozen=True)
class MarketEvent:
    """One decoded JobMarket log: ``name`` is the Solidity event name, ``args`` its fields."""

    name: str
    args: dict[str, Any]
    block: int
    log_index: int
    tx_hash: bytes

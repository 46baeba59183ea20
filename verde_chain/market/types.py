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

from eth_abi import encode as abi_encode

from verde_chain.commit.merkle import keccak256
from verde_chain.errors import CustomError

ETH = "0x0000000000000000000000000000000000000000"
ZERO32 = b"\x00" * 32
MAX_SLOTS = 32  # JobMarket.MAX_SLOTS
MAX_BUNDLE_URI = 2048  # JobMarket.MAX_BUNDLE_URI


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    FINALIZED = 2


class SlotStatus(IntEnum):
    EMPTY = 0
    JOINED = 1
    COMMITTED = 2
    REVEALED = 3
    REJECTED = 4
    SETTLED = 5


class DisputeKind(IntEnum):
    NONE = 0
    OUTSIDE = 1
    RIVAL = 2


@dataclass(frozen=True)
class JobTerms:
    """What a client posts (twin of the Solidity ``JobTerms`` struct, same field order)."""

    token: str
    spec_hash: bytes
    bundle_uri: str
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
    reveal_window: int
    challenge_window: int
    arity: int
    clock_seconds: int
    num_nodes: int

    def as_tuple(self) -> tuple[Any, ...]:
        return astuple(self)

    @property
    def reveal_deadline(self) -> int:
        """Last second at which commitments can be revealed (they open after submission_deadline)."""
        return self.submission_deadline + self.reveal_window

    @property
    def challenge_deadline(self) -> int:
        return self.submission_deadline + self.reveal_window + self.challenge_window


def commitment(result: bytes, checkpoint_root: bytes, salt: bytes, trainer: str) -> bytes:
    """Twin of JobTypes.commitment: keccak256(abi.encode(result, checkpointRoot, salt, trainer))."""
    return keccak256(abi_encode(["bytes32", "bytes32", "bytes32", "address"], [result, checkpoint_root, salt, trainer]))


def validate(terms: JobTerms) -> None:
    """Twin of JobTypes.validate + postJob's own checks: raise the ``InvalidJobTerms(field, value)``
    the market would revert with for `terms` (the first failing check). The clock, the windows,
    the deadline and the bond are bounded by the market parameters next
    (``verde_chain.market.marketparams.check_job``)."""
    t = terms
    uri_length = len(t.bundle_uri.encode())
    checks: list[tuple[str, bool, int | bytes]] = [
        ("numSteps", t.num_steps == 0, t.num_steps),
        ("checkpointInterval", t.checkpoint_interval == 0 or t.checkpoint_interval > t.num_steps,
         t.checkpoint_interval),
        ("slots", t.slots == 0, t.slots),
        ("trainerStake", t.trainer_stake == 0, t.trainer_stake),
        ("arity", not (2 <= t.arity <= 256 and t.arity & (t.arity - 1) == 0), t.arity),
        ("numNodes", t.num_nodes == 0, t.num_nodes),
        ("initialCommitment", t.initial_commitment == ZERO32, t.initial_commitment),
        ("graphRoot", t.graph_root == ZERO32, t.graph_root),
        ("slots", t.slots > MAX_SLOTS, t.slots),
        ("reward", t.reward == 0, t.reward),
        ("bundleUri", uri_length > MAX_BUNDLE_URI, uri_length),
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
    open_against: int  # games running against this result
    open_as_rival: int  # rival games this slot opened and still plays
    stake_held: int
    commitment: bytes
    result: bytes
    checkpoint_root: bytes
    beaten_by: int  # earliest-opened game that beat this result (0: none)
    beaten_winner: str  # its winner, who receives the stake less the burn

    @property
    def standing(self) -> bool:
        """A revealed result not beaten in any game (it can be disputed and can be paid)."""
        return self.status is SlotStatus.REVEALED


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

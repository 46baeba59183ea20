"""Market parameters: the typed twin of ``contracts/market/MarketParams.sol``, its pure rules, and
the deployment profiles (the one place their defaults live).

A JobMarket is deployed with one ``MarketParams`` and can never change it. The parameters bound
what a client may post, so no job can be a trap for the trainers and challengers who take it::

    clock            [10 blocks, 3 days]      a 1 s clock lets a sybil win on time; years lock stakes
    reveal window    [50 blocks, 3 days]      every trainer can get one transaction in
    challenge window [300 blocks, 14 days]    challengers can re-execute before it closes
    deadline         now + [1 s, 30 days]     no stake is locked for ever
    bond             >= the token's floor     its unburned share pays an honest defence's gas
    burn             50% of every forfeit     cheating and self-challenges cost (docs/protocol.md)
    dispute price    bond x 2 per 16 games running against one result (a priced bound, no lock-out)

Two profiles: ``mainnet`` (12 s blocks, floors priced at 20 gwei) is what ``verde-chain deploy``
and the demo use; ``fast`` (1 s blocks, 1 gwei) is what the test fixtures use. Both derive
every bound from the block time, so they are the same rules at two speeds. A third, ``dev``, is
``fast`` with windows and clocks of seconds, for a local chain one person plays on (a job from
post to payment in about a minute, docs/own-model.md); never for a chain others use, where
seconds are not enough for a stranger to notice a cheat and answer it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from eth_utils import to_checksum_address

from verde_chain.errors import CustomError
from verde_chain.market.types import ETH, JobTerms

BPS = 10_000
DAY = 86_400

# Gas an honest defender spends on one whole game, played to the one-step proof: the largest of
# the measured games (scripts/bench_dispute.py, the demo's digits and transformer disputes, see
# docs/protocol.md "Bond floor") rounded up. The bond floor makes a losing challenger pay it.
DEFENCE_GAS = 2_000_000
BURN_BPS = 5_000  # half of every forfeited stake and bond, as Arbitrum Classic burned half a loser's stake
DISPUTES_PER_BOND_STEP = 16

CLOCK_MIN_BLOCKS = 10
REVEAL_MIN_BLOCKS = 50
CHALLENGE_MIN_BLOCKS = 300
MAX_CLOCK = 3 * DAY
MAX_REVEAL_WINDOW = 3 * DAY
MAX_CHALLENGE_WINDOW = 14 * DAY
MAX_DEADLINE_HORIZON = 30 * DAY


@dataclass(frozen=True)
class MarketParams:
    """Twin of the Solidity ``MarketParams`` struct (same field order). ``bond_floors`` holds
    (token, smallest bond in its smallest unit); address(0) is ETH; other tokens are refused."""

    min_clock_seconds: int
    max_clock_seconds: int
    min_reveal_window: int
    max_reveal_window: int
    min_challenge_window: int
    max_challenge_window: int
    max_deadline_horizon: int
    burn_bps: int
    disputes_per_bond_step: int
    bond_floors: tuple[tuple[str, int], ...]

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            self.min_clock_seconds, self.max_clock_seconds, self.min_reveal_window, self.max_reveal_window,
            self.min_challenge_window, self.max_challenge_window, self.max_deadline_horizon, self.burn_bps,
            self.disputes_per_bond_step, [tuple(f) for f in self.bond_floors],
        )

    @classmethod
    def from_tuple(cls, t: Any) -> MarketParams:
        c_lo, c_hi, r_lo, r_hi, w_lo, w_hi, horizon, burn, step, floors = t
        return cls(c_lo, c_hi, r_lo, r_hi, w_lo, w_hi, horizon, burn, step,
                   tuple((str(tok), int(amount)) for tok, amount in floors))

    def floor(self, token: str) -> int:
        """The bond floor of `token` (0: jobs cannot pay in it)."""
        return next((amount for tok, amount in self.bond_floors if int(tok, 16) == int(token, 16)), 0)

    def with_token(self, token: str, floor: int) -> MarketParams:
        """These parameters, also allowing jobs paid in `token` with bonds of at least `floor`."""
        return replace(self, bond_floors=(*self.bond_floors, (token, floor)))


def bond_floor(gas_price: int, burn_bps: int = BURN_BPS, defence_gas: int = DEFENCE_GAS) -> int:
    """The smallest bond whose unburned share pays an honest defender's whole game at `gas_price`."""
    return -(-defence_gas * gas_price * BPS // (BPS - burn_bps))


def profile(block_seconds: int, gas_price: int) -> MarketParams:
    """Bounds for a chain with `block_seconds` blocks; the ETH floor priced at `gas_price` wei/gas."""
    return MarketParams(
        min_clock_seconds=CLOCK_MIN_BLOCKS * block_seconds, max_clock_seconds=MAX_CLOCK,
        min_reveal_window=REVEAL_MIN_BLOCKS * block_seconds, max_reveal_window=MAX_REVEAL_WINDOW,
        min_challenge_window=CHALLENGE_MIN_BLOCKS * block_seconds, max_challenge_window=MAX_CHALLENGE_WINDOW,
        max_deadline_horizon=MAX_DEADLINE_HORIZON, burn_bps=BURN_BPS, disputes_per_bond_step=DISPUTES_PER_BOND_STEP,
        bond_floors=((ETH, bond_floor(gas_price)),),
    )


MAINNET = profile(block_seconds=12, gas_price=20 * 10**9)
FAST = profile(block_seconds=1, gas_price=10**9)
DEV = replace(FAST, min_clock_seconds=10, min_reveal_window=5, min_challenge_window=5)
PROFILES = {"mainnet": MAINNET, "fast": FAST, "dev": DEV}


# -- twins of the pure rules in contracts/market/MarketParams.sol (MarketRules) -------------------

def check(p: MarketParams) -> None:
    """Twin of MarketRules.check: raise the ``InvalidMarketParams(field, value)`` the constructor
    reverts with (for ``bondFloors``, `value` is the offending entry's index)."""
    checks = [
        ("minClockSeconds", p.min_clock_seconds == 0, 0),
        ("maxClockSeconds", p.max_clock_seconds < p.min_clock_seconds, p.max_clock_seconds),
        ("minRevealWindow", p.min_reveal_window == 0, 0),
        ("maxRevealWindow", p.max_reveal_window < p.min_reveal_window, p.max_reveal_window),
        ("minChallengeWindow", p.min_challenge_window == 0, 0),
        ("maxChallengeWindow", p.max_challenge_window < p.min_challenge_window, p.max_challenge_window),
        ("maxDeadlineHorizon", p.max_deadline_horizon == 0, 0),
        ("burnBps", p.burn_bps >= BPS, p.burn_bps),
        ("disputesPerBondStep", p.disputes_per_bond_step == 0, 0),
        ("bondFloors", not p.bond_floors, 0),
    ]
    tokens = [int(t, 16) for t, _ in p.bond_floors]
    checks += [("bondFloors", amount == 0 or tokens[i] in tokens[:i], i) for i, (_, amount) in enumerate(p.bond_floors)]
    for name, bad, value in checks:
        if bad:
            raise CustomError("InvalidMarketParams", field=name, value=value)


def check_job(terms: JobTerms, p: MarketParams, now: int) -> None:
    """Twin of MarketRules.checkJob: raise the ``TokenNotAllowed(token)`` or
    ``TermsOutOfBounds(field, value, min, max)`` the market reverts with for `terms` posted at `now`
    (checked after ``market.types.validate``)."""
    floor = p.floor(terms.token)
    if floor == 0:
        raise CustomError("TokenNotAllowed", token=to_checksum_address(terms.token))
    bounds = [
        ("clockSeconds", terms.clock_seconds, p.min_clock_seconds, p.max_clock_seconds),
        ("revealWindow", terms.reveal_window, p.min_reveal_window, p.max_reveal_window),
        ("challengeWindow", terms.challenge_window, p.min_challenge_window, p.max_challenge_window),
        ("submissionDeadline", terms.submission_deadline, now + 1, now + p.max_deadline_horizon),
        ("minChallengeBond", terms.min_challenge_bond, floor, 2**256 - 1),
    ]
    for name, value, lo, hi in bounds:
        if not lo <= value <= hi:
            raise CustomError("TermsOutOfBounds", field=name, value=value, min=lo, max=hi)


def required_bond(min_bond: int, open_games: int, step: int) -> int:
    """Twin of MarketRules.requiredBond: the minimum doubled per `step` running games (saturating
    at 2^256 - 1, also from 256 doublings on)."""
    doublings = open_games // step
    value = min_bond << doublings
    return value if doublings < 256 and value < 2**256 else 2**256 - 1


def split_forfeit(amount: int, burn_bps: int) -> tuple[int, int]:
    """Twin of MarketRules.split: (burned, paid to the winner)."""
    burned = amount * burn_bps // BPS
    return burned, amount - burned

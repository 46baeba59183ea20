"""Clock.sol (contracts/dispute/) against its Python twin verde_chain/dispute/clock.py, through a live
game: each party's time left after a move, the last second on time, and the two errors (ClockExpired
for a late move, ClockNotExpired for an early timeout claim) with the same name and fields.

Calls run at the latest block (``eth_call``), so ``now`` is that block's timestamp on both sides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.dispute import Env, revert
from tests.support.toy import ToyJob, ToyWorld, default_graph
from verde_chain.chain.tx import call
from verde_chain.dispute import bisection
from verde_chain.dispute.clock import ChessClockModel
from verde_chain.dispute.types import GameView, Side
from verde_chain.errors import CustomError

pytestmark = pytest.mark.chain


def _model(v: GameView) -> ChessClockModel:
    return ChessClockModel(v.defender_left, v.challenger_left, v.turn_started_at)


def _same_refusal(twin: Callable[[], Any], sol: Callable[[], Any]) -> tuple[str, dict[str, object]]:
    with pytest.raises(CustomError) as py:
        twin()
    onchain = revert(sol)
    assert py.value.decoded == onchain.decoded, (py.value, onchain)
    return onchain.decoded


@pytest.mark.parametrize("budget", [1, 600])
def test_clock_twin_through_a_game(env: Env, chain: Any, budget: int) -> None:
    job = ToyJob(8, default_graph(3, (5,), (3,)))
    honest = ToyWorld(job)
    gid = env.create(job, honest.step_commitment(8), 2, clock=budget)
    g, D, C = env.client, env.defender, env.challenger
    f = g.contract.functions
    now = chain.timestamp
    clock = _model(g.game(gid))

    # the defender's turn: a timeout claimed early is refused the same way on both sides
    name, fields = _same_refusal(lambda: clock.require_expired(Side.DEFENDER, now()),
                                 lambda: call(f.claimTimeout(gid), env.artifacts, sender=C))
    assert name == "ClockNotExpired" and fields["side"] == Side.DEFENDER
    # it moves at its very last second (elapsed == left): still on time, charged all it had
    last = clock.turn_started_at + clock.defender_left
    claims = [honest.step_commitment(p) for p in bisection.split_points(0, 8, 2)[1:-1]]
    chain.set_next_timestamp(last)
    g.post_claims(gid, claims, D, 1)
    assert chain.timestamp() == last
    clock.charge(Side.DEFENDER, last)
    v = g.game(gid)
    assert (clock.defender_left, clock.challenger_left, clock.turn_started_at) == (
        v.defender_left, v.challenger_left, v.turn_started_at) == (0, budget, last)

    # the challenger's turn: one second past its time, its move is refused and the timeout stands
    chain.increase_time(clock.challenger_left + 1 - (now() - clock.turn_started_at))
    name, fields = _same_refusal(lambda: clock.charge(Side.CHALLENGER, now()),
                                 lambda: call(f.choose(gid, 0, claims), env.artifacts, sender=C))
    assert name == "ClockExpired" and fields["side"] == Side.CHALLENGER
    assert fields["elapsed"] == now() - clock.turn_started_at > fields["left"] == clock.challenger_left
    clock.require_expired(Side.CHALLENGER, now())
    assert clock.expired(Side.CHALLENGER, now())
    g.claim_timeout(gid, D)
    assert g.game(gid).winner == D

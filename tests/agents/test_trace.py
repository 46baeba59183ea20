"""Reading a played dispute back: the intervals per level, who made each one, and the picture."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.support.dispute import Env
from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.agents.trace import game_trace, narrowing, narrowing_moves, plot_bisection
from verde_chain.dispute.types import Phase

pytestmark = pytest.mark.chain


def test_every_interval_knows_who_made_it_and_the_picture_says_so(w3: Any, deploy: Any, artifacts: Any,
                                                                    tmp_path: Path) -> None:
    env = Env.deploy(w3, deploy, artifacts)
    job = ToyJob(9, default_graph(5, (1, 129, 300), (0, 1, 7, 20)))
    liar, honest = ToyWorld(job, Fault("micro", 6, 2, 200, 3)), ToyWorld(job)
    start = w3.eth.block_number + 1
    gid = env.create(job, liar.step_commitment(9), 2)
    out = env.play(gid, liar, honest)
    assert out.winner == env.challenger
    trace = game_trace(env.client, gid, start)
    moves = narrowing_moves(trace)
    for ivs in narrowing(trace).values():  # the distinct intervals, each inside the one before
        assert all(b.lo >= a.lo and b.hi <= a.hi and b != a for a, b in pairwise(ivs))
    for lvl, ivs in moves.items():
        assert ivs and ivs[0][1] == "opening"  # every level was reached; it opens with its full interval
        assert all(m in ("defender", "challenger") for _, m in ivs[1:-1] if lvl < 4)
    # binary bisection over steps: the defender posts a midpoint claim (the interval stays), the
    # challenger picks a side (it halves): the movers alternate and only the choices narrow
    l1 = moves[1]
    assert [m for _, m in l1[1:]] == ["defender", "challenger"] * ((len(l1) - 1) // 2)
    assert all((l1[i][0] == l1[i - 1][0]) == (l1[i][1] == "defender") for i in range(1, len(l1)))
    assert moves[4][-1][1] == "referee"  # the game ended with the one-step proof
    assert l1[-1][0].hi - l1[-1][0].lo == 1 and trace[-1][1].phase == Phase.RESOLVED
    n_moves = len(trace) - 1  # every state after the first is one move
    assert sum(len(ivs) - 1 for ivs in moves.values()) == n_moves
    png = tmp_path / "b.png"
    plot_bisection(trace, str(png), "Dispute 1", {"defender": "cheating trainer"},
                   "The cheater flipped bit 3 of element 200 of node 2 at step 6.")
    assert png.stat().st_size > 10_000

"""Steps a trainer re-executes to play a whole dispute, by checkpoint interval (measured on chain).

For each checkpoint interval N, a 1,000-step digits MLP job (T = 1,000, k = 16) is trained by an
honest world and by a cheating one (one flipped bit in the SGD parameter update at step d); both
keep a checkpoint every N steps, as a trainer does. Then the real game is played on a fresh Anvil
(DisputeGame + ScalarVM, through a ResolverMock): the cheater defends its C_T, the honest side
challenges, level 1 splits at multiples of N first. Every step either world executes after
training is counted (``TrainingWorld.executed``): that is the dispute's re-execution, measured,
for both parties; the table gives the larger of the two, mean and max over the divergence steps.

Usage: .venv/bin/python scripts/bench_reexec.py [--steps 1000] [--arity 16] [--intervals 10 20 50 100 200]
       [--points 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from verde_chain.chain.anvil import Anvil, increase_time
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.dispute import bisection, runner
from verde_chain.dispute import players as pl
from verde_chain.dispute.types import GameParams
from verde_chain.examples.digits import digits_job
from verde_chain.graph.world import OutputFault, TrainingWorld

CLOCK = 7 * 24 * 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--arity", type=int, default=16)
    ap.add_argument("--intervals", type=int, nargs="+", default=[10, 20, 50, 100, 200])
    ap.add_argument("--points", type=int, default=6, help="divergence steps per interval (random, seeded)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    arts = compile_contracts()
    rows: list[dict[str, Any]] = []
    with Anvil() as node:
        w3 = node.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        game = deploy_contract(w3, arts, "DisputeGame", deploy_contract(w3, arts, "ScalarVM").address)
        resolver = deploy_contract(w3, arts, "ResolverMock")
        client = DisputeGameClient(w3, game, arts)
        defender, challenger = w3.eth.accounts[1], w3.eth.accounts[2]
        for n in a.intervals:
            job = digits_job(steps=a.steps, checkpoint_interval=n)
            node_d = [x.index for x in job.program.graph.nodes if x.label == "sgd/sgd_param"][-1]
            counts, rounds = [], 0
            t0 = time.time()
            for d in sorted(rng.randint(1, a.steps) for _ in range(a.points)):
                honest = TrainingWorld.from_job(job)
                liar = TrainingWorld.from_job(job, OutputFault(d, node_d, 1, 3))
                c_t = liar.step_commitment(a.steps)
                assert c_t != honest.step_commitment(a.steps)
                before = (liar.executed, honest.executed)
                p = GameParams(defender, challenger, job.spec.initial_commitment, c_t, a.steps, job.spec.graph_root,
                               job.spec.batch_root, a.arity, CLOCK, job.spec.num_nodes, n)
                gid = client.create_game_via(resolver, p)
                out = runner.play(client, gid, pl.Defender(liar), pl.Challenger(honest), lambda s: increase_time(w3, s))
                assert out.winner == challenger and out.final is not None and out.final.step == d, out
                used = max(liar.executed - before[0], honest.executed - before[1])
                counts.append(used)
                rounds = max(rounds, out.moves[("challenger", 1)])
            row = {
                "N": n, "T": a.steps, "k": a.arity, "l1_rounds_max": rounds,
                "l1_rounds_bound": bisection.step_rounds(a.steps, a.arity, n),
                "reexec_mean": round(statistics.mean(counts), 1), "reexec_max": max(counts),
                "reexec_max_pct": round(100 * max(counts) / a.steps, 1), "divergence_points": a.points,
                "wall_s": round(time.time() - t0, 1),
            }
            rows.append(row)
            print(f"N={n:>4}: re-executed mean {row['reexec_mean']:>6} / max {row['reexec_max']:>4} steps "
                  f"({row['reexec_max_pct']}% of T), L1 rounds {rounds} (bound {row['l1_rounds_bound']}), "
                  f"{row['wall_s']} s", flush=True)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""Moves and gas of a full dispute game for a 1,000-step job, per party and per level.

Runs four games on a fresh Anvil:

  toy stepper, T steps x N nodes of toy kernels (sizes below):
    lying defender  vs honest challenger   (the fault is one micro-step of one element)
    honest defender vs lying challenger
  real ScalarVM, T steps of a 4-node RepOps training loop (verde_chain/dispute/kernel_world.py):
    lying defender  vs honest challenger
    honest defender vs lying challenger

and prints a table of moves and gas per party and level, the totals, and whether the goals
(<= 40 moves per party, <= 5,000,000 gas both parties together) hold. Level 1 splits at the job's
checkpoints first (every ``--interval`` steps). The last line is the largest gas an honest
defender spent on one whole game: what ``verde_chain.market.marketparams.DEFENCE_GAS`` must cover.

Usage: .venv/bin/python scripts/bench_dispute.py [--steps 1000] [--nodes 64] [--arity 16] [--interval 100]

The toy job is test support code (``tests/support/toy.py``): the script puts the repository root on
``sys.path`` to reach it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.chain.anvil import Anvil, increase_time
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.dispute import bisection, runner
from verde_chain.dispute import players as pl
from verde_chain.dispute.cheats import MicroFault
from verde_chain.dispute.kernel_world import KernelJob, KernelWorld
from verde_chain.dispute.types import GameParams
from verde_chain.market.marketparams import DEFENCE_GAS

MOVE_GOAL = 40
GAS_GOAL = 5_000_000


def table(out: runner.Outcome) -> str:
    rows = ["party       level  moves        gas"]
    for party in ("defender", "challenger"):
        for level in range(5):
            n = out.moves.get((party, level), 0)
            if n:
                rows.append(f"{party:<11} L{level:<5} {n:>5} {out.gas[(party, level)]:>10,}")
        rows.append(f"{party:<11} total  {out.total_moves(party):>5} {out.total_gas(party):>10,}")
    rows.append(f"both        total  {out.total_moves('defender') + out.total_moves('challenger'):>5} "
                f"{out.total_gas():>10,}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--arity", type=int, default=16)
    ap.add_argument("--interval", type=int, default=100, help="checkpoint interval N of the job")
    ap.add_argument("--numel", type=int, default=4096, help="elements of the largest output tensors")
    ap.add_argument("--micro", type=int, default=4097, help="micro-steps of the largest programs")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    numels = (a.numel, 256, 1000, 64)
    micro = (a.micro, 257, 65, 17)
    t0 = time.time()
    job = ToyJob(a.steps, default_graph(a.nodes, numels, micro), seed=a.seed)
    node = 4 * rng.randrange(a.nodes // 4)  # a node with the largest tensor and program
    fault = Fault("micro", rng.randrange(a.steps // 2, a.steps + 1), node, rng.randrange(a.numel),
                  rng.randrange(1, a.micro + 1))
    honest, liar = ToyWorld(job), ToyWorld(job, fault)
    honest.step_commitment(a.steps)
    liar.step_commitment(a.steps)
    print(f"job: T={a.steps} steps, {a.nodes} nodes/step, k={a.arity}, largest tensor {a.numel} elements, "
          f"largest program N={a.micro}; fault {fault}; worlds built in {time.time() - t0:.1f}s")
    bound = bisection.move_bound(a.steps, a.nodes, -(-a.numel // 128), a.micro, a.arity, a.interval)
    print(f"move bound (full game): defender {bound.defender}, challenger {bound.challenger}")

    t0 = time.time()
    kjob = KernelJob(a.steps, seed=a.seed)
    khonest = KernelWorld(kjob)
    kdesc = kjob.nodes[0][0]
    kfault = MicroFault(a.steps, 0, rng.randrange(kdesc.numel), kdesc.num_steps, bit=0)
    for s in sorted({rng.randrange(a.steps // 2, a.steps + 1) for _ in range(5)}):
        cand = KernelWorld(kjob, MicroFault(s, 0, kfault.element, kdesc.num_steps, bit=0))
        if cand.step_commitment(a.steps) != khonest.step_commitment(a.steps):  # the error survives to C_T
            kfault = cand.fault or kfault
            break
    kliar = KernelWorld(kjob, kfault)
    assert kliar.step_commitment(a.steps) != khonest.step_commitment(a.steps)
    print(f"VM job: T={a.steps} steps of a 4-node RepOps training loop (matmul N={kdesc.num_steps}); "
          f"fault {kfault}; built in {time.time() - t0:.1f}s")

    arts = compile_contracts()
    ok = True
    defence = 0
    with Anvil() as anvil:
        w3 = anvil.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        toy_game = deploy_contract(w3, arts, "DisputeGame", deploy_contract(w3, arts, "ToyStepper").address)
        vm_game = deploy_contract(w3, arts, "DisputeGame", deploy_contract(w3, arts, "ScalarVM").address)
        resolver = deploy_contract(w3, arts, "ResolverMock")
        accounts = list(w3.eth.accounts)
        d_addr, c_addr = accounts[1], accounts[2]
        games = (
            ("toy: lying defender vs honest challenger", toy_game, job, honest, liar, honest, c_addr),
            ("toy: honest defender vs lying challenger", toy_game, job, honest, honest, liar, d_addr),
            ("ScalarVM: lying defender vs honest challenger", vm_game, kjob, khonest, kliar, khonest, c_addr),
            ("ScalarVM: honest defender vs lying challenger", vm_game, kjob, khonest, khonest, kliar, d_addr),
        )
        for title, contract, jb, truth, dw, cw, honest_winner in games:
            client = DisputeGameClient(w3, contract, arts)
            p = GameParams(d_addr, c_addr, truth.step_commitment(0), dw.step_commitment(a.steps), a.steps,
                           jb.graph_root, jb.batch_root, a.arity, 7 * 24 * 3600, jb.num_nodes, a.interval)
            gid = client.create_game_via(resolver, p)
            t = time.time()
            out = runner.play(client, gid, pl.Defender(dw), pl.Challenger(cw), lambda s: increase_time(w3, s))
            print(f"\n== {title}: winner {'honest' if out.winner == honest_winner else 'DISHONEST'} "
                  f"by {out.resolution.name} in {time.time() - t:.1f}s")
            print(table(out))
            steps = [m.gas for m in client.moves if m.function == "step"]
            if steps:
                print(f"one-step proof (step tx): {steps[-1]:,} gas")
            good = (out.winner == honest_winner and out.total_moves("defender") <= MOVE_GOAL
                    and out.total_moves("challenger") <= MOVE_GOAL and out.total_gas() <= GAS_GOAL)
            print(f"goals (<= {MOVE_GOAL} moves per party, <= {GAS_GOAL:,} gas together, honest wins): "
                  f"{'met' if good else 'NOT met'}")
            ok &= good
            if honest_winner == d_addr:
                defence = max(defence, out.total_gas("defender"))
    print(f"\nhonest defender, whole game: {defence:,} gas at most (DEFENCE_GAS = {DEFENCE_GAS:,}: "
          f"{'covered' if defence <= DEFENCE_GAS else 'NOT covered'})")
    return 0 if ok and defence <= DEFENCE_GAS else 1


if __name__ == "__main__":
    sys.exit(main())

"""Gas of the one-step proof over a resnet18 job, by kind of disputed instruction.

Runs ``verde-chain demo --job resnet18 --json`` (the whole market: client, two trainers, a
challenger, real DisputeGame, ScalarVM and JobMarket on a fresh Anvil) once per kind of last
step. The cheating trainer corrupts one instruction of one element of the first forward
convolution (the ``micro`` strategy), so the dispute ends on exactly that instruction:

    LOAD, read     a tap inside the input: the step opens the element against the input's root
    LOAD, padded   a tap in the padding: the window reads the fill, no opening
    FMA            the chain's arithmetic

and one more run with the demo's default cheat (a flipped output bit at a drawn conv or batch
norm node: the element's last instruction). Prints the final move's gas and calldata, both
parties' gas, the wall time and whether the honest side won.

``--standalone`` instead measures ``ScalarVM.step`` alone (``eth_estimateGas`` on a fresh Anvil,
the 21,000 transaction cost included) on the vision descriptors of a batch-2, 64-channel, 8x8
layer, per kind of instruction, next to a plain matmul's.

Usage: .venv/bin/python scripts/bench_vision_dispute.py [--job resnet18] [--standalone]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from verde_chain.agents.catalog import build_job
from verde_chain.demo import DEFAULT_STEPS
from verde_chain.dispute.cheats import corrupted_trace
from verde_chain.graph.world import TrainingWorld
from verde_chain.repops import program
from verde_chain.repops.isa import Op
from verde_chain.vm import scalarvm as vm

BIT = 30


def sites(job_kind: str) -> dict[str, str]:
    """A ``micro`` strategy per kind of last step, at the first forward conv of the last step."""
    job = build_job(job_kind, DEFAULT_STEPS[job_kind])
    world = TrainingWorld.from_job(job)
    T = job.spec.steps
    d = next(n.index for n in job.program.graph.nodes if n.label == "conv")
    desc = job.program.graph.nodes[d].desc
    ins = world._inputs(T, d)
    out: dict[str, str] = {}
    for e in (0, desc.numel // 2 + 5):
        states = vm.run_states(desc, ins, e)
        for j in range(min(desc.num_steps, 64)):
            instr, k = program.instruction_at(desc, j)
            if instr.op == Op.LOAD:
                _, addr, _ = vm.memory_read(desc, states[j], instr, k)
                kind = "LOAD, read" if addr is not None else "LOAD, padded"
            elif instr.op == Op.FMA:
                kind = "FMA"
            else:
                continue
            # a flip the element's value keeps (a padded +0 times a weight can hide one)
            if kind not in out and corrupted_trace(desc, ins, e, j + 1, BIT)[-1] != states[-1]:
                out[kind] = f"micro:{T}:{d}:{e}:{j + 1}:{BIT}"
    return out


def demo(job_kind: str, cheat: str | None) -> dict:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "verde_chain.cli", "demo", "--job", job_kind, "--json", "--out", tmp]
        if cheat:
            cmd += ["--cheat", cheat]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"demo failed ({run.returncode}): {run.stderr[-2000:]}")
    return json.loads(lines[-1])


def standalone() -> int:
    """ScalarVM.step gas per descriptor and kind of instruction."""
    import numpy as np

    from verde_chain.chain.anvil import Anvil
    from verde_chain.chain.compile import compile_contracts
    from verde_chain.chain.deploy import deploy_contract
    from verde_chain.commit.tensor import tensor_root
    from verde_chain.repops import library

    r = np.random.default_rng(0)
    g = library.ConvGeometry.make((2, 64, 8, 8), (3, 3), pads=(1, 1, 1, 1))
    g4 = library.ConvGeometry.make((2, 512, 1, 1), (3, 3), pads=(1, 1, 1, 1))
    descs = [
        ("conv 64->64 3x3 + bias", library.convolution(g, (64, 64, 3, 3), 1, True), 2 * 64 * 64 // 2 + 9),
        ("conv 512->512 3x3 (2.4M weights)", library.convolution(g4, (512, 512, 3, 3)), 5),
        ("conv grad weight 512", library.conv_grad_weight(g4, (512, 512, 3, 3)), 5),
        ("batch norm dscale (channel_dot_xhat)", library.channel_dot_xhat((2, 64, 8, 8)), 3),
        ("max pool 3x3/2 pad 1", library.max_pool(library.ConvGeometry.make((2, 64, 8, 8), (3, 3), (2, 2),
                                                                            pads=(1, 1, 1, 1))), 0),
        ("matmul 64x576x64 (abi form)", library.matmul((64, 576), (576, 64)), 5),
    ]
    with Anvil() as anvil:
        w3 = anvil.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        svm = deploy_contract(w3, compile_contracts(), "ScalarVM")
        print(f"{'descriptor':<38}{'bytes':>6}  gas by instruction (LOAD read: with its Merkle opening; fill: none)")
        for label, d, e in descs:
            ins = [r.standard_normal(m.numel).astype(np.float32) for m in d.inputs]
            states = vm.run_states(d, ins, e)
            roots = [tensor_root(x) for x in ins]
            seen: dict[str, int] = {}
            for j in range(min(d.num_steps, 40)):
                instr, k = program.instruction_at(d, j)
                kind = instr.op.name
                if instr.op == Op.LOAD:
                    t, addr, _ = vm.memory_read(d, states[j], instr, k)
                    kind = f"LOAD in{t} {'read' if addr is not None else 'fill'}"
                if kind in seen:
                    continue
                sp = vm.prove_step(d, ins, states[j])
                ctx = (d.hash(), d.encode(), roots, e, j)
                seen[kind] = svm.functions.step(ctx, sp.pre.encode(), sp.proof).estimate_gas()
            print(f"{label:<38}{len(d.encode()):>6}  " + ", ".join(f"{k} {v:,}" for k, v in seen.items()))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--job", default="resnet18")
    ap.add_argument("--standalone", action="store_true", help="ScalarVM.step alone, per instruction kind")
    a = ap.parse_args()
    if a.standalone:
        return standalone()
    t0 = time.time()
    runs = {**sites(a.job), "output bit (demo default)": None}
    print(f"sites found in {time.time() - t0:.1f} s")
    # The final move also settles the job in the market (issue #13); the one-step proof is the
    # step transaction less that settlement, as the demo reports it.
    print(f"{'last instruction':<28}{'step gas':>10}{'settlement':>12}{'proof':>9}{'calldata':>10}{'cheater gas':>13}"
          f"{'challenger gas':>16}{'wall s':>8}  honest won")
    ok = True
    for kind, cheat in runs.items():
        r = demo(a.job, cheat)
        ref, gas = r["referee"], r["gas_by_party"]
        label = f"{kind} ({ref.get('node_label', '?')})" if cheat is None else kind
        settle = ref["settlement_gas"]
        print(f"{label:<28}{ref['step_gas']:>10,}{settle:>12,}{ref['step_gas'] - settle:>9,}"
              f"{ref['step_calldata_bytes']:>10,}{gas['trainer-cheat']:>13,}"
              f"{gas['challenger']:>16,}{r['wall_s']:>8}  {r['honest_won']}")
        ok &= bool(r["honest_won"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

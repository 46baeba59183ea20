"""Gas of the commitment layer and of complete one-step proofs, measured on a fresh Anvil.

Figures are `eth_estimateGas` of the call as a transaction (so they include the 21,000 base
cost and calldata), which is what a party pays to submit it. Usage:
    .venv/bin/python scripts/bench_gas.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random

import numpy as np

from verde_chain.chain.anvil import Anvil
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_contract
from verde_chain.commit import merkle
from verde_chain.commit.merkle import keccak256
from verde_chain.commit.tensor import LEAF_BYTES, LEAF_ELEMS, tensor_root
from verde_chain.repops import library, program
from verde_chain.vm import scalarvm as vm


def opening_at_depth(depth: int, rng: random.Random) -> tuple[bytes, int, int, bytes, list[bytes]]:
    """A valid element opening in a tree of 2^depth leaves, built from its proof alone."""
    chunk = bytes(rng.getrandbits(8) for _ in range(LEAF_BYTES))
    leaf_index = rng.randrange(1 << depth)
    siblings = [rng.getrandbits(256).to_bytes(32, "big") for _ in range(depth)]
    numel = (1 << depth) * LEAF_ELEMS
    root = merkle.root_from_proof(keccak256(chunk), leaf_index, 1 << depth, siblings)
    return root, numel, leaf_index * LEAF_ELEMS + 5, chunk, siblings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(1)
    arts = compile_contracts()
    out: dict[str, object] = {}
    with Anvil() as node:
        w3 = node.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        h = deploy_contract(w3, arts, "MerkleHarness")
        base = w3.eth.estimate_gas({"to": w3.eth.accounts[1], "value": 0})
        for depth in (10, 20):
            root, numel, e, chunk, sibs = opening_at_depth(depth, rng)
            out[f"open_element_depth{depth}"] = h.functions.openElement(root, numel, e, chunk, sibs).estimate_gas()
        # a batch of 16 openings at depth 20 in one call (all in one tree)
        root, numel, _, _, _ = opening_at_depth(20, rng)
        depth = 20
        chunks = [bytes(rng.getrandbits(8) for _ in range(LEAF_BYTES)) for _ in range(16)]
        # build a real tree of 16 distinct leaves padded into 2^20 positions: use a sparse proof set
        leaves_idx = list(range(16))
        level0 = [keccak256(c) for c in chunks]
        pad = [rng.getrandbits(256).to_bytes(32, "big") for _ in range(depth - 4)]
        sub_root = merkle.merkle_root(level0)
        big_root = merkle.root_from_proof(sub_root, 0, 1 << (depth - 4), pad)
        proofs = [merkle.merkle_proof(level0, i) + pad for i in leaves_idx]
        g = h.functions.openElements(big_root, (1 << depth) * LEAF_ELEMS, [i * LEAF_ELEMS for i in leaves_idx],
                                     chunks, proofs).estimate_gas()
        out["open_16_elements_depth20_total"] = g
        out["open_16_elements_depth20_per_element"] = round((g - base) / 16)

        # complete one-step proofs: a K=1024 dot product (LOAD with opening, and FMA)
        svm = deploy_contract(w3, arts, "ScalarVM")
        desc = library.matmul((4, 1024), (1024, 4))
        ins = [np.random.default_rng(0).standard_normal(4096).astype(np.float32) for _ in range(2)]
        e = 5
        states = vm.run_states(desc, ins, e)
        roots = [tensor_root(x) for x in ins]
        for name, op in (("load", "LOAD"), ("fma", "FMA")):
            j = next(j for j in range(500, desc.num_steps) if program.instruction_at(desc, j)[0].op.name == op)
            sp = vm.prove_step(desc, ins, states[j])
            ctx = (desc.hash(), desc.encode(), roots, e, j)
            out[f"one_step_matmul_k1024_{name}"] = svm.functions.step(ctx, sp.pre.encode(), sp.proof).estimate_gas()
        out["base_tx_gas"] = base
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:<40} {v:>10,}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()

"""`verde-chain demo`: the story on a real local chain.

For now (the foundation): start Anvil, deploy, commit a model-sized tensor with the native
tensor-root builder, open one element on-chain and check it. Later parts extend this into the
full job → training → dispute → one-step-proof scenario.
"""

from __future__ import annotations

import json
import time

import numpy as np

from verde_chain.chain.anvil import Anvil
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_system
from verde_chain.chain.tx import call
from verde_chain.commit import open_element, tensor_root, verify_element


def run_demo(json_out: bool = False) -> int:
    t0 = time.monotonic()
    artifacts = compile_contracts()
    with Anvil() as node:
        w3 = node.web3()
        record, contracts = deploy_system(w3, artifacts, node.rpc_url, ["MerkleHarness"])
        print(f"[chain] Anvil {node.rpc_url}, chain id {record.chain_id}; deployed {', '.join(record.contracts)}")
        weights = np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)
        th = time.monotonic()
        root = tensor_root(weights)
        hash_s = time.monotonic() - th
        print(f"[commit] 1,000,000-parameter tensor root 0x{root.hex()} in {hash_s:.3f}s")
        e = 123_457
        op = open_element(weights, e)
        assert verify_element(root, op) == int(weights.view(np.uint32)[e])
        harness = contracts["MerkleHarness"]
        fn = harness.functions.openElement(root, weights.size, e, op.chunk, list(op.proof))
        got = call(fn, artifacts)
        gas = fn.estimate_gas()
        ok = got == int(weights.view(np.uint32)[e])
        print(f"[verify] element {e} opened on-chain: {np.uint32(got).view(np.float32)!r} "
              f"(proof depth {len(op.proof)}, {gas} gas) -> {'OK' if ok else 'MISMATCH'}")
    report = {"honest_won": ok, "tensor_root": "0x" + root.hex(), "opening_gas": gas, "wall_s": time.monotonic() - t0}
    if json_out:
        print(json.dumps(report))
    return 0 if ok else 1

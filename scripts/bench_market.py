"""Gas of every JobMarket entry point, in ETH and in an ERC-20 (receipts on a fresh Anvil).

The market runs over the real DisputeGame with the toy stepper (the game's own gas is in
scripts/bench_dispute.py); the fast profile's parameters. Measured: postJob, join, commit,
reveal, openDispute (with createGame), disputeRival (with createGame), a resolution (claimTimeout
plus the market's callback, which assigns the beaten stake), finalize with 3 and with 32 slots,
withdraw.

Usage: .venv/bin/python scripts/bench_market.py [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from eth_utils import keccak

from verde_chain.chain.anvil import Anvil, increase_time
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.market_client import Market
from verde_chain.chain.tx import transact
from verde_chain.market.marketparams import FAST
from verde_chain.market.types import ETH, ZERO32, JobTerms


def measure(w3: Any, arts: Any, token: str, market: Market, game: Any) -> dict[str, int]:
    acc = w3.eth.accounts
    client, challenger = acc[1], acc[5]
    bond = FAST.floor(ETH)

    def terms(slots: int) -> JobTerms:
        now = int(w3.eth.get_block("latest")["timestamp"])
        return JobTerms(token, keccak(b"spec"), "https://bundles.example/spec", keccak(b"graph"), keccak(b"C_0"),
                       keccak(b"batches"), 1000, 100, 10**17 + 3, 3 * bond, bond, slots, now + 3600, 600, 3600, 16,
                       600, 64)

    def run(slots: int) -> tuple[int, dict[str, int]]:
        trainers = [acc[2 + i % 3] for i in range(slots)] if slots <= 3 else [
            _funded(w3, arts, token, i) for i in range(slots)]
        job_id, r = market.post_job(terms(slots), sender=client)
        gas = {"postJob": int(r["gasUsed"])}
        results = [keccak(b"C_T %d" % (i % 2)) for i in range(slots)]
        for i, t in enumerate(trainers):
            _, r = market.join(job_id, sender=t)
            gas["join"] = int(r["gasUsed"])
            r = market.commit_result(job_id, results[i], keccak(b"salt %d" % i), t)
            gas["commit"] = int(r["gasUsed"])
        increase_time(w3, market.job(job_id).terms.submission_deadline - int(w3.eth.get_block("latest")["timestamp"]) + 1)
        for i, t in enumerate(trainers):
            gas["reveal"] = int(market.reveal(job_id, results[i], ZERO32, keccak(b"salt %d" % i), sender=t)["gasUsed"])
        return job_id, gas

    job_id, gas = run(3)
    gid, r = market.open_dispute(job_id, 1, None, sender=challenger)
    gas["openDispute (with createGame)"] = int(r["gasUsed"])
    gid2, r = market.dispute_rival(job_id, 0, 1, sender=acc[3])
    gas["disputeRival (with createGame)"] = int(r["gasUsed"])
    increase_time(w3, 601)
    for g in (gid, gid2):  # the defenders never answer: each game ends on time for its challenger
        r = transact(w3, game.functions.claimTimeout(g), arts, sender=acc[6])
        gas["claimTimeout + settlement"] = max(gas.get("claimTimeout + settlement", 0), int(r["gasUsed"]))
    increase_time(w3, market.challenge_deadline(job_id) - int(w3.eth.get_block("latest")["timestamp"]) + 1)
    gas["finalize, 3 slots"] = int(market.finalize(job_id, sender=client)["gasUsed"])
    receipt = market.contract.functions.withdraw(token).transact({"from": challenger})
    gas["withdraw"] = int(w3.eth.wait_for_transaction_receipt(receipt)["gasUsed"])
    job32, _ = run(32)
    increase_time(w3, market.challenge_deadline(job32) - int(w3.eth.get_block("latest")["timestamp"]) + 1)
    gas["finalize, 32 slots"] = int(market.finalize(job32, sender=client)["gasUsed"])
    return gas


def _funded(w3: Any, arts: Any, token: str, i: int) -> str:
    """A fresh address the node signs for, with ETH (and the token) to stake."""
    from eth_utils import to_checksum_address

    addr = to_checksum_address(keccak(b"bench trainer %d" % i)[:20])
    w3.provider.make_request("anvil_setBalance", [addr, hex(10**21)])
    w3.provider.make_request("anvil_impersonateAccount", [addr])
    if token != ETH:
        tok = w3.eth.contract(address=token, abi=arts["TestToken"].abi)
        transact(w3, tok.functions.mint(addr, 10**24), arts)
    return addr


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    arts = compile_contracts()
    out: dict[str, dict[str, int]] = {}
    with Anvil() as node:
        w3 = node.web3()
        w3.eth.default_account = w3.eth.accounts[0]
        for kind in ("ETH", "ERC-20"):
            game = deploy_contract(w3, arts, "DisputeGame", deploy_contract(w3, arts, "ToyStepper").address)
            token = ETH
            params = FAST
            if kind == "ERC-20":
                tok = deploy_contract(w3, arts, "TestToken")
                token = tok.address
                params = FAST.with_token(token, FAST.floor(ETH))
                for acct in w3.eth.accounts:
                    transact(w3, tok.functions.mint(acct, 10**24), arts)
            market = Market.deploy(w3, arts, game.address, params)
            out[kind] = measure(w3, arts, token, market, game)
    if a.json:
        print(json.dumps(out))
        return
    names = list(out["ETH"])
    print(f"{'entry point':<34} {'ETH':>10} {'ERC-20':>10}")
    for n in names:
        print(f"{n:<34} {out['ETH'][n]:>10,} {out['ERC-20'][n]:>10,}")


if __name__ == "__main__":
    main()

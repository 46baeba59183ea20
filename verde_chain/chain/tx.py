"""Send transactions and calls; reverts come back as ``ContractRevert`` with the error's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from web3 import HTTPProvider, Web3
from web3.exceptions import ContractCustomError, ContractLogicError, ContractPanicError
from web3.types import RPCEndpoint, TxReceipt

from verde_chain.chain.compile import Artifact
from verde_chain.chain.revert import decode_revert

_REVERTS = (ContractCustomError, ContractLogicError, ContractPanicError, ValueError)


def http_provider(rpc_url: str, timeout: float = 120.0) -> HTTPProvider:
    """An HTTP provider that asks the node its chain id once (web3 checks it before every call
    and transaction, which would double a busy bot's requests)."""
    return HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}, cache_allowed_requests=True,
                        cacheable_requests={RPCEndpoint("eth_chainId")})


def transact_raw(
    w3: Web3, fn_call: Any, artifacts: Mapping[str, Artifact], sender: str | None = None, value: int = 0,
    gas: int | None = None,
) -> TxReceipt:
    params: dict[str, Any] = {"from": sender or w3.eth.accounts[0], "value": value}
    if gas is not None:
        params["gas"] = gas
    try:
        tx_hash = fn_call.transact(params)
    except _REVERTS as exc:  # web3 runs eth_estimateGas first, which surfaces the revert
        raise decode_revert(artifacts, exc) from exc
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=120)
    if receipt["status"] != 1:
        raise decode_revert(artifacts, mined_revert_data(w3, tx_hash) or b"")
    return receipt


def call_trace(w3: Web3, tx_hash: Any) -> dict[str, Any]:
    """The node's call tree of a mined transaction (``callTracer``: from, to, input, output,
    gasUsed and the nested ``calls``); empty if the node has no tracer."""
    h = tx_hash.hex() if isinstance(tx_hash, (bytes, bytearray)) else str(tx_hash)
    res = w3.provider.make_request(
        RPCEndpoint("debug_traceTransaction"), ["0x" + h.removeprefix("0x"), {"tracer": "callTracer"}])
    out = res.get("result") if isinstance(res, dict) else None
    return out if isinstance(out, dict) else {}


def mined_revert_data(w3: Web3, tx_hash: Any) -> bytes | None:
    """The revert data of a mined, failed transaction, as it failed in its own block.

    Replaying it as an ``eth_call`` at the block before would run it with that block's timestamp,
    so a time-dependent revert (a deadline passed, a clock ran out) would read as another error or
    as none; the node's call tracer gives the transaction's own output instead. None if the node
    has no tracer or the transaction ran out of gas (no output)."""
    out = call_trace(w3, tx_hash).get("output")
    return bytes.fromhex(out.removeprefix("0x")) if isinstance(out, str) and len(out) > 2 else None


def gas_in_calls_to(w3: Web3, tx_hash: Any, address: str) -> int:
    """Gas a mined transaction spent inside its calls to `address` (outermost ones, with whatever
    they call in turn), read from the node's call tracer."""
    def walk(node: dict[str, Any]) -> int:
        if int(node.get("to") or "0x0", 16) == int(address, 16):
            return int(node.get("gasUsed", "0x0"), 16)
        return sum(walk(c) for c in node.get("calls", ()))

    return sum(walk(c) for c in call_trace(w3, tx_hash).get("calls", ()))


def transact(
    w3: Web3, fn_call: Any, artifacts: Mapping[str, Artifact], sender: str | None = None, value: int = 0,
    gas: int | None = None,
) -> TxReceipt:
    return transact_raw(w3, fn_call, artifacts, sender=sender, value=value, gas=gas)


def call(fn_call: Any, artifacts: Mapping[str, Artifact], sender: str | None = None, gas: int | None = None) -> Any:
    params: dict[str, Any] = {}
    if sender:
        params["from"] = sender
    if gas is not None:
        params["gas"] = gas
    try:
        return fn_call.call(params)
    except _REVERTS as exc:
        raise decode_revert(artifacts, exc) from exc

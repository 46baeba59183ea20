"""Send transactions and calls; reverts come back as ``ContractRevert`` with the error's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from web3 import Web3
from web3.exceptions import ContractCustomError, ContractLogicError, ContractPanicError
from web3.types import TxReceipt

from verde_chain.chain.compile import Artifact
from verde_chain.chain.revert import decode_revert

_REVERTS = (ContractCustomError, ContractLogicError, ContractPanicError, ValueError)


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
        # Replay as a call at the same block to recover the revert data.
        try:
            fn_call.call(params, block_identifier=receipt["blockNumber"] - 1)
        except _REVERTS as exc:
            raise decode_revert(artifacts, exc) from exc
        raise decode_revert(artifacts, b"")
    return receipt


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

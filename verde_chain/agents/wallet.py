"""Accounts, JSON-RPC with retries, and a crash-safe transaction sender.

Accounts are Anvil's funded ones, by index: their keys derive from the standard test mnemonic
(BIP-44 path m/44'/60'/0'/0/i). Transactions are signed locally, so the hash is known before
broadcast and can be written to the bot's SQLite store first (see ``store.py``).

Nonces survive restarts because none is cached: every send first *recovers* the open rows of the
store (a mined receipt closes them; a transaction the node still holds is waited for; one the node
never saw is dropped and its action re-derived by the bot), then takes the node's pending nonce.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import HexStr
from web3 import HTTPProvider, Web3
from web3.exceptions import TransactionNotFound
from web3.types import TxReceipt

from verde_chain.agents.errors import AgentError, CrashInjected
from verde_chain.agents.store import OPEN_TX, Store
from verde_chain.chain.anvil import DEFAULT_MNEMONIC
from verde_chain.chain.compile import Artifact
from verde_chain.chain.revert import decode_revert
from verde_chain.chain.tx import _REVERTS
from verde_chain.errors import ChainError

T = TypeVar("T")
TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)


@functools.lru_cache(maxsize=64)
def account(index: int, mnemonic: str = DEFAULT_MNEMONIC) -> LocalAccount:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{index}")


def connect(rpc_url: str, timeout: float = 120.0) -> Web3:
    w3 = Web3(HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
    retry(lambda: w3.eth.chain_id, what=f"connect to {rpc_url}", attempts=5)
    return w3


def retry(fn: Callable[[], T], what: str = "rpc", attempts: int = 6, base: float = 0.2) -> T:
    """Run `fn`, retrying transient transport errors with exponential backoff (0.2 s, 0.4 s, ...)."""
    for i in range(attempts):
        try:
            return fn()
        except TRANSIENT as exc:
            if i == attempts - 1:
                raise ChainError(f"{what}: node unreachable after {attempts} attempts ({exc})") from exc
            time.sleep(base * 2**i)
    raise AssertionError("unreachable")


class Sender:
    """Sends one account's transactions, recording each in the store before it is broadcast.

    ``crash_before_broadcast`` is a test hook: the next send stores its signed transaction and
    then raises ``CrashInjected`` instead of broadcasting (a bot dying at the worst moment). Set to
    a kind (e.g. ``"join"``) it fires on the next send of that kind only, so a test can let an
    ``approve`` through and kill the bot just before the payment that needs it."""

    def __init__(self, w3: Web3, artifacts: Mapping[str, Artifact], acct: LocalAccount, store: Store) -> None:
        self.w3 = w3
        self.artifacts = artifacts
        self.acct = acct
        self.store = store
        self.address = acct.address
        self.chain_id = retry(lambda: w3.eth.chain_id)
        self.crash_before_broadcast: bool | str = False

    def recover(self) -> list[int]:
        """Settle every open row; returns the ids of rows dropped (never seen by the node)."""
        dropped = []
        for row in self.store.txs(OPEN_TX):
            if row.account != self.address:
                continue
            h = HexStr(row.hash)
            receipt = self._receipt(h)
            if receipt is None and self._known(h):
                receipt = retry(
                    lambda h=h: self.w3.eth.wait_for_transaction_receipt(h, timeout=120))  # type: ignore[misc]
            if receipt is None:
                self.store.set_tx(row.id, "dropped")
                dropped.append(row.id)
            else:
                self.store.set_tx(row.id, "mined" if receipt["status"] == 1 else "failed", int(receipt["gasUsed"]))
        return dropped

    def _receipt(self, tx_hash: str) -> TxReceipt | None:
        try:
            return retry(lambda: self.w3.eth.get_transaction_receipt(tx_hash))  # type: ignore[arg-type]
        except TransactionNotFound:
            return None

    def _known(self, tx_hash: str) -> bool:
        try:
            retry(lambda: self.w3.eth.get_transaction(tx_hash))  # type: ignore[arg-type]
            return True
        except TransactionNotFound:
            return False

    def send(self, fn_call: Any, kind: str, value: int = 0, game_id: int | None = None, level: int = 0,
             gas: int | None = None) -> TxReceipt:
        """Estimate (a revert surfaces here, decoded, and nothing is sent), sign, record, broadcast,
        wait. A transaction mined with status 0 raises the decoded revert too.

        A fixed `gas` skips the estimate: for calls whose validity depends on the time of the
        block that will include them (timeouts, deadlines), because a node estimates against its
        latest block, which on a quiet dev chain can be minutes old."""
        self.recover()
        params: dict[str, Any] = {"from": self.address, "value": value}
        if gas is None:
            try:
                gas = retry(lambda: fn_call.estimate_gas(params))
            except _REVERTS as exc:
                raise decode_revert(self.artifacts, exc) from exc
        nonce = retry(lambda: self.w3.eth.get_transaction_count(self.address, "pending"))
        tx = fn_call.build_transaction({
            **params, "nonce": nonce, "gas": min(int(gas * 1.25) + 20_000, 900_000_000),
            "gasPrice": retry(lambda: self.w3.eth.gas_price), "chainId": self.chain_id,
        })
        signed = self.acct.sign_transaction(tx)
        tx_hash = "0x" + bytes(signed.hash).hex()
        row = self.store.add_tx(self.address, nonce, kind, bytes(signed.raw_transaction), tx_hash, game_id, level)
        if self.crash_before_broadcast is True or self.crash_before_broadcast == kind:
            self.crash_before_broadcast = False
            raise CrashInjected("crash injected after signing, before broadcast", tx_hash=tx_hash)
        try:
            retry(lambda: self.w3.eth.send_raw_transaction(signed.raw_transaction))
        except ValueError as exc:  # the node refused it outright (nonce, funds): nothing was sent
            self.store.set_tx(row, "dropped", error=str(exc))
            raise AgentError(f"{kind}: node refused the transaction: {exc}") from exc
        self.store.set_tx(row, "sent")
        receipt = retry(lambda: self.w3.eth.wait_for_transaction_receipt(signed.hash, timeout=120))
        if receipt["status"] != 1:
            self.store.set_tx(row, "failed", int(receipt["gasUsed"]))
            try:
                fn_call.call(params, block_identifier=receipt["blockNumber"] - 1)
            except _REVERTS as exc:
                raise decode_revert(self.artifacts, exc) from exc
            raise decode_revert(self.artifacts, b"")
        self.store.set_tx(row, "mined", int(receipt["gasUsed"]))
        return receipt

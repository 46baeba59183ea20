"""Accounts, JSON-RPC with retries, and a crash-safe transaction sender.

Accounts are Anvil's funded ones, by index: their keys derive from the standard test mnemonic
(BIP-44 path m/44'/60'/0'/0/i). Transactions are signed locally, so the hash is known before
broadcast and can be written to the bot's SQLite store first (see ``store.py``).

Nonces survive restarts because none is cached: the next nonce is derived from the node's pending
count and the store's open rows. Several transactions may be in flight at once (``Sender.submit``,
pipelined); on restart ``recover`` closes what was mined, waits for what the node still holds, and
drops the one row that may have been signed but never broadcast (its action re-derived by the bot).
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
from web3 import Web3
from web3.exceptions import TransactionNotFound
from web3.types import RPCEndpoint, TxReceipt

from verde_chain.agents.errors import AgentError, CrashInjected
from verde_chain.agents.store import OPEN_TX, Store, TxRow
from verde_chain.chain.anvil import DEFAULT_MNEMONIC
from verde_chain.chain.compile import Artifact
from verde_chain.chain.revert import decode_revert
from verde_chain.chain.tx import _REVERTS, http_provider, mined_revert_data
from verde_chain.errors import ChainError, ContractRevert

T = TypeVar("T")
TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)


@functools.lru_cache(maxsize=64)
def account(index: int, mnemonic: str = DEFAULT_MNEMONIC) -> LocalAccount:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{index}")


def connect(rpc_url: str, timeout: float = 120.0) -> Web3:
    w3 = Web3(http_provider(rpc_url, timeout))
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

    Transactions are *pipelined*: ``submit`` signs with the next free nonce, records and broadcasts
    and returns at once, so several can be in flight (one per open game, all in the next block);
    ``poll`` settles whatever was mined since, without waiting. ``send`` is ``submit`` plus the
    wait, for the calls whose receipt the caller needs before going on.

    The next nonce is one past the highest nonce of this account's open rows, or, with none open,
    the node's pending count: both survive a restart (the store, the node's pool), so nothing about
    nonces lives only in memory. Rows are broadcast in the order they are signed, so a crash can
    leave only the last signed row unsent; on restart ``recover`` drops it (no gap behind it) and
    the bot re-derives its action from the chain.

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

    def in_flight(self) -> list[TxRow]:
        """This account's transactions without a receipt yet (as last polled)."""
        return [r for r in self.store.txs(OPEN_TX) if r.account == self.address]

    def recover(self, wait: bool = True) -> list[int]:
        """Settle every open row; returns the ids of rows dropped (never seen by the node). With
        `wait`, a transaction the node still holds is waited for; without, it stays open."""
        dropped = []
        for row in self.in_flight():
            h = HexStr(row.hash)
            receipt = self._receipt(h)
            if receipt is None and self._known(h):
                if not wait:
                    continue
                receipt = retry(
                    lambda h=h: self.w3.eth.wait_for_transaction_receipt(h, timeout=120))  # type: ignore[misc]
            if receipt is None:
                self.store.set_tx(row.id, "dropped")
                dropped.append(row.id)
            else:
                self._close(row.id, receipt)
        return dropped

    def poll(self) -> list[TxRow]:
        """Settle the open rows that were mined since (no waiting); returns them as now stored. A
        row the node no longer holds and that nothing mined in its place is broadcast again."""
        closed = []
        for row in self.in_flight():
            receipt = self._receipt(row.hash)
            if receipt is None:
                if row.status == "sent" and not self._known(row.hash):
                    self._rebroadcast(row)
                continue
            self._close(row.id, receipt)
            closed.append(row.id)
        return [r for r in self.store.txs() if r.id in closed]

    def _rebroadcast(self, row: TxRow) -> None:
        mined_nonce = int(retry(lambda: self.w3.eth.get_transaction_count(self.address, "latest")))
        if row.nonce < mined_nonce:  # another transaction took its nonce: it can never be mined
            self.store.set_tx(row.id, "dropped", error="replaced")
            return
        try:
            retry(lambda: self.w3.eth.send_raw_transaction(row.raw))
        except ValueError as exc:
            self.store.set_tx(row.id, "dropped", error=str(exc))

    def _close(self, row_id: int, receipt: TxReceipt) -> None:
        if receipt["status"] == 1:
            self.store.set_tx(row_id, "mined", int(receipt["gasUsed"]))
            return
        err = self.mined_revert(receipt)
        self.store.set_tx(row_id, "failed", int(receipt["gasUsed"]), error=err.name)

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

    def next_nonce(self) -> int:
        """One past this account's open rows; with none open, the node's pending count."""
        in_flight = [r.nonce + 1 for r in self.in_flight()]
        if in_flight:
            return max(in_flight)
        return int(retry(lambda: self.w3.eth.get_transaction_count(self.address, "pending")))

    def estimate(self, fn_call: Any, value: int = 0) -> int:
        """Gas of `fn_call` from this account on the latest block; a revert raises its decoded
        ``ContractRevert`` (reads the node only: safe on any thread)."""
        try:
            return int(retry(lambda: fn_call.estimate_gas({"from": self.address, "value": value})))
        except _REVERTS as exc:
            raise decode_revert(self.artifacts, exc) from exc

    def submit(self, fn_call: Any, kind: str, value: int = 0, game_id: int | None = None, level: int = 0,
               gas: int | None = None) -> TxRow:
        """Estimate (a revert surfaces here, decoded, and nothing is sent), sign with the next
        nonce, record, broadcast; do not wait. Returns the stored row (status ``sent``).

        A fixed `gas` skips the estimate: for calls whose validity depends on the time of the
        block that will include them (timeouts, deadlines), because a node estimates against its
        latest block, which on a quiet dev chain can be minutes old.

        Open rows are not polled here (the caller polls once per pass): with n transactions in
        flight that would cost n receipt lookups per submission. The nonce needs none of them."""
        params: dict[str, Any] = {"from": self.address, "value": value}
        if gas is None:
            gas = self.estimate(fn_call, value)
        nonce = self.next_nonce()
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
        return self.store.tx(row)

    def send(self, fn_call: Any, kind: str, value: int = 0, game_id: int | None = None, level: int = 0,
             gas: int | None = None) -> TxReceipt:
        """``submit`` and wait for the receipt. A transaction mined with status 0 raises its
        decoded revert (``mined_revert``)."""
        row = self.submit(fn_call, kind, value, game_id, level, gas)
        receipt = retry(lambda: self.w3.eth.wait_for_transaction_receipt(HexStr(row.hash), timeout=120))
        self._close(row.id, receipt)
        if receipt["status"] != 1:
            raise self.mined_revert(receipt)
        return receipt

    def mined_revert(self, receipt: TxReceipt) -> ContractRevert:
        """The custom error a mined transaction failed with, as it failed in its own block (the
        node's call tracer: a time-dependent revert, a deadline or a clock, reads as itself). A
        node without the tracer: replayed on the state before its block with that block's number
        and timestamp (block overrides); failing that, ``UnknownRevert``."""
        traced = mined_revert_data(self.w3, receipt["transactionHash"])
        if traced is not None:
            return decode_revert(self.artifacts, traced)
        tx = retry(lambda: self.w3.eth.get_transaction(receipt["transactionHash"]))
        block = retry(lambda: self.w3.eth.get_block(receipt["blockNumber"]))
        call = {"from": tx["from"], "to": tx["to"], "data": Web3.to_hex(tx["input"]), "value": hex(tx["value"]),
                "gas": hex(tx["gas"])}
        over = {"number": hex(block["number"]), "time": hex(block["timestamp"])}
        res = self.w3.provider.make_request(
            RPCEndpoint("eth_call"), [call, hex(block["number"] - 1), {}, over])
        err = res.get("error") if isinstance(res, dict) else None
        data = err.get("data") if isinstance(err, dict) else None
        return decode_revert(self.artifacts, data if isinstance(data, str) else b"")

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import HexStr
from web3 import Web3
from web3.exceptions import TransactionNotFound, Web3RPCError
from web3.types import RPCEndpoint, TxReceipt

from verde_chain.agents.errors import AgentError, CrashInjected
from verde_chain.agents.store import OPEN_TX, Store, TxRow
from verde_chain.chain.anvil import DEFAULT_MNEMONIC
from verde_chain.chain.compile import Artifact
from verde_chain.chain.revert import decode_revert
from verde_chain.chain.tx import _REVERTS, http_provider, mined_revert_data
from verde_chain.errors import ChainError, ContractRevert, VerdeError

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


@dataclass(frozen=True)
class Call:
    """One transaction to submit: the contract call, its kind (for the store) and how to send it."""

    fn_call: Any
    kind: str
    value: int = 0
    game_id: int | None = None
    level: int = 0
    gas: int | None = None  # None: estimated just before signing


class Sender:
    """Sends one account's transactions, recording each in the store before it is broadcast.

    Transactions are *pipelined*: ``submit`` signs with the next free nonce, records and broadcasts
    and returns at once, so several can be in flight (one per open game, all in the next block);
    ``poll`` settles whatever was mined since, without waiting. ``send`` is ``submit`` plus the
    wait, for the calls whose receipt the caller needs before going on.

    The next nonce is one past the highest nonce of this account's rows in flight, or with none
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
        self.mined_at: dict[int, int] = {}  # row id -> block number, for the rows this object closed

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
        """Settle the open rows that were mined since (no waiting); returns them as now stored.

        One account's transactions are mined in nonce order, so the rows are looked at in that
        order and the first without a receipt ends the look: a poll costs one lookup per row mined
        since, plus one. If the node no longer holds that first row (and nothing took its nonce),
        it is broadcast again, so a lost transaction never stalls the ones behind it."""
        closed = []
        for row in sorted(self.in_flight(), key=lambda r: r.nonce):
            receipt = self._receipt(row.hash)
            if receipt is None:
                if row.status == "sent" and not self._known(row.hash):
                    self._rebroadcast(row)
                break
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
        except (ValueError, Web3RPCError) as exc:
            self.store.set_tx(row.id, "dropped", error=str(exc))

    def _close(self, row_id: int, receipt: TxReceipt) -> None:
        self.mined_at[row_id] = int(receipt["blockNumber"])
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
        """One past this account's transactions in flight; with none, the node's pending count
        (which also follows a node that went back to an older state). The rows in flight are
        consecutive: ``poll`` closes them in nonce order and stops at the first still pending."""
        in_flight = [r.nonce for r in self.in_flight()]
        if in_flight:
            return max(in_flight) + 1
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
        latest block, which on a quiet dev chain can be minutes old."""
        (out,) = self.submit_many([Call(fn_call, kind, value, game_id, level, gas)])
        if isinstance(out, VerdeError):
            raise out
        return out

    def submit_many(self, calls: Sequence[Call]) -> list[TxRow | VerdeError]:
        """Submit several transactions at once, one result per call in order: the stored row, or
        the call's decoded ``ContractRevert`` (its estimate reverted; nothing signed), or an
        ``AgentError`` (the node refused it, or refused one before it).

        They are signed with consecutive nonces, recorded in one store transaction (one disk
        sync however many: a bot answering 20 games at once does not wait on 20 syncs), then
        broadcast in order. A broadcast the node refuses ends the batch: that row and the ones
        after it are dropped unsent, so no nonce gap is left. Rows are never broadcast before they
        are stored, and always in nonce order, so after a crash the unsent ones are a suffix.

        Open rows are not polled here (the caller polls once per pass): with n transactions in
        flight that would cost n receipt lookups per submission. The nonce needs none of them."""
        # the rows must be on disk before anything is broadcast: not inside a caller's batch
        assert not self.store.db.in_transaction, "submit_many inside a store batch"
        out: dict[int, TxRow | VerdeError] = {}
        priced: list[tuple[int, Call, int]] = []
        for i, c in enumerate(calls):
            try:
                priced.append((i, c, c.gas if c.gas is not None else self.estimate(c.fn_call, c.value)))
            except ContractRevert as exc:
                out[i] = exc
        if priced:
            nonce = self.next_nonce()
            price = retry(lambda: self.w3.eth.gas_price)
            signed = []
            for k, (i, c, gas) in enumerate(priced):
                tx = c.fn_call.build_transaction({
                    "from": self.address, "value": c.value, "nonce": nonce + k,
                    "gas": min(int(gas * 1.25) + 20_000, 900_000_000), "gasPrice": price, "chainId": self.chain_id,
                })
                signed.append((i, c, nonce + k, self.acct.sign_transaction(tx)))
            with self.store.batch():
                rows = [self.store.add_tx(self.address, n, c.kind, bytes(st.raw_transaction),
                                          "0x" + bytes(st.hash).hex(), c.game_id, c.level) for _, c, n, st in signed]
            crash = self.crash_before_broadcast
            if crash is True or crash in {c.kind for _, c, _, _ in signed}:
                self.crash_before_broadcast = False
                raise CrashInjected("crash injected after signing, before broadcast",
                                    tx_hash="0x" + bytes(signed[0][3].hash).hex())
            sent = 0
            refused: Exception | None = None
            for _, c, _, st in signed:
                try:
                    retry(lambda st=st: self.w3.eth.send_raw_transaction(st.raw_transaction))  # type: ignore[misc]
                except (ValueError, Web3RPCError) as exc:  # refused outright (nonce, funds): nothing was sent
                    refused = exc
                    break
                sent += 1
            with self.store.batch():
                for row in rows[:sent]:
                    self.store.set_tx(row, "sent")
                for row in rows[sent:]:
                    self.store.set_tx(row, "dropped", error=str(refused))
            for k, (i, c, _, _) in enumerate(signed):
                out[i] = self.store.tx(rows[k]) if k < sent else AgentError(
                    f"{c.kind}: node refused the transaction: {refused}" if k == sent
                    else f"{c.kind}: not sent (the node refused an earlier transaction of the batch)")
        return [out[i] for i in range(len(calls))]

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

"""The bots' Sender on Anvil: pipelined nonces, and reverts of mined transactions named by their
real custom error even when the revert depends on the block's time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from tests.support.market import STAKE, make_env
from verde_chain.agents.store import Store
from verde_chain.agents.wallet import Sender, account
from verde_chain.chain import tx as chain_tx
from verde_chain.chain.anvil import set_next_block_timestamp
from verde_chain.errors import ContractRevert
from verde_chain.market.types import ETH

pytestmark = pytest.mark.chain


@pytest.fixture
def late_join(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any, tmp_path: Path) -> tuple[Any, Sender, int]:
    """A job whose submission deadline falls between the latest block and the next one, and a
    Sender about to join it with a fixed gas limit (as the bots send time-dependent calls)."""
    env = make_env(w3, artifacts, deploy, chain, "eth", mock=True)
    job_id = env.post()
    deadline = env.market.job(job_id).terms.submission_deadline
    sender = Sender(w3, artifacts, account(7), Store(tmp_path / "s.sqlite"))
    fn = env.market.contract.functions.join(job_id)
    fn.call({"from": sender.address, "value": STAKE})  # on the latest block it would be on time ...
    set_next_block_timestamp(w3, deadline + 1)  # ... but the block that includes it is past the deadline
    return fn, sender, deadline


def test_deadline_revert_of_a_mined_transaction_is_named(late_join: tuple[Any, Sender, int], w3: Web3) -> None:
    fn, sender, deadline = late_join
    with pytest.raises(ContractRevert) as err:
        sender.send(fn, "join", value=STAKE, gas=300_000)
    assert err.value.name == "SubmissionClosed" and err.value.fields["deadline"] == deadline
    assert err.value.fields["nowTs"] == deadline + 1
    (row,) = sender.store.txs()
    assert (row.status, row.error) == ("failed", "SubmissionClosed")
    # what it used to do, replaying at the block before, finds no revert at all: the time mattered
    block = w3.eth.get_transaction_receipt(row.hash)["blockNumber"]
    fn.call({"from": sender.address, "value": STAKE}, block_identifier=block - 1)


def test_deadline_revert_without_a_call_tracer(late_join: tuple[Any, Sender, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A node without debug_traceTransaction: the transaction is replayed on the state before its
    block with that block's number and timestamp (eth_call block overrides)."""
    fn, sender, deadline = late_join
    monkeypatch.setattr("verde_chain.agents.wallet.mined_revert_data", lambda w3, h: None)
    with pytest.raises(ContractRevert) as err:
        sender.send(fn, "join", value=STAKE, gas=300_000)
    assert err.value.name == "SubmissionClosed" and err.value.fields["nowTs"] == deadline + 1
    assert chain_tx.mined_revert_data is not None  # only the wallet's view was patched


def test_pipelined_transactions_share_a_block_and_survive_a_restart(w3: Web3, artifacts: Any,
                                                                     deploy: Callable[..., Any], chain: Any,
                                                                     tmp_path: Path) -> None:
    """Five transactions submitted without waiting take consecutive nonces and are mined in one
    block; a Sender rebuilt on the same file while they are still pending takes the next nonce
    after them (the node's pool and the store both know them), never one of theirs."""
    env = make_env(w3, artifacts, deploy, chain, "eth", mock=True)
    acct = account(8)
    store = Store(tmp_path / "p.sqlite")
    sender = Sender(w3, artifacts, acct, store)
    w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    try:
        base = w3.eth.get_transaction_count(acct.address)
        rows = [sender.submit(env.market.contract.functions.withdraw(ETH), "withdraw", gas=100_000) for _ in range(5)]
        assert [r.nonce for r in rows] == list(range(base, base + 5)) and {r.status for r in rows} == {"sent"}
        reborn = Sender(w3, artifacts, acct, Store(tmp_path / "p.sqlite"))
        assert reborn.recover(wait=False) == [] and reborn.next_nonce() == base + 5
    finally:
        w3.provider.make_request("evm_setAutomine", [True])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    assert {r.status for r in sender.poll()} == {"failed"}  # withdraw with nothing owed: NothingToWithdraw
    assert {r.error for r in store.txs()} == {"NothingToWithdraw"}
    assert len({w3.eth.get_transaction_receipt(r.hash)["blockNumber"] for r in rows}) == 1

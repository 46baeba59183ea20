"""Pointing a command at the wrong place: each mistake a user made is one line on stderr that
names the problem and the fix, never a traceback (a subprocess each, as a user runs it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_refused, run_cli

pytestmark = pytest.mark.chain
NOWHERE = "0x" + "12" * 20  # no code there on the session chain


def _stale_record(cwd: Path) -> None:
    """A deployment record from before the node was restarted: its JobMarket holds no code now."""
    rec = cwd / "build" / "deployments" / "31337.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"chain_id": 31337, "rpc_url": "http://127.0.0.1:8545", "block": 3, "deployer": NOWHERE,
                               "contracts": {"JobMarket": NOWHERE}}))


def test_rpc_url_without_scheme(tmp_path: Path) -> None:
    assert_refused(run_cli("job", "status", "1", "--rpc-url", "127.0.0.1:8545", cwd=tmp_path),
                   "--rpc-url '127.0.0.1:8545' is not an http(s) URL", "http://127.0.0.1:8545")


@pytest.mark.parametrize("command", [["job", "status", "1"], ["client", "--steps", "2"],
                                     ["trainer", "run", "--max-ticks", "1"]])
def test_stale_deployment_record_after_a_node_restart(anvil: Any, tmp_path: Path, command: list[str]) -> None:
    _stale_record(tmp_path)
    assert_refused(run_cli(*command, "--rpc-url", anvil.rpc_url, cwd=tmp_path),
                   f"no contracts deployed at {NOWHERE}", "stale", "verde-chain deploy")


def test_market_pointing_at_an_account_or_malformed(anvil: Any, w3: Any, tmp_path: Path) -> None:
    account = w3.eth.accounts[3]
    assert_refused(run_cli("job", "status", "1", "--rpc-url", anvil.rpc_url, "--market", account, cwd=tmp_path),
                   f"no contracts deployed at {account}", "--market must be the JobMarket's address")
    assert_refused(run_cli("dispute", "status", "1", "--rpc-url", anvil.rpc_url, "--market", "0x1234", cwd=tmp_path),
                   "--market '0x1234' is not an address")


def test_unreachable_node_and_broken_record(anvil: Any, tmp_path: Path) -> None:
    assert_refused(run_cli("job", "status", "1", "--rpc-url", "http://127.0.0.1:9", cwd=tmp_path),
                   "no JSON-RPC node answers at http://127.0.0.1:9")
    rec = tmp_path / "build" / "deployments" / "31337.json"
    rec.parent.mkdir(parents=True)
    rec.write_text("{")
    assert_refused(run_cli("job", "status", "1", "--rpc-url", anvil.rpc_url, cwd=tmp_path),
                   "is not a deployment record", "verde-chain deploy")

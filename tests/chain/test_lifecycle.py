"""Anvil lifecycle, compilation cache, deployment records, snapshot isolation, time travel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verde_chain import ports
from verde_chain.chain import anvil as anvil_mod
from verde_chain.chain.compile import compile_contracts, source_hash
from verde_chain.chain.deploy import DeploymentRecord, deploy_system
from verde_chain.chain.paths import BUILD, REPO
from verde_chain.errors import ChainError

pytestmark = pytest.mark.chain


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_start_stop_no_orphan(tmp_path: Path) -> None:
    node = anvil_mod.Anvil(log_dir=tmp_path)
    pid = node.proc.pid
    w3 = node.web3()
    assert w3.eth.chain_id == 31337 and len(w3.eth.accounts) == 10
    node.stop()
    assert not _alive(pid)
    assert node.log_path.exists()


def test_a_taken_port_is_never_mistaken_for_our_node(tmp_path: Path) -> None:
    """Another process's node answering on the port is not ours: a chosen port that is taken
    fails with PortTaken (not a handle on the other chain), and a drawn one is drawn again."""
    other = anvil_mod.Anvil(log_dir=tmp_path, chain_id=4242)
    try:
        with pytest.raises(anvil_mod.PortTaken, match=f"port {other.port} is taken"):
            anvil_mod.Anvil(port=other.port, log_dir=tmp_path)
        draws = iter([other.port, ports.free_port()])
        drawn: list[int] = []

        def draw() -> int:
            drawn.append(next(draws))
            return drawn[-1]

        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(anvil_mod, "free_port", draw)
        try:
            node = anvil_mod.Anvil(log_dir=tmp_path)
        finally:
            monkeypatch.undo()
        try:
            assert drawn == [other.port, node.port] and node.port != other.port  # it really was drawn twice
            assert node.web3().eth.chain_id == 31337 and other.web3().eth.chain_id == 4242
        finally:
            node.stop()
    finally:
        other.stop()


def test_anvil_dies_with_parent_sigkill(tmp_path: Path) -> None:
    """Even a SIGKILLed parent leaves no Anvil behind (PR_SET_PDEATHSIG)."""
    code = (
        "import sys,time; from verde_chain.chain.anvil import Anvil; a=Anvil(); "
        "print(a.proc.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_cli_node_ctrl_c_leaves_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "verde_chain.cli", "node", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl-C" in line:
            break
    text = "".join(lines)
    assert "RPC URL: http://127.0.0.1:" in text and "(9) 0x" in text
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False).stdout.split()]
    assert children, "node command should have started anvil"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    time.sleep(0.2)
    assert not any(_alive(c) for c in children)


def test_compile_cache_is_keyed_by_source() -> None:
    arts = compile_contracts()
    assert "MerkleHarness" in arts and arts["MerkleHarness"].bytecode.startswith("0x60")
    srcs = {"a.sol": "contract A {}"}
    assert source_hash(srcs) != source_hash({"a.sol": "contract A { }"})
    cached = list((BUILD / "artifacts").glob("*.json"))
    assert cached


def test_compile_reports_solc_errors(tmp_path: Path) -> None:
    (tmp_path / "Bad.sol").write_text("pragma solidity 0.8.28; contract Bad { function f() { } }")
    with pytest.raises(ChainError, match="solc errors"):
        compile_contracts(tmp_path)


def test_snapshot_isolation_part1(w3) -> None:  # type: ignore[no-untyped-def]
    a, b = w3.eth.accounts[:2]
    # Anvil's automine mines just after eth_sendTransaction returns, not before: wait for it
    # (under load the balance read can otherwise come first; this failed CI twice).
    w3.eth.wait_for_transaction_receipt(w3.eth.send_transaction({"from": a, "to": b, "value": 10**18}))
    assert w3.eth.get_balance(b) == 10_001 * 10**18


def test_snapshot_isolation_part2(w3) -> None:  # type: ignore[no-untyped-def]
    # the transfer of part 1 was reverted
    assert w3.eth.get_balance(w3.eth.accounts[1]) == 10_000 * 10**18


def test_time_travel(chain) -> None:  # type: ignore[no-untyped-def]
    t0 = chain.timestamp()
    chain.increase_time(3600)
    assert chain.timestamp() >= t0 + 3600
    n = chain.w3.eth.block_number
    chain.mine(5)
    assert chain.w3.eth.block_number == n + 5


def test_deployment_record(w3, artifacts, anvil, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    record, _ = deploy_system(w3, artifacts, anvil.rpc_url, ["MerkleHarness"])
    assert w3.eth.get_code(record.contracts["MerkleHarness"]) not in (b"", None)
    path = tmp_path / "d.json"
    record.write(path)
    back = DeploymentRecord.read(path)
    assert back.chain_id == 31337 and back.contracts == record.contracts
    assert back.abi_hashes["MerkleHarness"] == artifacts["MerkleHarness"].abi_hash
    assert json.loads(path.read_text())["block"] == record.block


def test_cli_deploy_embedded_and_rpc(anvil, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "rec.json"
    r = subprocess.run(
        [sys.executable, "-m", "verde_chain.cli", "deploy", "--rpc-url", anvil.rpc_url, "--out", str(out), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    assert rec["rpc_url"] == anvil.rpc_url and "MerkleHarness" in rec["contracts"]
    r2 = subprocess.run([sys.executable, "-m", "verde_chain.cli", "deploy", "--json", "--out", str(out)],
                        check=False, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout.strip().splitlines()[-1])["chain_id"] == 31337


def test_cli_bad_rpc_is_a_clear_error() -> None:
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", "deploy", "--rpc-url", "http://127.0.0.1:1"],
                       check=False, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "cannot reach" in r.stderr


@pytest.mark.parametrize("sub", ["node", "deploy", "demo"])
def test_every_command_has_help(sub: str) -> None:
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", sub, "--help"], check=False, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "usage: verde-chain " + sub in r.stdout

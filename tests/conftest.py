"""Shared fixtures: one Anvil per test session, snapshot/revert isolation per test."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from web3 import Web3

from verde_chain.chain import anvil as anvil_mod
from verde_chain.chain.compile import Artifact, compile_contracts
from verde_chain.chain.deploy import deploy_contract

# CI replays a fixed Hypothesis seed so a landing never depends on luck; local runs explore
# fresh examples every time (and print the seed of any failure to replay it).
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chain: needs the session Anvil (integration test)")
    config.addinivalue_line("markers", "slow: long-running test")


@pytest.fixture(scope="session")
def anvil() -> Iterator[anvil_mod.Anvil]:
    node = anvil_mod.Anvil()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def _session_w3(anvil: anvil_mod.Anvil) -> Web3:
    w3 = anvil.web3()
    w3.eth.default_account = w3.eth.accounts[0]
    return w3


@pytest.fixture(scope="session")
def artifacts() -> dict[str, Artifact]:
    return compile_contracts()


@pytest.fixture
def w3(_session_w3: Web3) -> Iterator[Web3]:
    """Web3 on the session Anvil; every chain change a test makes is reverted afterwards."""
    snap = anvil_mod.snapshot(_session_w3)
    try:
        yield _session_w3
    finally:
        anvil_mod.revert(_session_w3, snap)


class ChainControl:
    def __init__(self, w3: Web3) -> None:
        self.w3 = w3

    def increase_time(self, seconds: int) -> None:
        anvil_mod.increase_time(self.w3, seconds)

    def mine(self, n: int = 1) -> None:
        anvil_mod.mine(self.w3, n)

    def set_next_timestamp(self, timestamp: int) -> None:
        anvil_mod.set_next_block_timestamp(self.w3, timestamp)

    def snapshot(self) -> str:
        return anvil_mod.snapshot(self.w3)

    def revert(self, snap_id: str) -> None:
        anvil_mod.revert(self.w3, snap_id)

    def timestamp(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


@pytest.fixture
def chain(w3: Web3) -> ChainControl:
    return ChainControl(w3)


@pytest.fixture
def deploy(w3: Web3, artifacts: dict[str, Artifact]) -> Callable[..., Any]:
    def _deploy(name: str, *args: Any, sender: str | None = None, value: int = 0) -> Any:
        return deploy_contract(w3, artifacts, name, *args, sender=sender, value=value)

    return _deploy

# tests/ape runs under `ape test` (its plugin supplies `project`/`accounts`); see test_ape_toolchain.
collect_ignore = ["ape"]


@pytest.fixture(scope="session")
def script() -> Callable[[str], ModuleType]:
    """``script("gpu_check")``: scripts/gpu_check.py imported as a module (scripts are no package)."""
    loaded: dict[str, ModuleType] = {}

    def load(name: str) -> ModuleType:
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[name] = mod
        return loaded[name]

    return load

"""Fixtures of the commitment tests."""

from __future__ import annotations

from typing import Any

import pytest

from verde_chain.chain.deploy import deploy_contract


@pytest.fixture(scope="module")
def harness(_session_w3: Any, artifacts: Any) -> Any:
    """MerkleHarness: Merkle.sol and TensorCommit.sol behind external functions."""
    return deploy_contract(_session_w3, artifacts, "MerkleHarness")

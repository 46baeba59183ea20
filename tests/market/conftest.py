"""Fixtures of the job-market tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from web3 import Web3

from tests.support.market import Env, make_env


@pytest.fixture(params=["eth", "token"])
def env(request: pytest.FixtureRequest, w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> Env:
    """Market wired to the real DisputeGame (toy stepper), paying in ETH or in the TestToken."""
    return make_env(w3, artifacts, deploy, chain, request.param, mock=False)


@pytest.fixture
def mock_env(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> Env:
    """Market wired to GameMock, which can report outcomes the real game never would."""
    return make_env(w3, artifacts, deploy, chain, "eth", mock=True)

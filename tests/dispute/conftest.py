"""Fixtures of the dispute tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dispute import Env


@pytest.fixture
def env(w3: Any, deploy: Any, artifacts: Any) -> Env:
    """A DisputeGame on the toy stepper (ToyStepper.sol), through a ResolverMock."""
    return Env.deploy(w3, deploy, artifacts)

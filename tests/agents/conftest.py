"""Fixtures of the bot tests: one tiny digits job per module, its published bundle, a fresh market."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from tests.support.bots import STEPS, World
from verde_chain.agents.catalog import Bundles, build_job
from verde_chain.chain.market_client import Market
from verde_chain.job import Job


@pytest.fixture(scope="module")
def job() -> Job:
    return build_job("digits", STEPS)


@pytest.fixture(scope="module")
def bundles(job: Job, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundles")
    Bundles(root).publish(job)
    return root


@pytest.fixture
def world(w3: Web3, artifacts: Any, deploy: Callable[..., Any], bundles: Path, tmp_path: Path, job: Job) -> World:
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    market = Market.at(w3, artifacts, deploy("JobMarket", game.address).address)
    return World(w3, artifacts, market, bundles, tmp_path, job)

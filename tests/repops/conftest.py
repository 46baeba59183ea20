"""Fixtures of the RepOps tests."""

from __future__ import annotations

import pytest

from tests.support.cuda_host import HostInterpreter, build_host


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> HostInterpreter:
    """The CUDA program interpreter compiled for the host (g++)."""
    return build_host(tmp_path_factory.mktemp("rp_host"))

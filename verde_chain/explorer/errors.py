"""Errors of the explorer (all derive from ``VerdeError``, so the CLI prints them as one line)."""

from __future__ import annotations

from verde_chain.agents.endpoint import NoContracts
from verde_chain.errors import VerdeError


class ExplorerError(VerdeError):
    """The explorer cannot start or read what it was pointed at (bad URL, bad address, busy port)."""


# one class for "no JobMarket answers there", wherever a command is pointed (agents/endpoint.py)
__all__ = ["ExplorerError", "NoContracts"]

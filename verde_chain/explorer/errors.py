"""Errors of the explorer (all derive from ``VerdeError``, so the CLI prints them as one line)."""

from __future__ import annotations

from verde_chain.errors import VerdeError


class ExplorerError(VerdeError):
    """The explorer cannot start or read what it was pointed at (bad URL, bad address, busy port)."""


class NoContracts(ExplorerError):
    """No JobMarket answers at the address (nothing deployed there, or the chain was restarted)."""

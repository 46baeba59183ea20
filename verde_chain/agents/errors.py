"""Errors of the agents package (all derive from ``VerdeError``)."""

from __future__ import annotations

from verde_chain.errors import VerdeError


class AgentError(VerdeError):
    """A bot cannot proceed (bad configuration, unavailable job bundle, unknown strategy)."""

    def __init__(self, message: str, **fields: object) -> None:
        self.fields = fields
        super().__init__(message)


class StrategyError(AgentError):
    """A ``--strategy`` / ``--cheat`` string that does not parse."""


class CrashInjected(AgentError):
    """Raised by a test hook to simulate a bot dying at a precise point (e.g. after signing a
    transaction and before broadcasting it)."""


class InsufficientFunds(AgentError):
    """The bot's account holds less of a job's token (or ETH) than a payment needs; nothing was
    sent. Carries ``token``, ``need`` and ``have`` (smallest units)."""

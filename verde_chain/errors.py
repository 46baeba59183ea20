"""One exception root for verde_chain, with domain subclasses carrying structured fields."""

from __future__ import annotations


class VerdeError(Exception):
    """Root of every error verde_chain raises on purpose."""


class CommitmentError(VerdeError):
    """A Merkle tree, proof or commitment is malformed or does not verify."""

    def __init__(self, name: str, message: str, **fields: object) -> None:
        self.name = name
        self.fields = fields
        super().__init__(f"{name}: {message}")


class ChainError(VerdeError):
    """Anvil, RPC, compilation or deployment failed."""


class ContractRevert(ChainError):
    """A transaction or call reverted with a decoded custom error."""

    def __init__(self, error: str, args: dict[str, object] | None = None, raw: bytes = b"") -> None:
        self.error = error
        self.args_ = args or {}
        self.raw = raw
        super().__init__(f"{error}({', '.join(f'{k}={v}' for k, v in self.args_.items())})")


class RepOpsError(VerdeError):
    """An operator was given something RepOps does not support (names the op and what is)."""

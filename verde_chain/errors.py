"""One exception root for verde_chain, with domain subclasses carrying structured fields.

``CustomError`` is the one shape of a decoded Solidity custom error: its ``name`` and its typed
``fields`` (ABI parameter name -> value; bytes32 as ``bytes``, uints as ``int``, addresses
checksummed). The chain clients raise it (as ``ContractRevert``) when a contract reverts, and the
Python twins raise it when their rule check fails, with the same name and fields the contract
reverts with, so a differential test compares ``err.decoded`` on both sides.
"""

from __future__ import annotations


class VerdeError(Exception):
    """Root of every error verde_chain raises on purpose."""


class CustomError(VerdeError):
    """A Solidity custom error by name and fields (``detail`` is a human-readable addition only)."""

    def __init__(self, name: str, /, detail: str = "", **fields: object) -> None:
        self.name = name
        self.fields: dict[str, object] = fields
        self.detail = detail
        text = f"{name}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
        super().__init__(f"{text}: {detail}" if detail else text)

    @property
    def decoded(self) -> tuple[str, dict[str, object]]:
        """``(name, fields)``: what a differential test compares between a twin and its contract."""
        return self.name, self.fields


class CommitmentError(CustomError):
    """A Merkle tree, proof or commitment is malformed or does not verify (the names of
    ``contracts/commit/CommitErrors.sol`` where the contract has the check, e.g. ``InvalidProof``)."""


class ChainError(VerdeError):
    """Anvil, RPC, compilation or deployment failed."""


class ContractRevert(CustomError, ChainError):
    """A transaction or call reverted; decoded from the revert data (``raw``) by the chain clients."""

    def __init__(self, name: str, /, detail: str = "", raw: bytes = b"", **fields: object) -> None:
        self.raw = raw
        super().__init__(name, detail, **fields)


class RepOpsError(VerdeError):
    """An operator was given something RepOps does not support (names the op and what is)."""

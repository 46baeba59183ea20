"""What a job is paid in: ETH or an ERC-20 token, and how to show amounts of it.

The market keeps every amount in the token's smallest unit (wei for ETH). People read them in
whole units, so the bots' logs and ``verde-chain job status`` scale by the token's
``decimals()``. That function is optional in ERC-20 (it lives in the metadata extension), so a
token without it (or one that answers garbage) is shown in raw units, labelled as such, rather
than with a guessed scale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from web3 import Web3
from web3.contract import Contract

from verde_chain.agents.wallet import retry
from verde_chain.chain.compile import Artifact
from verde_chain.errors import ChainError
from verde_chain.market.types import ETH

T = TypeVar("T")
MAX_DECIMALS = 77  # 10**77 < 2**256 <= 10**78: more could not scale any uint256 meaningfully


def is_eth(token: str) -> bool:
    return int(token, 16) == 0


def erc20(w3: Web3, artifacts: Mapping[str, Artifact], token: str) -> Contract:
    """The token as a contract with the metadata extension's ABI (balanceOf, allowance, approve,
    decimals, symbol); the optional functions may still be missing on chain."""
    return w3.eth.contract(address=Web3.to_checksum_address(token), abi=artifacts["IERC20Metadata"].abi)


@dataclass(frozen=True)
class TokenInfo:
    address: str
    symbol: str
    decimals: int | None  # None: the token has no usable decimals(); amounts stay raw

    @property
    def is_eth(self) -> bool:
        return is_eth(self.address)

    def format(self, amount: int) -> str:
        """`amount` (smallest units) in whole units with its symbol: exact, no float rounding."""
        if self.decimals is None:
            return f"{amount} {self.symbol} (raw units)"
        if self.decimals == 0:
            return f"{amount} {self.symbol}"
        sign = "-" if amount < 0 else ""
        whole, frac = divmod(abs(amount), 10**self.decimals)
        digits = str(frac).rjust(self.decimals, "0").rstrip("0")
        return f"{sign}{whole}{'.' + digits if digits else ''} {self.symbol}"

    def as_dict(self) -> dict[str, Any]:
        return {"address": self.address, "symbol": self.symbol, "decimals": self.decimals}


ETH_INFO = TokenInfo(ETH, "ETH", 18)


def _optional(fn: Callable[[], T]) -> T | None:
    """An optional view: None when the token lacks it or answers something undecodable; a node
    that cannot be reached still raises (that is not the token's fault)."""
    try:
        return retry(fn)
    except ChainError:
        raise
    except Exception:  # noqa: BLE001 - reverts, empty return data, undecodable output all mean "absent"
        return None


def token_info(w3: Web3, artifacts: Mapping[str, Artifact], token: str) -> TokenInfo:
    if is_eth(token):
        return ETH_INFO
    c = erc20(w3, artifacts, token)
    dec = _optional(lambda: int(c.functions.decimals().call()))
    sym = _optional(lambda: str(c.functions.symbol().call()))
    address = Web3.to_checksum_address(token)
    symbol = sym if sym and sym.isprintable() and len(sym) <= 16 else f"{address[:8]}..{address[-4:]}"
    return TokenInfo(address, symbol, dec if dec is not None and 0 <= dec <= MAX_DECIMALS else None)

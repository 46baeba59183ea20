"""Where a command points, checked before it talks to the chain: the RPC URL, an address, and
that a JobMarket (with its DisputeGame) answers there.

Every command that reads or writes a market (the bots, ``job status``/``results``, ``dispute
status``, the explorer) goes through these checks, so each way of pointing somewhere wrong is
one line that names the problem and the fix instead of a traceback from the transport (a URL
without a scheme), from web3 (``BadFunctionCallOutput`` when a deployment record outlived a
restarted node, or ``--market`` names an account) or from eth_utils (a malformed address).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

from eth_typing import ChecksumAddress
from web3 import Web3

from verde_chain.agents.errors import AgentError
from verde_chain.agents.wallet import TRANSIENT, connect
from verde_chain.chain.compile import Artifact
from verde_chain.chain.market_client import Market
from verde_chain.errors import ChainError


class EndpointError(AgentError):
    """``--rpc-url`` or ``--market`` points somewhere a command cannot use."""


class NoContracts(EndpointError):
    """No JobMarket answers at the address (nothing deployed there, or the chain was restarted)."""


def check_rpc_url(url: str) -> None:
    if urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise EndpointError(f"--rpc-url {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8545)")


def check_address(text: str, flag: str = "--market") -> ChecksumAddress:
    """``text`` as a checksummed address, or the one-line error naming ``flag``."""
    if not Web3.is_address(text):
        raise EndpointError(f"{flag} {text!r} is not an address (want 0x and 40 hex digits)")
    return Web3.to_checksum_address(text)


def connect_node(url: str) -> Web3:
    """A connection to the node at ``url`` (checked URL; one line if no node answers)."""
    check_rpc_url(url)
    try:
        return connect(url)
    except ChainError as exc:
        raise EndpointError(f"no JSON-RPC node answers at {url} (is the chain running? `verde-chain node` starts "
                            "one)") from exc


def check_market(w3: Web3, artifacts: Mapping[str, Artifact], address: str, where: str, fix: str = "") -> str:
    """The address of the DisputeGame of the JobMarket at ``address``; ``NoContracts`` (its
    message ends with ``fix``, e.g. how to redeploy) if no JobMarket answers there. ``where``
    names the node (its RPC URL)."""
    addr = check_address(address)
    chain = w3.eth.chain_id
    tail = f"; {fix}" if fix else ""
    if not w3.eth.get_code(addr):
        raise NoContracts(f"no contracts deployed at {addr} on chain {chain} ({where}){tail}")
    try:
        game = Web3.to_checksum_address(Market.at(w3, artifacts, addr).game_address())
    except TRANSIENT:
        raise
    except Exception as exc:  # any other failure to answer game() means "not a JobMarket"
        raise NoContracts(f"{addr} on chain {chain} is not a JobMarket ({type(exc).__name__}){tail}") from exc
    if not w3.eth.get_code(game):
        raise NoContracts(f"the JobMarket at {addr} points at {game}, which holds no DisputeGame{tail}")
    return str(game)

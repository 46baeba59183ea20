"""Deploy compiled contracts and write a deployment record (chain id, addresses, block, ABI hashes)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from web3 import Web3
from web3.contract import Contract

from verde_chain.chain.compile import Artifact
from verde_chain.chain.tx import transact_raw
from verde_chain.errors import ChainError
from verde_chain.market.marketparams import MarketParams


def deploy_contract(
    w3: Web3,
    artifacts: Mapping[str, Artifact],
    name: str,
    *ctor_args: Any,
    sender: str | None = None,
    value: int = 0,
) -> Contract:
    if name not in artifacts:
        raise ChainError(f"no compiled contract named {name!r}; known: {sorted(artifacts)}")
    art = artifacts[name]
    if art.bytecode in ("0x", ""):
        raise ChainError(f"{name} is abstract or an interface; it has no bytecode")
    factory = w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    receipt = transact_raw(w3, factory.constructor(*ctor_args), artifacts, sender=sender, value=value)
    address = receipt["contractAddress"]
    if address is None:
        raise ChainError(f"deploying {name} produced no contract address")
    return w3.eth.contract(address=address, abi=art.abi)


def deploy_market(w3: Web3, artifacts: Mapping[str, Artifact], game: str, params: MarketParams,
                  sender: str | None = None) -> Contract:
    """Deploy a JobMarket over `game` with its immutable `params` (the one path: the CLI's and the
    demo's system, the typed client and the test fixtures all come through here)."""
    return deploy_contract(w3, artifacts, "JobMarket", game, params.as_tuple(), sender=sender)


@dataclass
class DeploymentRecord:
    chain_id: int
    rpc_url: str
    block: int
    deployer: str
    contracts: dict[str, str] = field(default_factory=dict)
    abi_hashes: dict[str, str] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)
    market_params: dict[str, Any] = field(default_factory=dict)  # the JobMarket's MarketParams, if deployed

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> DeploymentRecord:
        return cls(**json.loads(path.read_text()))


def deploy_system(
    w3: Web3, artifacts: Mapping[str, Artifact], rpc_url: str, names: list[str], sender: str | None = None
) -> tuple[DeploymentRecord, dict[str, Contract]]:
    """Deploy the named contracts (constructor-less) and return the record and the handles."""
    sender = sender or w3.eth.accounts[0]
    deployed = {n: deploy_contract(w3, artifacts, n, sender=sender) for n in names}
    record = DeploymentRecord(
        chain_id=w3.eth.chain_id,
        rpc_url=rpc_url,
        block=w3.eth.block_number,
        deployer=sender,
        contracts={n: c.address for n, c in deployed.items()},
        abi_hashes={n: artifacts[n].abi_hash for n in names},
    )
    return record, deployed

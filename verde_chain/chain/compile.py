"""Compile every contract under ``contracts/`` with solc (the npm solcjs shim), cached by source hash.

The cache key covers every source file's path and content plus the compiler settings, so any
edit recompiles and an unchanged tree loads the JSON artifacts in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verde_chain.chain.paths import BUILD, CONTRACTS, NODE_MODULES, REPO, SOLC_SHIM
from verde_chain.errors import ChainError

SOLC_VERSION = "0.8.28"
SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 200},
    "evmVersion": "cancun",
    "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}},
}


@dataclass(frozen=True)
class Artifact:
    name: str
    source: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str

    @property
    def abi_hash(self) -> str:
        return "0x" + hashlib.sha256(json.dumps(self.abi, sort_keys=True).encode()).hexdigest()


def _source_name(p: Path) -> str:
    try:
        return str(p.relative_to(REPO))
    except ValueError:  # contracts outside the repository (e.g. a test's temporary folder)
        return str(p)


def _sources(root: Path) -> dict[str, str]:
    # Hidden folders are tool caches (ape-solidity copies dependencies into contracts/.cache).
    files = [p for p in sorted(root.rglob("*.sol")) if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return {_source_name(p): p.read_text() for p in files}


def source_hash(sources: dict[str, str]) -> str:
    h = hashlib.sha256(json.dumps([SOLC_VERSION, SETTINGS], sort_keys=True).encode())
    for path, text in sources.items():
        h.update(path.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def _run_solc(sources: dict[str, str]) -> dict[str, Any]:
    std_input = {
        "language": "Solidity",
        "sources": {p: {"content": t} for p, t in sources.items()},
        "settings": {**SETTINGS, "remappings": ["@openzeppelin/=node_modules/@openzeppelin/"]},
    }
    proc = subprocess.run(
        ["node", str(SOLC_SHIM), "--standard-json", "--base-path", str(REPO), "--include-path", str(NODE_MODULES)],
        input=json.dumps(std_input),
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,  # the exit code and stderr are reported below
    )
    if proc.returncode != 0 or not proc.stdout:
        raise ChainError(f"solc failed (exit {proc.returncode}): {proc.stderr.strip()[:2000]}")
    out = json.loads(proc.stdout)
    errors = [e for e in out.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise ChainError("solc errors:\n" + "\n".join(e["formattedMessage"] for e in errors))
    return out


def compile_contracts(root: Path = CONTRACTS) -> dict[str, Artifact]:
    """Compile (or load from cache) every contract; names must be unique across files."""
    sources = _sources(root)
    if not sources:
        raise ChainError(f"no .sol files under {root}")
    key = source_hash(sources)
    cache = BUILD / "artifacts" / f"{key}.json"
    if cache.exists():
        raw = json.loads(cache.read_text())
    else:
        out = _run_solc(sources)
        raw = {}
        for src, contracts in out.get("contracts", {}).items():
            for name, c in contracts.items():
                if name in raw:
                    raise ChainError(f"contract name {name} defined in both {raw[name]['source']} and {src}")
                raw[name] = {
                    "name": name,
                    "source": src,
                    "abi": c["abi"],
                    "bytecode": "0x" + c["evm"]["bytecode"]["object"],
                    "deployed_bytecode": "0x" + c["evm"]["deployedBytecode"]["object"],
                }
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # two test processes may compile at once
        tmp.write_text(json.dumps(raw))
        tmp.replace(cache)
    return {name: Artifact(**a) for name, a in raw.items()}

"""Where the repository keeps its toolchain and build outputs."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = REPO / "contracts"
BUILD = Path(os.environ.get("VERDE_BUILD_DIR", REPO / "build"))
NODE_MODULES = REPO / "node_modules"
SOLC_SHIM = REPO / "bin" / "solc"
ANVIL_BIN = NODE_MODULES / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"


def anvil_binary() -> Path:
    override = os.environ.get("VERDE_ANVIL")
    return Path(override) if override else ANVIL_BIN

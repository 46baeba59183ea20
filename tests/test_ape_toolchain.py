"""The npm toolchain serves the standard Python tools: py-solc-x, `ape compile` and `ape test`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verde_chain.chain.paths import ANVIL_BIN, REPO, SOLC_SHIM

pytestmark = pytest.mark.chain
SOLCX_DIR = REPO / "build" / "toolchain" / "solcx"


def _env() -> dict[str, str]:
    SOLCX_DIR.mkdir(parents=True, exist_ok=True)
    link = SOLCX_DIR / "solc-v0.8.28"
    if not link.exists():
        link.symlink_to(SOLC_SHIM)
    env = dict(os.environ)
    env["PATH"] = f"{ANVIL_BIN.parent}:{Path(sys.executable).parent}:{env['PATH']}"
    env["SOLCX_BINARY_PATH"] = str(SOLCX_DIR)
    return env


def test_solc_shim_version() -> None:
    out = subprocess.run([str(SOLC_SHIM), "--version"], capture_output=True, text=True, check=True).stdout
    assert "Version: 0.8.28+commit.7893614a" in out


def test_py_solc_x_uses_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    import solcx

    monkeypatch.setenv("SOLCX_BINARY_PATH", _env()["SOLCX_BINARY_PATH"])
    assert "0.8.28" in [str(v) for v in solcx.get_installed_solc_versions()]
    src = "// SPDX-License-Identifier: MIT\npragma solidity 0.8.28; contract A { function f() external pure returns (uint) { return 7; } }"
    out = solcx.compile_standard(
        {"language": "Solidity", "sources": {"A.sol": {"content": src}},
         "settings": {"outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}}}},
        solc_version="0.8.28",
    )
    assert out["contracts"]["A.sol"]["A"]["evm"]["bytecode"]["object"]


def test_large_output_is_not_truncated() -> None:
    """solcjs exits through process.exit; the shim must flush outputs far above 64 KiB."""
    body = "\n".join(f"function f{i}(uint x) external pure returns (uint) {{ return x * {i} + {i}; }}" for i in range(400))
    src = f"// SPDX-License-Identifier: MIT\npragma solidity 0.8.28; contract Big {{ {body} }}"
    import json

    std = {"language": "Solidity", "sources": {"Big.sol": {"content": src}},
           "settings": {"outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}}}}
    r = subprocess.run([str(SOLC_SHIM), "--standard-json"], input=json.dumps(std), capture_output=True, text=True)
    assert len(r.stdout) > 65536
    assert json.loads(r.stdout)["contracts"]["Big.sol"]["Big"]["abi"]


def test_ape_compile_and_ape_test() -> None:
    env = _env()
    ape = str(Path(sys.executable).parent / "ape")
    c = subprocess.run([ape, "compile", "--force"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "compiled" in (c.stdout + c.stderr)
    t = subprocess.run([ape, "test", "tests/ape"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stdout + t.stderr
    assert "1 passed" in t.stdout

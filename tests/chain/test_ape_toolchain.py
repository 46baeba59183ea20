"""The npm toolchain serves the standard Python tools: py-solc-x, `ape compile` and `ape test`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verde_chain.chain.paths import ANVIL_BIN, REPO, SOLC_SHIM

pytestmark = pytest.mark.chain
SOLCX_DIR = REPO / "build" / "toolchain" / "solcx"
APE_TMP = REPO / "build" / "ape-tmp"


def _env() -> dict[str, str]:
    SOLCX_DIR.mkdir(parents=True, exist_ok=True)
    link = SOLCX_DIR / "solc-v0.8.28"
    if not link.exists():
        link.symlink_to(SOLC_SHIM)
    env = dict(os.environ)
    env["PATH"] = f"{ANVIL_BIN.parent}:{Path(sys.executable).parent}:{env['PATH']}"
    env["SOLCX_BINARY_PATH"] = str(SOLCX_DIR)
    # ape compiles in an isolated temp copy, except when the project itself already lies under
    # the temp dir (a clone in /tmp): then it unpacks dependencies into contracts/.cache in place
    # and later lists only the top-level sources. A temp dir inside build/ keeps it isolated.
    env["TMPDIR"] = str(APE_TMP)
    APE_TMP.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(REPO / "contracts" / ".cache", ignore_errors=True)
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
    r = subprocess.run([str(SOLC_SHIM), "--standard-json"], input=json.dumps(std), capture_output=True, text=True, check=False)
    assert len(r.stdout) > 65536
    assert json.loads(r.stdout)["contracts"]["Big.sol"]["Big"]["abi"]


def test_shim_resolves_sources_by_url_and_remapped_imports(tmp_path: Path) -> None:
    """What ape-solidity and native-solc users send: a source given by ``urls`` (read through the
    import callback, relative to --base-path, not to the working directory) whose import goes
    through a remapping to a folder under the base path."""
    import json

    (tmp_path / "src").mkdir()
    (tmp_path / "lib" / "oz").parent.mkdir()
    (tmp_path / "lib" / "oz").symlink_to(REPO / "node_modules" / "@openzeppelin" / "contracts")
    (tmp_path / "src" / "Tok.sol").write_text(
        "// SPDX-License-Identifier: MIT\npragma solidity 0.8.28;\n"
        'import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";\n'
        'contract Tok is ERC20 { constructor() ERC20("t", "T") {} }\n'
    )
    std = {"language": "Solidity", "sources": {"src/Tok.sol": {"urls": ["src/Tok.sol"]}},
           "settings": {"remappings": ["@openzeppelin/contracts=lib/oz"],
                        "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}}}}
    r = subprocess.run([str(SOLC_SHIM), "--standard-json", "--base-path", str(tmp_path)], input=json.dumps(std),
                       capture_output=True, text=True, cwd="/", check=False)
    out = json.loads(r.stdout)
    assert not [e for e in out.get("errors", []) if e["severity"] == "error"], out.get("errors")
    assert out["contracts"]["src/Tok.sol"]["Tok"]["evm"]["bytecode"]["object"]
    assert "lib/oz/token/ERC20/ERC20.sol" in out["sources"]
    # a missing file is a compile error naming the file, not a crash or an empty output
    std["sources"] = {"src/Nope.sol": {"urls": ["src/Nope.sol"]}}
    r = subprocess.run([str(SOLC_SHIM), "--standard-json", "--base-path", str(tmp_path)], input=json.dumps(std),
                       capture_output=True, text=True, cwd="/", check=False)
    errors = json.loads(r.stdout)["errors"]
    assert any("src/Nope.sol" in e["message"] for e in errors)


# Every contract ape must compile, including the three that import OpenZeppelin (issue #2).
OZ_CONTRACTS = ("JobMarket", "TestToken", "FeeOnTransferToken", "ReentrantClient")


def test_ape_compile_and_ape_test() -> None:
    import json

    env = _env()
    ape = str(Path(sys.executable).parent / "ape")
    c = subprocess.run([ape, "compile", "--force"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    log = c.stdout + c.stderr
    assert c.returncode == 0, log
    assert "compiled" in log
    # the OpenZeppelin importers are in ape's input, with OZ's sources from the unpacked dependency
    for src in ("contracts/market/JobMarket.sol", "contracts/test/TestToken.sol", "contracts/test/MarketAttackers.sol",
                "contracts/.cache/openzeppelin/5.7.0/token/ERC20/ERC20.sol",
                "contracts/.cache/openzeppelin/5.7.0/token/ERC20/utils/SafeERC20.sol"):
        assert src in log, src
    manifest = json.loads((REPO / ".build" / "__local__.json").read_text())
    types = manifest["contractTypes"]
    for name in OZ_CONTRACTS + ("DisputeGame", "ScalarVM", "MerkleHarness"):
        assert len(types[name]["deploymentBytecode"]["bytecode"]) > 2, name
    # JobMarket's interface as ape sees it is the one our own compiler produces
    from verde_chain.chain.compile import compile_contracts

    def entries(abi: list[dict]) -> set[tuple[str, str, int]]:
        return {(x["type"], x.get("name", ""), len(x.get("inputs", []))) for x in abi}

    assert entries(types["JobMarket"]["abi"]) == entries(compile_contracts()["JobMarket"].abi)
    t = subprocess.run([ape, "test", "tests/ape"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert t.returncode == 0, t.stdout + t.stderr
    assert "2 passed" in t.stdout

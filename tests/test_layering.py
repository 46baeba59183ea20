"""The layering rules of docs/architecture.md: pure logic loads without web3, and production code
never imports test code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the twins, types, worlds, players, cheats and rules: everything a bot decides with, off chain
PURE = [
    "verde_chain.dispute.types", "verde_chain.dispute.bisection", "verde_chain.dispute.clock",
    "verde_chain.dispute.nodecheck", "verde_chain.dispute.world", "verde_chain.dispute.players",
    "verde_chain.dispute.cheats", "verde_chain.dispute.kernel_world", "verde_chain.market.types",
    "verde_chain.market.marketparams",
    "verde_chain.graph.world", "verde_chain.vm.scalarvm", "verde_chain.commit",
]


def test_pure_modules_load_without_web3() -> None:
    ours = ("verde_chain.chain", "verde_chain.agents")  # our web3 layer and the bots on it
    code = (f"import sys\nfor m in {PURE!r}: __import__(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'web3' or m.startswith({ours!r})))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout  # neither web3 nor our web3 layer came along


def test_no_production_module_imports_tests() -> None:
    offenders = []
    for path in sorted((REPO / "verde_chain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert offenders == []

"""Golden outcomes recorded before the wave-3 restructuring: moving code must not move a bit.

The values were produced by the code at commit 3366ec8 (before any file moved). A refactor that
changes one of them changed behaviour; a protocol change that is meant to change one updates it
here in its own commit, saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GOLDEN_TRAIN = {
    ("digits", 40): {
        "final_commitment": "0x1ab6f417fdc0091f36a319daab8e8e5a7379b2fc51a622abb1b9e8140e28c8be",
        "spec_hash": "0x792427e1c851945a92c032936c79c66e30ecb0f98904ee2290932412e225e069",
        "graph_root": "0xa9908aca8fdf9649752602e88caa410cfd353afc9257f3a0642a63da5ed0ee40",
        "c0": "0x365b060d74fd496017e702af474c02ef3672ed2aef0f447f4062cab59e30dfbe",
        "nodes": 33,
    },
    ("transformer", 10): {
        "final_commitment": "0xb11150a1281c39186cc9b9831eaaed671cd552d627ba2f7ab8f10f1d8ed8066f",
        "spec_hash": "0x29d56a375a488c69bf8da73841a290ef1fb4e27ae3548ee2e265a6f772c7ada2",
        "graph_root": "0xea34da26db601d003b47b0de00da28013147e03f189d17eec5de09661da018dd",
        "c0": "0x5fe7e11d9fa80c158a4414818e8bd98064343a029926e5f99c4cf85332670608",
        "nodes": 190,
    },
}

# `verde-chain demo --json` with its default seed: where the cheat was planted, where the referee
# executed its one instruction, and which result the market accepted.
GOLDEN_DEMO = {
    "cheater_strategy": "bitflip:39:31:7:11",
    "accepted_result": "0x7d04bc64e0a4eaaea1681c6b4e0173d73f218f701df6d9b5a9dac81d1c69c2eb",
    "referee": {"step": 39, "node": 31, "element": 7, "micro_step": 5, "micro_steps": 6,
                "node_label": "sgd/sgd_buf", "resolution": "STEP", "instructions_executed_on_chain": 1},
}


def _json_line(args: list[str], cwd: Path) -> dict:  # type: ignore[type-arg]
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", *args], capture_output=True, text=True,
                       cwd=cwd, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("job", "steps"), list(GOLDEN_TRAIN))
def test_training_commitments_are_golden(job: str, steps: int, tmp_path: Path) -> None:
    got = _json_line(["train", job, "--steps", str(steps), "--json", "--out", str(tmp_path)], REPO)
    assert {k: got[k] for k in GOLDEN_TRAIN[(job, steps)]} == GOLDEN_TRAIN[(job, steps)]


@pytest.mark.chain
def test_demo_outcome_is_golden(tmp_path: Path) -> None:
    rep = _json_line(["demo", "--json", "--out", str(tmp_path)], REPO)
    assert rep["honest_won"] is True
    assert rep["cheater_strategy"] == GOLDEN_DEMO["cheater_strategy"]
    assert rep["accepted_result"] == GOLDEN_DEMO["accepted_result"]
    assert {k: rep["referee"][k] for k in GOLDEN_DEMO["referee"]} == GOLDEN_DEMO["referee"]

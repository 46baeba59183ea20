"""Golden outcomes recorded before the wave-3 restructuring: moving code must not move a bit.

The values were produced by the code at commit 3366ec8 (before any file moved). A refactor that
changes one of them changed behaviour; a protocol change that is meant to change one updates it
here in its own commit, saying why. Since: the cross-entropy's softmax nodes were merged (2 fewer
nodes per step, every value the same bits): the graph roots, C_s and the demo's drawn fault
moved; the final parameters, momenta and losses did not. Then the peephole pass
(graph/peephole.py) folded the transformer's 11 ADDs of a single-use matmul output into the
matmul's epilogue (188 -> 177 nodes): its graph root, C_0, spec hash and C_T moved; its losses
and final state are the same bits with the pass on and off (tests/graph/test_peephole.py).
Then the graph builder built a node equal to an earlier one once and the training cross-entropy
lost its log_softmax node (4 fewer nodes per step: the backward's max, sub_exp and sum are the
forward's; tests/graph/test_cse.py; digits 31 -> 27, transformer 177 -> 173): the graph roots,
spec hashes, C_0, C_T and the demo's drawn fault (drawn over 27 nodes) moved; the final
parameters, momenta and losses did not (every checkpoint tensor compared bit for bit with the
code before).
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
        "final_commitment": "0x55318b392fa2e4b0824ceb44908fedd2d5ed8c45c0bdb7891188860804bc5784",
        "spec_hash": "0x4cb43b1a7cffae4451fcf1099ec77287ee081eaf63366d0d3af9de0055790c69",
        "graph_root": "0x16f22d35f8db7ed1f1186933d62f5c03c9379fba59ce7606c896419d4811ab1d",
        "c0": "0xfabdc4938b3ba04d99b97b0125aadc4a33c81dd1cecf3210b64068dd538a0f95",
        "nodes": 27,
    },
    ("transformer", 10): {
        "final_commitment": "0x94aeb487d9129cb00189582adbe6b0071152141d9b4e11b8c8e35950eae8d4e5",
        "spec_hash": "0xedbb5483549c347e207974f3c5e8f2c7b879925dd2adde755cf2aa1650d2dd86",
        "graph_root": "0x10abc6dc12f2c81df4344d2370de6efea6ab8349dbbdfde768410c1dbb7a4874",
        "c0": "0x983875e1cbf5135d34aa2f4984d2cdb421e4af13ab354c42602f89710022d2de",
        "nodes": 173,
    },
}

# `verde-chain demo --json` with its default seed: where the cheat was planted, where the referee
# executed its one instruction, and which result the market accepted.
GOLDEN_DEMO = {
    "cheater_strategy": "bitflip:62:11:0:18",
    "accepted_result": "0xe867c284f700ae05f7d95a90b2838cae3433897b9e010038b9918906c4151046",
    "referee": {"step": 62, "node": 11, "element": 0, "micro_step": 0, "micro_steps": 1,
                "node_label": "fill", "resolution": "STEP", "instructions_executed_on_chain": 1},
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

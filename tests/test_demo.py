"""`verde-chain demo`: the whole story on an embedded Anvil, as `make demo` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verde_chain.agents.catalog import build_job
from verde_chain.agents.errors import StrategyError
from verde_chain.demo import cheater_strategy, job_instructions

REPO = Path(__file__).resolve().parents[1]


def _demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    r = subprocess.run([sys.executable, "-m", "verde_chain.cli", "demo", "--json", "--out", str(tmp_path), *args],
                       capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    lines = r.stdout.strip().splitlines()
    return r, (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {})


@pytest.mark.chain
def test_demo_default_honest_side_wins(tmp_path: Path) -> None:
    r, rep = _demo(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert rep["honest_won"] is True
    for key in ("total_gas", "gas_by_party", "moves_by_level", "max_moves_per_party", "wall_s"):
        assert key in rep
    assert rep["total_gas"] == sum(rep["gas_by_party"].values()) > 0
    # the flipped bit is refuted by executing ONE instruction on chain, at the cheat's own site
    ref = rep["referee"]
    assert ref["resolution"] == "STEP" and ref["instructions_executed_on_chain"] == 1 and ref["step_gas"] > 0
    _, s, d, e, _bit = rep["cheater_strategy"].split(":")
    assert (ref["step"], ref["node"], ref["element"]) == (int(s), int(d), int(e))
    assert set(rep["moves_by_level"]) == {"L1", "L2", "L3", "L4"}
    assert rep["net_wei_by_party"]["trainer-honest"] > 0 > rep["net_wei_by_party"]["trainer-cheat"]
    png = Path(rep["picture"])
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[game 1] L4 micro-steps" in r.stdout and "=== report ===" in r.stdout
    # the picture says what the cheat was and who won, in words
    cap = rep["picture_caption"]
    assert f"flipped bit {_bit} of element {e} of node {d} (" in cap and f"at training step {s} " in cap, cap
    assert "The honest challenger won; the cheating trainer forfeited its stake." in cap, cap
    # the wall time is cut into measured parts that add up to it
    times = rep["times_s"]
    assert set(times) == {"imports", "compile", "chain", "job", "training", "dispute", "report"}, times
    assert min(times.values()) >= 0 and times["training"] > 0 and times["dispute"] > 0
    assert round(sum(times.values()), 2) == rep["wall_s"]
    assert f"wall time {rep['wall_s']} s = imports " in r.stdout


@pytest.mark.chain
def test_demo_chosen_cheat_and_timeout_level(tmp_path: Path) -> None:
    r, rep = _demo(tmp_path / "a", "--steps", "4", "--cheat", "3:26:2:5")
    assert r.returncode == 0 and rep["honest_won"] is True, r.stderr[-2000:]
    assert rep["cheater_strategy"] == "bitflip:3:26:2:5"
    assert (rep["referee"]["step"], rep["referee"]["node"], rep["referee"]["element"]) == (3, 26, 2)
    r, rep = _demo(tmp_path / "b", "--steps", "4", "--cheat-level", "1")
    assert r.returncode == 0 and rep["honest_won"] is True, r.stderr[-2000:]
    assert rep["referee"]["resolution"] == "TIMEOUT" and rep["referee"]["instructions_executed_on_chain"] == 0


def test_cheat_options_are_checked() -> None:
    job = build_job("digits", 2)
    with pytest.raises(StrategyError):
        cheater_strategy(job, 0, "3:0:0", None)  # step 3 of a 2-step job
    with pytest.raises(StrategyError):
        cheater_strategy(job, 0, "1:99:0", None)  # no node 99
    with pytest.raises(StrategyError, match="never read"):
        cheater_strategy(job, 0, f"1:{next(n.index for n in job.program.graph.nodes if n.label == 'ce/log')}:0", None)
    assert cheater_strategy(job, 0, None, 2) == "lazy"
    assert cheater_strategy(job, 4, None, None) == cheater_strategy(job, 4, None, None)
    assert job_instructions(job) == 2 * sum(n.desc.numel * n.desc.num_steps for n in job.program.graph.nodes)


@pytest.mark.chain
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "llama-inference"])
def test_demo_llama_disputes_end_at_one_instruction(tmp_path: Path, kind: str) -> None:
    """A training dispute over the tiny Llama, and an inference job whose cheater lies about one
    logit of its batch of prompts: both refuted by one instruction on-chain, within the issue's
    gas bounds (one-step proof <= 150k, both parties' dispute gas <= 5M). The step transaction
    also carries the market's settlement of the game (since issue #13 it rejects the result,
    assigns the stake and burns half of it); the proof's bound is on the rest."""
    r, rep = _demo(tmp_path, "--job", kind)
    assert r.returncode == 0 and rep["honest_won"] is True, r.stdout[-3000:] + r.stderr[-3000:]
    ref = rep["referee"]
    assert ref["resolution"] == "STEP" and ref["instructions_executed_on_chain"] == 1
    assert 0 < ref["settlement_gas"] < ref["step_gas"]
    assert ref["step_gas"] - ref["settlement_gas"] <= 150_000
    assert rep["gas_by_party"]["trainer-cheat"] + rep["gas_by_party"]["challenger"] <= 5_000_000
    _, s, d, e, _bit = rep["cheater_strategy"].split(":")
    assert (ref["step"], ref["node"], ref["element"]) == (int(s), int(d), int(e))
    if kind == "llama-inference":
        job = build_job(kind, 1)
        assert int(d) == job.program.graph.named["output"]  # the lie is a logit


@pytest.mark.chain
@pytest.mark.slow
def test_demo_resnet18_cheat_at_a_conv_or_batch_norm_node(tmp_path: Path) -> None:
    """A training dispute over resnet18 (3x32x32, batch 2, 2 steps) whose cheater flips one bit of
    a conv or batch-norm node's output: refuted by one instruction on-chain within the issue's
    gas bounds."""
    r, rep = _demo(tmp_path, "--job", "resnet18")
    assert r.returncode == 0 and rep["honest_won"] is True, r.stdout[-3000:] + r.stderr[-3000:]
    ref = rep["referee"]
    assert ref["resolution"] == "STEP" and ref["instructions_executed_on_chain"] == 1
    assert ref["node_label"].startswith(("conv", "batch_norm")), ref["node_label"]
    # the one-step proof; the final move's transaction also carries the market's settlement
    assert 0 < ref["settlement_gas"] < ref["step_gas"]
    assert ref["step_gas"] - ref["settlement_gas"] <= 150_000
    assert rep["gas_by_party"]["trainer-cheat"] + rep["gas_by_party"]["challenger"] <= 5_000_000

"""The bots' policy (``agents/policy.py``) against the trap jobs of issue #13.

A market deployed with loose bounds (whoever deployed it; here every bound is as wide as its
type) lets a client post each trap: a 1 s clock (its sybil wins on time one block after
disputing), a 2^64-1 clock or deadline (every stake locked for ever), a 1 s reveal or challenge
window, a 20,000 wei bond (an honest defence costs ~680k gas), a stake far above the reward, a
token the bot never agreed to. The shipped trainer refuses to stake in each, with one log line,
and still takes the sound job posted after them; the shipped challenger refuses to dispute on a
trap clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.bots import TERMS, World
from verde_chain.agents.client import JobOffer
from verde_chain.agents.errors import AgentError
from verde_chain.agents.policy import Conditions, Policy, block_interval, bond_refusal, refusal, side_moves
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.market_client import Market
from verde_chain.job import Job
from verde_chain.market.marketparams import FAST, MarketParams
from verde_chain.market.types import ETH, ZERO32, JobTerms, SlotStatus, commitment

U64 = 2**64 - 1
NOW = 1_700_000_000
# a chain with 1 s blocks and gas at 2 gwei, a bot whose moves cost two seconds of clock
COND = Conditions(now=NOW, block_interval=1.0, gas_price=2 * 10**9, burn_bps=FAST.burn_bps, move_latency=2.0)

TRAPS: dict[str, tuple[dict[str, Any], str]] = {
    "one-second-clock": ({"clock_seconds": 1}, "clock 1 s is below"),
    "endless-clock": ({"clock_seconds": U64}, "beyond my horizon"),
    "endless-deadline": ({"submission_window": 2**63}, "beyond my horizon"),
    "one-second-reveal-window": ({"reveal_window": 1}, "reveal window 1 s is shorter"),
    "one-second-challenge-window": ({"challenge_window": 1}, "challenge window 1 s is shorter"),
    "bond-below-defence-gas": ({"min_challenge_bond": 20_000}, "less than a defence costs"),
    "stake-above-reward": ({"trainer_stake": 10**19, "reward": 10**16}, "is more than 2.0 x my reward share"),
}


def terms_of(offer: JobOffer, job: Job, now: int = NOW, token: str = ETH) -> JobTerms:
    return JobTerms(token, job.spec.hash(), "", job.spec.graph_root, job.spec.initial_commitment, job.spec.batch_root,
                    job.spec.steps, max(1, job.spec.checkpoint_interval), offer.reward, offer.trainer_stake,
                    offer.min_challenge_bond, offer.slots, now + offer.submission_window, offer.reveal_window,
                    offer.challenge_window, offer.arity, offer.clock_seconds, job.spec.num_nodes)


# -- the rules alone (no chain) ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(TRAPS))
def test_each_trap_job_of_the_issue_is_refused_by_one_rule(job: Job, name: str) -> None:
    change, says = TRAPS[name]
    trap = terms_of(replace(TERMS, **change), job)
    why = refusal(trap, Policy(), COND, job, "trainer")
    assert why is not None and says in why, why
    assert refusal(terms_of(TERMS, job), Policy(), COND, job, "trainer") is None  # the sound job passes


def test_token_allow_list_and_token_bonds(job: Job) -> None:
    token = "0x" + "ab" * 20
    priced = terms_of(TERMS, job, token=token)
    assert "not on my allow-list" in (refusal(priced, Policy(), COND, job, "trainer") or "")
    allowed = Policy(tokens=(ETH, token))
    assert refusal(priced, allowed, COND, job, "trainer") is None
    mine = replace(allowed, token_bonds=((token, TERMS.min_challenge_bond),))  # half of it is paid: too little
    assert "less than my" in (refusal(priced, mine, COND, job, "trainer") or "")


def test_the_clock_rule_follows_measured_latency_and_the_job(job: Job) -> None:
    t = terms_of(TERMS, job)  # a 600 s clock
    moves = side_moves(t, job)
    assert 10 <= moves < side_moves(t)  # the bundle's sizes bound the game tighter than the type limits
    slow = replace(COND, move_latency=600 / moves)  # a bot this slow could not finish one game
    assert "clock 600 s is below" in (refusal(t, Policy(), slow, job, "trainer") or "")
    assert refusal(t, Policy(clock_margin=0.5), slow, job, "trainer") is None


def test_challenger_checks_what_puts_its_bond_at_risk_only(job: Job) -> None:
    cheap_stake = terms_of(replace(TERMS, trainer_stake=10**19, min_challenge_bond=20_000), job)
    assert refusal(cheap_stake, Policy(), COND, job, "challenger") is None  # a defender's concerns
    assert refusal(terms_of(replace(TERMS, clock_seconds=1), job), Policy(), COND, job, "challenger")
    assert bond_refusal(10**18, Policy(max_bond=10**17)) is not None
    assert bond_refusal(10**17, Policy(max_bond=10**17)) is None and bond_refusal(10**30, Policy()) is None


def test_block_interval_is_the_median_gap() -> None:
    assert block_interval([100, 112, 124, 136, 5000, 5012]) == 12.0  # one time jump does not count
    assert block_interval([7, 7, 7]) == 1.0 and block_interval([7]) == 1.0


def test_policy_file(tmp_path: Path) -> None:
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"tokens": [ETH, "0x" + "11" * 20], "max_bond": 5, "token_bonds": [["0x" + "11" * 20, 9]]}))
    p = Policy.from_json(f)
    assert p.tokens == (ETH, "0x" + "11" * 20) and p.max_bond == 5 and p.token_bonds == (("0x" + "11" * 20, 9),)
    f.write_text(json.dumps({"clock": 3}))
    with pytest.raises(AgentError, match="unknown fields \\['clock'\\]"):
        Policy.from_json(f)
    with pytest.raises(AgentError, match="policy file"):
        Policy.from_json(tmp_path / "missing.json")
    for bad, says in (({"clock_margin": "fast"}, "'fast' is not a non-negative float"),
                      ({"horizon": 1.5}, "1.5 is not a non-negative int"),
                      ({"tokens": ["ETH"]}, "'ETH' is not a 0x-prefixed 20-byte address")):
        f.write_text(json.dumps(bad))
        with pytest.raises(AgentError, match=says):
            Policy.from_json(f)


# -- the shipped bots on a loosely bounded market --------------------------------------------------

LOOSE = MarketParams(1, U64, 1, U64, 1, U64, U64, FAST.burn_bps, FAST.disputes_per_bond_step, ((ETH, 1),))


@pytest.fixture
def loose(w3: Any, artifacts: Any, deploy: Callable[..., Any], bundles: Path, tmp_path: Path, job: Job) -> World:
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    return World(w3, artifacts, Market.deploy(w3, artifacts, game.address, LOOSE), bundles, tmp_path, job)


@pytest.mark.chain
def test_shipped_trainer_refuses_every_trap_job_and_takes_the_sound_one(loose: World) -> None:
    client = loose.client()
    lines: list[str] = []
    trainer = loose.trainer(2)
    trainer.log_fn = lines.append
    trainer.max_jobs = 10
    ids = {name: client.post(replace(TERMS, **change), loose.job) for name, (change, _) in TRAPS.items()}
    good = client.post(TERMS, loose.job)
    for _ in range(3):
        trainer.tick()
    for name, jid in ids.items():
        rec = trainer.store.job(jid) or {}
        assert rec.get("state") == "skipped" and rec["reason"].startswith("policy: "), (name, rec)
        said = [m for m in lines if f"job {jid}: refused by my policy" in m]
        assert len(said) == 1 and TRAPS[name][1] in said[0], (name, said)
        assert loose.market.slots(jid) == []  # nothing staked
    assert [s.trainer for s in loose.market.slots(good)] == [trainer.address]
    assert (trainer.store.job(good) or {}).get("state") in ("joined", "committed")


@pytest.mark.chain
def test_shipped_challenger_will_not_dispute_on_a_trap_clock(loose: World) -> None:
    """A client's sybil takes a 1 s clock job and reveals a wrong result: disputing it would hand
    the sybil the bond on time one block later. The challenger refuses, says why once, and
    disputes the same wrong result on a sound job."""
    client = loose.client()
    lines: list[str] = []
    ch = loose.challenger()
    ch.log_fn = lines.append
    sybil = loose.w3.eth.accounts[5]
    jobs = [client.post(replace(TERMS, clock_seconds=1, slots=1), loose.job), client.post(replace(TERMS, slots=1), loose.job)]
    f = loose.market.contract.functions
    wrong, salt = b"\x66" * 32, b"\x01" * 32
    mined = loose.w3.eth.wait_for_transaction_receipt  # automine mines just after a send returns
    for jid in jobs:
        mined(f.join(jid).transact({"from": sybil, "value": TERMS.trainer_stake}))
        mined(f.commit(jid, commitment(wrong, ZERO32, salt, sybil)).transact({"from": sybil}))
    last = max(loose.market.job(j).terms.submission_deadline for j in jobs)
    increase_time(loose.w3, last - int(loose.w3.eth.get_block("latest")["timestamp"]) + 1)
    for jid in jobs:
        mined(f.reveal(jid, wrong, ZERO32, salt).transact({"from": sybil}))
    for _ in range(3):
        ch.tick()
    trap, sound = jobs
    assert ch.store.get("watch")[f"{trap}:0"]["state"] == "refused"
    assert len([m for m in lines if f"job {trap}: refused by my policy" in m]) == 1
    assert loose.market.slot(trap, 0).status == SlotStatus.REVEALED  # undisputed
    assert [int(e.args["jobId"]) for e in loose.market.logs("DisputeOpened", 0)] == [sound]


def test_a_bad_policy_file_is_refused_before_the_bot_connects(tmp_path: Path) -> None:
    """No node at the URL: the policy file is read while the arguments are parsed, so its own
    mistake is what the user hears (argparse's usage, then one error line naming --policy), not
    the connection error."""
    from tests.support.cli import run_cli

    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps({"min_window_block": 5}))
    for role, account, path, needle in (("trainer", "2", bad, "unknown fields ['min_window_block']"),
                                        ("challenger", "4", tmp_path / "none.json", "none.json")):
        r = run_cli(role, "run", "--account", account, "--policy", str(path), "--rpc-url", "http://127.0.0.1:1")
        errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert len(errors) == 1 and "argument --policy" in errors[0] and needle in errors[0], r.stderr
        assert "JSON-RPC" not in r.stderr

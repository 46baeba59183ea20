"""The bots on a job paid in an ERC-20 token (contracts/test/TestToken.sol, 18 decimals, "VTT").

The client posts the reward in the token, trainers stake it, the challenger bonds it: each payment
goes through ``Bot.pay`` (allowance read from the chain, ``approve`` through the crash-safe Sender
only when short, then the call with value 0). The end-to-end scenario kills three bots between
their approve and the payment that needs it and one before its approve is broadcast, rebuilds
them from their SQLite files, and checks that every party's token balance moved by exactly what
the protocol says while no ETH moved except gas.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from tests.support.bots import TERMS, World, finished, node_of
from verde_chain.agents import commands
from verde_chain.agents.bot import Bot
from verde_chain.agents.challenger import ChallengerBot
from verde_chain.agents.client import ClientBot, JobOffer
from verde_chain.agents.errors import CrashInjected, InsufficientFunds
from verde_chain.agents.policy import Policy
from verde_chain.agents.status import dispute_status, format_dispute, format_job, job_status
from verde_chain.agents.strategies import trainer_plan
from verde_chain.agents.tokens import ETH_INFO, TokenInfo, token_info
from verde_chain.agents.trainer import TrainerBot
from verde_chain.agents.wallet import account
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.market_client import Market
from verde_chain.chain.tx import transact
from verde_chain.dispute.types import Resolution
from verde_chain.job import Job
from verde_chain.market.marketparams import FAST, split_forfeit
from verde_chain.market.types import ETH, JobStatus, SlotStatus

pytestmark = pytest.mark.chain

FUNDS = 5 * 10**18  # 5 VTT minted to each funded party


class TokenWorld(World):
    """test_agents' World, paying in a token, with each bot's log kept (by bot name)."""

    token: Any
    logs: dict[str, list[str]]

    def make(self, role: str, index: int, strategy: str = "honest") -> Bot:
        name = f"{role}-{index}"
        cls = {"client": ClientBot, "trainer": TrainerBot, "challenger": ChallengerBot}[role]
        lines = self.logs.setdefault(name, [])
        bot: Bot = cls(self.w3, self.artifacts, self.cfg(name, index, strategy), log=lines.append)
        self.bots.append(bot)
        return bot

    def reborn(self, old: Bot) -> Bot:
        """A new bot object on the dead one's SQLite file (nothing of the old object is reused)."""
        old.close()
        self.bots.remove(old)
        return self.make(old.role, old.cfg.account_index, old.cfg.strategy)

    def balance(self, who: str) -> int:
        return int(self.token.functions.balanceOf(who).call())

    def approvals(self, owner: str, start: int) -> int:
        logs = self.token.events.Approval().get_logs(from_block=start, argument_filters={"owner": owner})
        return sum(1 for e in logs if e["args"]["spender"] == self.market.address)


@pytest.fixture
def tw(w3: Web3, artifacts: Any, deploy: Callable[..., Any], bundles: Path, tmp_path: Path,
       job: Job) -> TokenWorld:
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    token = deploy("TestToken")
    market = Market.deploy(w3, artifacts, game.address, FAST.with_token(token.address, FAST.floor(ETH)))
    world = TokenWorld(w3, artifacts, market, bundles, tmp_path, job)
    world.token = token
    world.policy = Policy(tokens=(ETH, token.address))
    world.logs = {}
    for i in (1, 2, 3, 4):
        transact(w3, world.token.functions.mint(account(i).address, FUNDS), artifacts)
    return world


def offer(tw: TokenWorld, **kw: Any) -> JobOffer:
    return JobOffer(**{**TERMS.__dict__, "token": tw.token.address, **kw})


def gas_spent_and_values(w3: Web3, who: str, start: int) -> tuple[int, list[int]]:
    """ETH `who` paid for gas in blocks start.., and the value of every transaction it sent."""
    gas, values = 0, []
    for n in range(start, w3.eth.block_number + 1):
        txs: list[Any] = list(w3.eth.get_block(n, full_transactions=True)["transactions"])
        for tx in txs:
            if tx["from"] == who:
                r = w3.eth.get_transaction_receipt(tx["hash"])
                gas += int(r["gasUsed"]) * int(r["effectiveGasPrice"])
                values.append(int(tx["value"]))
    return gas, values


def test_token_job_end_to_end_through_crashes(tw: TokenWorld) -> None:
    w3, t = tw.w3, offer(tw)
    start = w3.eth.block_number + 1
    parties: dict[int, Any] = {i: account(i).address for i in (1, 2, 3, 4)}
    eth0 = {a: w3.eth.get_balance(a) for a in parties.values()}
    tok0 = {a: tw.balance(a) for a in parties.values()}

    # The client dies after its approve is mined, with postJob signed but never broadcast.
    client = tw.make("client", 1)
    client.sender.crash_before_broadcast = "postJob"
    with pytest.raises(CrashInjected):
        client.post(t, tw.job)  # type: ignore[attr-defined]
    assert tw.market.job_count() == 0 and tw.approvals(parties[1], start) == 1
    client = tw.reborn(client)
    job_id = client.post(t, tw.job)  # type: ignore[attr-defined]

    honest, cheat = tw.make("trainer", 2), tw.make("trainer", 3, f"bitflip:2:{node_of(tw.job, 'matmul')}:1:3")
    ch = tw.make("challenger", 4)
    honest.sender.crash_before_broadcast = "join"  # dies between its approve and its stake
    ch.sender.crash_before_broadcast = "openDispute"  # ... and between its approve and its bond
    cheat.sender.crash_before_broadcast = "approve"  # dies with its approve signed, never broadcast
    armed, crashed = {honest.name, ch.name, cheat.name}, []
    while True:
        until = finished(client, job_id, tw.bots)  # type: ignore[arg-type]
        try:
            tw.run(until)
            break
        except CrashInjected:
            dead = next(b for b in tw.bots if b.name in armed and b.sender.crash_before_broadcast is False)
            armed.discard(dead.name)
            crashed.append(dead.name)
            tw.reborn(dead)
    assert sorted(crashed) == sorted([ch.name, honest.name, cheat.name])
    honest, cheat, ch = (next(b for b in tw.bots if b.name == n) for n in (honest.name, cheat.name, ch.name))
    client = next(b for b in tw.bots if b.name == "client-1")

    # each restart dropped the unsent payment and re-sent it once, without a second approve
    for bot, kind in ((client, "postJob"), (honest, "join"), (ch, "openDispute")):
        rows = [(r.kind, r.status) for r in bot.store.txs() if r.kind in ("approve", kind)]
        assert rows == [("approve", "mined"), (kind, "dropped"), (kind, "mined")], (bot.name, rows)
        assert any("dropped" in line for line in tw.logs[bot.name])
    rows = [(r.kind, r.status) for r in cheat.store.txs() if r.kind in ("approve", "join")]
    assert rows == [("approve", "dropped"), ("approve", "mined"), ("join", "mined")], rows
    for a in parties.values():  # one approve each, used up exactly by the one payment it was for
        assert tw.approvals(a, start) == 1, a
        assert tw.token.functions.allowance(a, tw.market.address).call() == 0, a
    assert len(tw.market.logs("JobPosted", start)) == 1 and len(tw.market.logs("TrainerJoined", start)) == 2
    assert len(tw.market.logs("DisputeOpened", start)) == 1

    # the honest side won
    (gid, rec), = ch.store.games().items()
    v = ch.games.game(gid)
    assert v.winner == ch.address and rec["won"] and v.resolution == Resolution.STEP
    assert tw.market.job(job_id).status == JobStatus.FINALIZED
    assert tw.market.job(job_id).accepted_result == trainer_plan("honest", tw.job).result()
    assert tw.market.slot(job_id, tw.market.slot_of(job_id, honest.address)).status == SlotStatus.SETTLED
    assert tw.market.slot(job_id, tw.market.slot_of(job_id, cheat.address)).status == SlotStatus.REJECTED

    # token books: the client paid the reward, the honest trainer got it (stake back), the cheater
    # lost its stake: half burned, half to the challenger (bond back); everything else was withdrawn
    burnt, paid = split_forfeit(t.trainer_stake, FAST.burn_bps)
    delta = {a: tw.balance(a) - tok0[a] for a in parties.values()}
    assert delta == {parties[1]: -t.reward, parties[2]: t.reward, parties[3]: -t.trainer_stake,
                     parties[4]: paid}
    assert tw.market.token_balance(t.token) == tw.market.total_owed(t.token) == tw.market.burned(t.token) == burnt
    assert tw.market.held(t.token, list(parties.values()), [gid]) == burnt
    assert all(tw.market.balance_of(a, t.token) == 0 for a in parties.values())

    # no ETH moved: every party's transactions carried value 0 and its ETH went only to gas
    assert w3.eth.get_balance(tw.market.contract.address) == 0 == tw.market.total_owed(ETH)
    for a in parties.values():
        gas, values = gas_spent_and_values(w3, a, start)
        assert values and set(values) == {0}, a
        assert eth0[a] - w3.eth.get_balance(a) == gas, a

    # status shows the token and amounts in token units
    st = job_status(tw.market, ch.games, job_id)
    assert st["token"] == {"address": t.token, "symbol": "VTT", "decimals": 18} and st["reward"] == t.reward
    text = format_job(st)
    assert f"paid in VTT ({t.token}, 18 decimals)" in text
    assert "reward 1 VTT (held 0 VTT), stake 0.2 VTT, min bond 0.1 VTT" in text
    assert "0.1 VTT" in text.split("winner")[1]  # the dispute's bond column
    assert "bond 0.1 VTT" in format_dispute(dispute_status(tw.market, ch.games, gid, 0))
    assert any("staked 0.2 VTT" in line for line in tw.logs[honest.name])
    assert any("withdrew 0.2 VTT" in line for line in tw.logs[ch.name])  # bond back + half the cheater's stake


def test_bots_without_enough_tokens_log_once_and_send_nothing(tw: TokenWorld) -> None:
    start = tw.w3.eth.block_number + 1
    # a client with no tokens at all: nothing is sent, the reason is clear
    poor_client = tw.make("client", 6)
    with pytest.raises(InsufficientFunds) as err:
        poor_client.post(offer(tw), tw.job)  # type: ignore[attr-defined]
    assert err.value.fields == {"token": tw.token.address, "need": 10**18, "have": 0}
    assert poor_client.store.txs() == [] and tw.market.job_count() == 0
    assert tw.logs["client-6"] == [(f"[client-6] cannot afford postJob: it needs 1 VTT but {poor_client.address} "
                                    "holds 0 VTT; nothing sent (fund the account to proceed)")]

    # a trainer one wei short of the stake: logs once, sends nothing, joins once funded
    client = tw.make("client", 1)
    job_id = client.post(offer(tw), tw.job)  # type: ignore[attr-defined]
    short = account(5).address
    transact(tw.w3, tw.token.functions.mint(short, TERMS.trainer_stake - 1), tw.artifacts)
    trainer = tw.make("trainer", 5)
    assert [trainer.tick() for _ in range(3)] == [False, False, False]
    assert trainer.store.txs() == [] and tw.approvals(short, start) == 0 and tw.market.job(job_id).slots_taken == 0
    assert [line for line in tw.logs["trainer-5"] if "cannot afford" in line] == [
        (f"[trainer-5] cannot afford join: it needs 0.2 VTT but {short} holds 0.199999999999999999 VTT; "
         "nothing sent (fund the account to proceed)")]
    transact(tw.w3, tw.token.functions.mint(short, 1), tw.artifacts)
    assert trainer.tick()
    assert [r.kind for r in trainer.store.txs()] == ["approve", "join"]
    assert tw.market.slot(job_id, 0).trainer == short and tw.balance(short) == 0

    # it never commits: after the deadlines the client finalizes and withdraws, in the token, the
    # refunded reward and the unburned half of the no-show's stake
    deadline = tw.market.job(job_id).terms.challenge_deadline
    increase_time(tw.w3, deadline - int(tw.w3.eth.get_block("latest")["timestamp"]) + 1)
    assert client.tick() and (client.store.job(job_id) or {}).get("state") == "done"
    burnt, paid = split_forfeit(TERMS.trainer_stake, FAST.burn_bps)
    assert tw.balance(client.address) == FUNDS + paid
    assert tw.market.token_balance(tw.token.address) == tw.market.total_owed(tw.token.address) == burnt
    assert any("withdrew 1.1 VTT" in line for line in tw.logs["client-1"])


def test_token_units_and_tokens_without_metadata(tw: TokenWorld) -> None:
    assert ETH_INFO.format(2 * 10**17) == "0.2 ETH" and ETH_INFO.format(3 * 10**18) == "3 ETH"
    six = TokenInfo("0x" + "11" * 20, "USDC", 6)
    assert six.format(1_500_000) == "1.5 USDC" and six.format(1) == "0.000001 USDC" and six.format(0) == "0 USDC"
    assert TokenInfo("0x" + "11" * 20, "X", 0).format(42) == "42 X"
    assert token_info(tw.w3, tw.artifacts, tw.token.address) == TokenInfo(tw.token.address, "VTT", 18)
    # a "token" with neither decimals() nor symbol() (the market itself): raw units, named by address
    bare = token_info(tw.w3, tw.artifacts, tw.market.address)
    assert bare.decimals is None and bare.symbol.startswith(tw.market.address[:8])
    assert bare.format(1234) == f"1234 {bare.symbol} (raw units)"


def test_client_command_takes_a_token_address() -> None:
    p = argparse.ArgumentParser()
    commands.configure_client(p)
    addr = "0x" + "ab" * 20
    assert p.parse_args([]).token == ETH
    assert p.parse_args(["--token", addr]).token == Web3.to_checksum_address(addr)
    assert p.parse_args(["--token", "ETH"]).token == ETH
    with pytest.raises(SystemExit):
        p.parse_args(["--token", "0x1234"])


def test_challenger_without_bond_waits_without_re_executing(tw: TokenWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """A challenger that finds a wrong result but cannot afford the bond logs once, sends nothing,
    does not redo its re-execution on every poll, and disputes once funded (window still open)."""
    import verde_chain.agents.workers as workers_mod  # the bots' one way to train a plan (Bot.train)

    runs: list[int] = []
    real_train = workers_mod.train

    def counting_train(plan: Any, progress: Any) -> bytes:
        runs.append(1)
        return real_train(plan, progress)

    client = tw.make("client", 1)
    job_id = client.post(offer(tw, slots=1), tw.job)  # type: ignore[attr-defined]
    cheat = tw.make("trainer", 3, f"bitflip:2:{node_of(tw.job, 'matmul')}:1:3")
    cheat.tick()
    cheat.tick()
    assert tw.market.slot(job_id, 0).status == SlotStatus.COMMITTED
    increase_time(tw.w3, tw.market.job(job_id).terms.submission_deadline - tw.w3.eth.get_block("latest")["timestamp"] + 1)
    cheat.tick()
    assert tw.market.slot(job_id, 0).status == SlotStatus.REVEALED
    monkeypatch.setattr(workers_mod, "train", counting_train)  # from here on: the challenger's re-executions
    ch = tw.make("challenger", 6)  # holds no VTT
    assert [ch.tick() for _ in range(3)] == [False, False, False]
    assert ch.store.txs() == [] and len(runs) == 1
    assert len([line for line in tw.logs["challenger-6"] if "cannot afford openDispute" in line]) == 1
    transact(tw.w3, tw.token.functions.mint(ch.address, TERMS.min_challenge_bond), tw.artifacts)
    assert ch.tick() and len(runs) == 1
    assert [r.kind for r in ch.store.txs()] == ["approve", "openDispute"]
    (ev,) = tw.market.logs("DisputeOpened", 0)
    assert ev.args["challenger"] == ch.address and ev.args["bond"] == TERMS.min_challenge_bond
    assert tw.balance(ch.address) == 0

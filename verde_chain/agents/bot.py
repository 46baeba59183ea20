"""The bots' common machinery: event cursor, transaction sending, and playing dispute games.

A bot is driven by ``tick()``: one pass that reads new market events (block range since the last
processed block, persisted), advances every job and game it is part of from the chain's *views*
(never from remembered intentions, so a restart re-derives what is left to do), and returns
whether it did anything. ``run()`` loops ``tick()`` with a poll interval and backoff on RPC errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from web3 import Web3
from web3.types import TxReceipt

from verde_chain.agents.catalog import Bundles
from verde_chain.agents.errors import AgentError, InsufficientFunds
from verde_chain.agents.resume import resume_lines
from verde_chain.agents.store import Store
from verde_chain.agents.strategies import Plan
from verde_chain.agents.tokens import TokenInfo, erc20, is_eth, token_info
from verde_chain.agents.wallet import Sender, account, retry
from verde_chain.chain.compile import Artifact
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.types import GameView, Move, Phase, Seen, Side
from verde_chain.errors import ChainError, ContractRevert
from verde_chain.market.types import MarketEvent

Log = Callable[[str], None]
LOG_RANGE = 2_000  # blocks per eth_getLogs query
TIMEOUT_GAS = 400_000  # claimTimeout + the market's settlement callback, with room to spare


@dataclass(frozen=True)
class BotConfig:
    rpc_url: str
    market: str
    account_index: int
    db: str
    bundles: str
    strategy: str = "honest"
    seed: int = 0
    name: str = ""
    start_block: int = 0


class Bot:
    role = "bot"
    EVENTS: tuple[str, ...] = ()

    def __init__(self, w3: Web3, artifacts: Mapping[str, Artifact], cfg: BotConfig, log: Log | None = None) -> None:
        self.w3 = w3
        self.artifacts = artifacts
        self.cfg = cfg
        self.name = cfg.name or f"{self.role}-{cfg.account_index}"
        self.log_fn = log or (lambda msg: print(msg, flush=True))
        self.store = Store(cfg.db)
        saved = self.store.get("config")
        if saved is not None and (saved["market"], saved["account_index"]) != (cfg.market, cfg.account_index):
            raise AgentError(f"{cfg.db} belongs to account {saved['account_index']} on market {saved['market']}")
        self.store.put("config", cfg.__dict__)
        self.acct = account(cfg.account_index)
        self.address = self.acct.address
        self.sender = Sender(w3, artifacts, self.acct, self.store)
        self.market = Market.at(w3, artifacts, cfg.market)
        game_addr = Web3.to_checksum_address(retry(self.market.game_address))
        game = w3.eth.contract(address=game_addr, abi=artifacts["DisputeGame"].abi)
        self.games = DisputeGameClient(w3, game, artifacts)
        self.bundles = Bundles(cfg.bundles)
        self.plans: dict[int, Plan] = {}  # job id -> what this bot believes (rebuilt after a restart)
        self._tokens: dict[str, TokenInfo] = {}
        self._said: set[str] = set()  # messages already logged once (see `log_once`)
        dropped = self.sender.recover()
        if dropped:
            self.log(f"restart: {len(dropped)} signed-but-unsent transaction(s) dropped; re-deriving from chain state")
        for line in resume_lines(self):
            self.log(line)

    def log(self, msg: str) -> None:
        self.log_fn(f"[{self.name}] {msg}")

    def log_once(self, key: str, msg: str) -> None:
        """Log `msg` the first time `key` comes up in this process (a condition re-checked on every
        tick, such as an unaffordable stake, is reported once instead of once a poll)."""
        if key not in self._said:
            self._said.add(key)
            self.log(msg)

    def token(self, token: str) -> TokenInfo:
        if token not in self._tokens:
            self._tokens[token] = token_info(self.w3, self.artifacts, token)
        return self._tokens[token]

    def units(self, token: str, amount: int) -> str:
        """`amount` of `token` for a log line, in whole units (e.g. "0.2 VTT")."""
        return self.token(token).format(amount)

    # -- chain reading ----------------------------------------------------------------------------
    def now(self) -> int:
        """The chain's notion of now: the latest block's timestamp, or the wall clock if that is
        later (on a quiet dev chain no block is mined while everyone waits for a deadline, but
        the next block will carry the current time)."""
        return max(int(retry(lambda: self.w3.eth.get_block("latest"))["timestamp"]), int(time.time()))

    def poll(self) -> list[MarketEvent]:
        """New market events of the kinds this bot follows, oldest first; the cursor only moves
        after the caller handled them (``commit_cursor``), so a crash replays, never skips."""
        start = int(self.store.get("last_block", self.cfg.start_block - 1)) + 1
        latest = int(retry(lambda: self.w3.eth.block_number))
        self._pending_cursor = latest
        if start > latest:
            return []
        out: list[MarketEvent] = []
        for lo in range(start, latest + 1, LOG_RANGE):  # providers cap the block range of eth_getLogs
            hi = min(latest, lo + LOG_RANGE - 1)
            for name in self.EVENTS:
                out += retry(lambda n=name, a=lo, b=hi: self.market.logs(n, a, b))  # type: ignore[misc]
        return sorted(out, key=lambda e: (e.block, e.log_index))

    def commit_cursor(self) -> None:
        self.store.put("last_block", self._pending_cursor)

    def tick(self) -> bool:
        raise NotImplementedError

    def run(self, poll_interval: float = 1.0, stop: Callable[[], bool] = lambda: False,
            max_ticks: int | None = None) -> None:
        """Tick until `stop()`; transient failures back off exponentially (up to 30 s)."""
        backoff = poll_interval
        n = 0
        while not stop() and (max_ticks is None or n < max_ticks):
            n += 1
            try:
                busy = self.tick()
                backoff = poll_interval
            except (ChainError, requests.RequestException, OSError) as exc:
                self.log(f"error: {type(exc).__name__}: {exc}; retrying in {backoff:.1f}s")
                time.sleep(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            if not busy:
                time.sleep(poll_interval)

    # -- jobs -------------------------------------------------------------------------------------
    def plan(self, job_id: int) -> Plan:
        raise NotImplementedError

    def _withdraw(self, token: str) -> bool:
        owed = retry(lambda: self.market.balance_of(self.address, token))
        if owed == 0:
            return False
        self.sender.send(self.market.contract.functions.withdraw(token), "withdraw")
        self.log(f"withdrew {self.units(token, owed)}")
        return True

    # -- payments ---------------------------------------------------------------------------------
    def pay(self, fn_call: Any, kind: str, token: str, amount: int, **send: Any) -> TxReceipt:
        """Send a market call that takes `amount` of `token` from this account (postJob's reward,
        join's stake, openDispute's bond): with ``value=amount`` for ETH; for a token, first make
        sure the market may pull `amount` (``approve`` through the same crash-safe Sender, kind
        "approve", only if the allowance falls short), then the call itself with value 0.

        Nothing here is remembered between calls: the allowance is read from the chain each time.
        So a restart after the approve is mined (whether or not the paying call was signed) finds
        the allowance in place and sends only the call; a restart before it was broadcast finds
        the row dropped and the allowance short, and approves once. The market pulls exactly
        `amount` per call and the caller re-derives whether the call is still needed from chain
        state, so nothing is paid twice. An allowance left by a call that then reverted is simply
        reused by the next payment.

        Raises ``InsufficientFunds`` (after logging it once) without sending anything when the
        account holds less than `amount`; reverts surface as ``ContractRevert`` as for any send."""
        self.sender.recover()  # an approve still in flight from before a restart counts once mined
        if is_eth(token):
            have = int(retry(lambda: self.w3.eth.get_balance(self.address)))
            self._afford(kind, token, amount, have)
            return self.sender.send(fn_call, kind, value=amount, **send)
        c = erc20(self.w3, self.artifacts, token)
        have = int(retry(lambda: c.functions.balanceOf(self.address).call()))
        self._afford(kind, token, amount, have)
        allowed = int(retry(lambda: c.functions.allowance(self.address, self.market.address).call()))
        if allowed < amount:
            try:
                self.sender.send(c.functions.approve(self.market.address, amount), "approve")
            except ContractRevert:
                if allowed == 0:
                    raise
                # Some tokens (USDT-style) refuse to change one non-zero allowance into another:
                # clear it first. Both steps are re-derived from the allowance after a restart.
                self.sender.send(c.functions.approve(self.market.address, 0), "approve")
                self.sender.send(c.functions.approve(self.market.address, amount), "approve")
            self.log(f"approved the market to take {self.units(token, amount)} for {kind}")
        return self.sender.send(fn_call, kind, **send)

    def _afford(self, kind: str, token: str, amount: int, have: int) -> None:
        if have >= amount:
            return
        msg = (f"cannot afford {kind}: it needs {self.units(token, amount)} but {self.address} holds "
               f"{self.units(token, have)}; nothing sent (fund the account to proceed)")
        self.log_once(f"afford:{kind}:{token}:{amount}:{have}", msg)
        raise InsufficientFunds(msg, token=token, need=amount, have=have)

    # -- games ------------------------------------------------------------------------------------
    def add_game(self, ev: MarketEvent) -> None:
        a = ev.args
        gid = int(a["gameId"])
        if self.store.game(gid) is not None:
            return
        role = "defender" if a["defender"] == self.address else "challenger"
        self.store.update_game(gid, job_id=int(a["jobId"]), role=role, slot=int(a["defenderSlot"]),
                               block=ev.block, done=False)
        other = a["challenger"] if role == "defender" else a["defender"]
        self.log(f"game {gid} (job {a['jobId']}, slot {a['defenderSlot']}): I am the {role} against {other}")

    def play_games(self) -> bool:
        acted = False
        for gid, rec in self.store.games().items():
            if rec.get("done"):
                continue
            v = retry(lambda g=gid: self.games.game(g))  # type: ignore[misc]
            if v.phase == Phase.RESOLVED:
                won = v.winner == self.address
                self.store.update_game(gid, done=True, won=won, resolution=v.resolution.name)
                self.log(f"game {gid} resolved by {v.resolution.name}: {'I won' if won else 'I lost'}")
                continue
            if v.to_move == self.address:
                acted |= self._move(gid, rec, v)
            else:
                acted |= self._timeout_or_step(gid, rec, v)
        return acted

    def _silent(self, gid: int, rec: dict[str, Any]) -> bool:
        limit = self.plan(rec["job_id"]).silent_after
        if limit is not None and self.store.moves(gid) >= limit:
            if not rec.get("went_silent"):
                self.store.update_game(gid, went_silent=True)
                self.log(f"game {gid}: going silent after {limit} moves")
            return True
        return False

    def _player(self, rec: dict[str, Any]) -> pl.Defender | pl.Challenger:
        p = self.plan(rec["job_id"])
        cls = pl.Defender if rec["role"] == "defender" else pl.Challenger
        return cls(p.world, p.style, self.cfg.seed)

    def seen(self, gid: int, rec: dict[str, Any]) -> Seen:
        """The last claims and chunk posted in the game, from its event log (read afresh each
        move, so a restarted bot continues where the game stands)."""
        return retry(lambda: runner.seen_from_history(self.games, gid, int(rec.get("block", 0))))

    def _move(self, gid: int, rec: dict[str, Any], v: GameView) -> bool:
        if self._silent(gid, rec):
            return False
        position = f"{v.phase.name}:{v.lo}:{v.hi}:{v.cursor}:{v.depth_left}"
        if rec.get("failed_at") == position:
            return False  # this move already reverted here; wait (the clock decides)
        move = self._player(rec).move(v, self.seen(gid, rec))
        if move is None:
            return False
        try:
            self.send_move(gid, move, v.phase.level)
        except ContractRevert as exc:
            self.store.update_game(gid, failed_at=position, last_error=exc.name)
            self.log(f"game {gid}: my {type(move).__name__} at {v.phase.name} reverted: {exc.name}")
            return False
        # what this bot claimed/chose where (the signed transactions themselves are in `txs`)
        self.store.update_game(gid, last_move=type(move).__name__, last_position=position,
                               last_choice=getattr(move, "choice", getattr(move, "element", None)))
        return True

    def _timeout_or_step(self, gid: int, rec: dict[str, Any], v: GameView) -> bool:
        mover_left = v.defender_left if v.phase.mover == Side.DEFENDER else v.challenger_left
        if self.now() - v.turn_started_at > mover_left:
            try:
                self.sender.send(self.games.contract.functions.claimTimeout(gid), "claimTimeout", game_id=gid,
                                 gas=TIMEOUT_GAS)
                self.log(f"game {gid}: the other side ran out of clock; claimed the timeout")
                return True
            except ContractRevert as exc:
                if rec.get("timeout_error") != exc.name:
                    self.store.update_game(gid, timeout_error=exc.name)
                    self.log(f"game {gid}: claimTimeout reverted: {exc.name}")
                return False
        if v.phase == Phase.L4_STEP and rec["role"] == "challenger" and not self._silent(gid, rec):
            # Anyone may execute the last step; a challenger whose own state j+1 differs from the
            # defender's claim does so at once instead of waiting for the defender's clock.
            p = self.plan(rec["job_id"])
            if keccak256(p.world.micro_state(v.step, v.node_index, v.element, v.lo + 1)) == v.claim_hi:
                return False
            move = pl.step_move(p.world, v)
            if move is None or rec.get("failed_at") == "step":
                return False
            try:
                self.send_move(gid, move, 4)
                return True
            except ContractRevert as exc:
                self.store.update_game(gid, failed_at="step", last_error=exc.name)
                self.log(f"game {gid}: my step reverted: {exc.name}")
        return False

    def send_move(self, gid: int, move: Move, level: int) -> None:
        """Send `move` through the crash-safe Sender (the same call the runner's client makes)."""
        self.sender.send(self.games.move_call(gid, move), move.function, game_id=gid, level=level)

    def close(self) -> None:
        self.store.close()


def default_db(directory: str | Path, name: str) -> str:
    return str(Path(directory) / f"{name}.sqlite")

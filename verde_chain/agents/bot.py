"""The bots' common machinery: event cursor, transaction sending, and playing dispute games.

A bot is driven by ``tick()``: one pass that reads new market events (block range since the last
processed block, persisted), advances every job and game it is part of from the chain's *views*
(never from remembered intentions, so a restart re-derives what is left to do), and returns
whether it did anything. ``run()`` loops ``tick()`` with a poll interval and backoff on RPC errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests
from eth_typing import HexStr
from web3 import Web3
from web3.types import TxReceipt

from verde_chain.agents.catalog import Bundles
from verde_chain.agents.errors import AgentError, InsufficientFunds
from verde_chain.agents.policy import Conditions, Policy, block_interval, bond_refusal, refusal
from verde_chain.agents.resume import resume_lines
from verde_chain.agents.store import OPEN_TX, Store, TxRow
from verde_chain.agents.strategies import Plan, ProgressFn
from verde_chain.agents.tokens import TokenInfo, erc20, is_eth, token_info
from verde_chain.agents.wallet import Call, Sender, account, retry
from verde_chain.chain.compile import Artifact
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.types import GameView, Move, Phase, Seen
from verde_chain.errors import ChainError, ContractRevert, VerdeError
from verde_chain.job import Job
from verde_chain.market.types import JobTerms, MarketEvent

Log = Callable[[str], None]
LOG_RANGE = 2_000  # blocks per eth_getLogs query
LATENCY_SAMPLES = 32  # recent moves whose clock cost the policy looks at
POOL_THREADS = 8  # games read and moves computed at once (mostly waiting on the node)
MOVE_COMPUTE = 1.0  # seconds assumed to compute and submit a move before any was measured
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
    policy: Policy = field(default_factory=Policy)
    bundle_url: str = ""  # client: where `bundles serve` publishes its bundles (the jobs' bundleUri base)
    workers: int = 1  # trainer/challenger: processes a sharded job trains on (`train --workers`)


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
        self.store.put("config", asdict(cfg))
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
        self._burn_bps: int | None = None
        self._timestamps: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix=self.name)
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
        return max(self.block_time(), int(time.time()))

    def block_time(self) -> int:
        """The latest block's timestamp (what a transaction sent now is checked against at least)."""
        return int(retry(lambda: self.w3.eth.get_block("latest"))["timestamp"])

    def timestamp_of(self, block: int) -> int:
        """A mined block's timestamp (remembered: a pass's moves mostly share a few blocks)."""
        if block not in self._timestamps:
            if len(self._timestamps) > 1_024:
                self._timestamps.clear()
            self._timestamps[block] = int(retry(lambda: self.w3.eth.get_block(block))["timestamp"])
        return self._timestamps[block]

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


    def train(self, plan: Plan, spec_hash: bytes, progress: ProgressFn | None) -> bytes:
        """The plan's result, trained on ``cfg.workers`` processes where the job allows
        (``agents/workers.py``; the run's checkpoints kept beside this bot's database)."""
        from verde_chain.agents.workers import train_on_workers

        job = self.bundles.fetch(spec_hash)
        run_dir = Path(self.cfg.db).parent / "runs" / self.name / spec_hash.hex()
        return train_on_workers(plan, self.bundles.root / spec_hash.hex(), job.spec.shards, self.cfg.workers, run_dir,
                                progress)
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

    # -- policy -----------------------------------------------------------------------------------
    def conditions(self) -> Conditions:
        """What the policy compares a job with, measured now: the block interval (last 10 blocks),
        the gas price, the market's burn share, and the clock one move of this bot costs: the mean
        of its recent moves (a chess clock adds them up), at least one block interval (its move
        goes into the block after the other side's) plus a second to compute and submit it."""
        latest = retry(lambda: self.w3.eth.get_block("latest"))
        first = max(0, int(latest["number"]) - 10)
        stamps = [int(retry(lambda n=n: self.w3.eth.get_block(n))["timestamp"])  # type: ignore[misc]
                  for n in range(first, int(latest["number"]))] + [int(latest["timestamp"])]
        interval = block_interval(stamps)
        if self._burn_bps is None:
            self._burn_bps = retry(lambda: self.market.params()).burn_bps
        charges = self.store.get("move_charges", [])
        latency = max(interval + MOVE_COMPUTE, sum(charges) / len(charges) if charges else 0.0)
        return Conditions(now=self.now(), block_interval=interval, gas_price=int(retry(lambda: self.w3.eth.gas_price)),
                          burn_bps=self._burn_bps, move_latency=latency)

    def refuses(self, job_id: int, terms: JobTerms, job: Job | None, what: str) -> str | None:
        """The policy's reason not to `what` (stake, dispute) in this job, logged once; or None."""
        why = refusal(terms, self.cfg.policy, self.conditions(), job, "trainer" if self.role == "trainer" else
                      "challenger")
        if why is not None:
            self.log_once(f"policy:{job_id}:{why}", f"job {job_id}: refused by my policy, not {what}: {why}")
        return why

    def refuses_bond(self, job_id: int, bond: int) -> str | None:
        why = bond_refusal(bond, self.cfg.policy)
        if why is not None:
            self.log_once(f"bond:{job_id}:{bond}", f"job {job_id}: refused by my policy, not disputing: {why}")
        return why

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
        """Play every open game at once. First settle the moves mined since the last pass; then,
        most urgent clock first, submit this bot's move (or a timeout claim, or the challenger's
        step) in every game where one is due and none of ours is in flight. Nothing waits for a
        receipt (``Sender.submit`` pipelines the nonces), so one pass's moves all go into the next
        block however many games run: a game's clock never waits on another game. The views are
        read, and the moves computed and priced (``eth_estimateGas``), on a few threads; the
        moves are then signed and broadcast in order of urgency on this one."""
        self.sender.poll()  # once per pass: every move mined since is settled below
        with self.store.batch():
            open_games = {gid: rec for gid, rec in self.store.games().items()
                          if not rec.get("done") and self._settle(gid, rec)}  # False: a move still in flight
        views = dict(zip(open_games, self._pool.map(lambda g: retry(lambda: self.games.game(g)), open_games),
                         strict=True))
        live: list[tuple[int, dict[str, Any], GameView]] = []
        for gid, v in views.items():
            if v.phase == Phase.RESOLVED:
                won = v.winner == self.address
                self.store.update_game(gid, done=True, won=won, resolution=v.resolution.name)
                self.log(f"game {gid} resolved by {v.resolution.name}: {'I won' if won else 'I lost'}")
                continue
            live.append((gid, self.store.game(gid) or open_games[gid], v))
        live.sort(key=lambda t: (t[2].to_move != self.address, t[2].expires_at))
        turns = [(gid, rec, v, self._player(rec)) for gid, rec, v in live
                 if v.to_move == self.address and self._may_move(gid, rec, v)]
        acted = self._send_moves(turns, list(self._pool.map(self._prepare, turns)))
        now = self.now()  # once a pass, not once a game
        for gid, rec, v in live:
            if v.to_move != self.address:
                acted |= self._timeout_or_step(gid, rec, v, now)
        return acted

    def _settle(self, gid: int, rec: dict[str, Any]) -> bool:
        """Record how this game's last submitted transaction ended; False while it is in flight."""
        inflight = rec.get("inflight")
        if inflight is None:
            return True
        row = self.store.tx(int(inflight["row"]))
        if row.status in OPEN_TX:
            return False
        what = inflight["what"]
        if row.status == "mined":
            self.store.update_game(gid, inflight=None)
            if "turn" in inflight:  # the clock this move cost: its block's time - the turn's start
                block = self.sender.mined_at.get(row.id) or int(
                    retry(lambda: self.w3.eth.get_transaction_receipt(HexStr(row.hash)))["blockNumber"])
                spent = self.timestamp_of(block) - int(inflight["turn"])
                self.store.put("move_charges", [*self.store.get("move_charges", []), spent][-LATENCY_SAMPLES:])
            if what == "claimTimeout":
                self.log(f"game {gid}: the other side ran out of clock; claimed the timeout")
            return True
        if row.status == "dropped":  # it never reached a block: worked out and sent again next pass
            self.store.update_game(gid, inflight=None)
            self.log(f"game {gid}: my {what} was dropped ({row.error}); sending it again")
            return True
        # failed (its revert decoded from its own block): remembered with its position so it is
        # not retried there; the clock then decides
        err = row.error or "UnknownRevert"
        if what == "claimTimeout":
            self.store.update_game(gid, inflight=None, timeout_error=err)
            self.log(f"game {gid}: claimTimeout reverted: {err}")
        else:
            self.store.update_game(gid, inflight=None, failed_at=inflight["position"], last_error=err)
            self.log(f"game {gid}: my {what} at {inflight['position']} failed: {err}")
        return True

    def _submit(self, gid: int, fn_call: Any, what: str, position: str, level: int, gas: int | None = None) -> bool:
        """Submit one game transaction (pipelined) and remember it as the game's move in flight.
        A revert of its estimate raises ``ContractRevert``."""
        (row,) = self.sender.submit_many([Call(fn_call, what, game_id=gid, level=level, gas=gas)])
        if isinstance(row, ContractRevert):
            raise row
        return self._in_flight(gid, row, what, position)

    def _in_flight(self, gid: int, row: TxRow | VerdeError, what: str, position: str, turn: int | None = None) -> bool:
        """Remember a submitted row as the game's transaction in flight (with `turn`, the start of
        this bot's turn: once mined, its clock cost is measured). A transaction the node refused
        is logged and retried on the next pass; the other games go on."""
        if isinstance(row, VerdeError):
            self.log(f"game {gid}: {row}; retrying on the next pass")
            return False
        inflight: dict[str, Any] = {"row": row.id, "what": what, "position": position}
        if turn is not None:
            inflight["turn"] = turn
        self.store.update_game(gid, inflight=inflight)
        return True

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

    @staticmethod
    def _position(v: GameView) -> str:
        return f"{v.phase.name}:{v.lo}:{v.hi}:{v.cursor}:{v.depth_left}"

    def _may_move(self, gid: int, rec: dict[str, Any], v: GameView) -> bool:
        # a move that already failed at this position is not retried there: the clock decides
        return not self._silent(gid, rec) and rec.get("failed_at") != self._position(v)

    def _prepare(self, turn: tuple[int, dict[str, Any], GameView, pl.Defender | pl.Challenger]
                 ) -> tuple[Move, Any, int] | ContractRevert | None:
        """This bot's move in one game, its call and its gas estimate (on a worker thread: reads
        the chain and computes, touches no state); the revert if the estimate fails."""
        gid, rec, v, player = turn
        move = player.move(v, self.seen(gid, rec))
        if move is None:
            return None
        fn_call = self.games.move_call(gid, move)
        try:
            return move, fn_call, self.sender.estimate(fn_call)
        except ContractRevert as exc:
            return exc

    def _send_moves(self, turns: list[tuple[int, dict[str, Any], GameView, Any]],
                    prepared: list[tuple[Move, Any, int] | ContractRevert | None]) -> bool:
        """Submit the prepared moves as one batch (in the order of `turns`: most urgent first)."""
        calls: list[Call] = []
        sent: list[tuple[int, GameView, Move]] = []
        for (gid, _, v, _), p in zip(turns, prepared, strict=True):
            if isinstance(p, ContractRevert):
                self.store.update_game(gid, failed_at=self._position(v), last_error=p.name)
                self.log(f"game {gid}: my move at {v.phase.name} reverted: {p.name}")
            elif p is not None:
                move, fn_call, gas = p
                calls.append(Call(fn_call, move.function, game_id=gid, level=v.phase.level, gas=gas))
                sent.append((gid, v, move))
        if not calls:
            return False
        rows = self.sender.submit_many(calls)  # its own store transaction, committed before any broadcast
        with self.store.batch():
            for (gid, v, move), row in zip(sent, rows, strict=True):
                if self._in_flight(gid, row, move.function, self._position(v), v.turn_started_at):
                    # what this bot claimed/chose where (the signed transactions themselves are in `txs`)
                    self.store.update_game(gid, last_move=type(move).__name__, last_position=self._position(v),
                                           last_choice=getattr(move, "choice", getattr(move, "element", None)))
        return True

    def _timeout_or_step(self, gid: int, rec: dict[str, Any], v: GameView, now: int) -> bool:
        if now > v.expires_at:
            if rec.get("timeout_error") and self.block_time() <= v.expires_at:
                return False  # it failed on a stale view: retried once a block past the expiry exists
            # a fixed gas limit, no estimate: the latest block may predate the expiry (a failure is
            # named from its own block when it is settled)
            return self._submit(gid, self.games.contract.functions.claimTimeout(gid), "claimTimeout", "timeout", 0,
                                gas=TIMEOUT_GAS)
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
                return self._submit(gid, self.games.move_call(gid, move), move.function, "step", 4)
            except ContractRevert as exc:
                self.store.update_game(gid, failed_at="step", last_error=exc.name)
                self.log(f"game {gid}: my step reverted: {exc.name}")
        return False

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()


def default_db(directory: str | Path, name: str) -> str:
    return str(Path(directory) / f"{name}.sqlite")

"""The explorer's one window on the chain: every job and dispute of a JobMarket as JSON-ready dicts.

Everything here is read through the typed clients (``chain/market_client.py``,
``chain/dispute_client.py``) and the views the CLI already has (``agents/status.py`` for jobs
and disputes, ``agents/trace.py`` for the interval of every level); this module only adds what
a live page needs on top:

* who moved and when: every DisputeGame event carries ``gameId`` as its first indexed topic, so
  one ``eth_getLogs`` per refresh finds the blocks and transactions of a game's moves; the
  game's state after each of those blocks is ``trace.game_trace`` at that block, and the
  per-level narrowing is ``trace.narrowing`` of those states;
* gas per party (the moves' receipts) and the chess clocks against the chain's own time (the
  pending block's timestamp: what the next move would be charged against);
* the end: the node's label from the job bundle (the chain holds only commitments) and the one
  instruction the referee executed, decoded from the ``step`` call (``instruction.py``);
* market fields shown generically (every field of the spec, every slot field, every market event
  of the job), so new market phases appear without changes here.

Incremental and restart-proof: logs are read from the last block seen; if the head goes back or
the block we saw last changed hash (a restarted chain, a reorg), every cache is dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eth_typing import HexStr
from web3 import Web3
from web3.exceptions import BlockNotFound

from verde_chain.agents.commands import connect_market
from verde_chain.agents.endpoint import check_market
from verde_chain.agents.status import dispute_status, job_status
from verde_chain.agents.trace import game_trace, interval, narrowing
from verde_chain.chain.compile import Artifact
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import EVENT_NAMES as MARKET_EVENTS
from verde_chain.chain.market_client import Market, MarketEvent
from verde_chain.dispute.clock import ChessClockModel
from verde_chain.dispute.types import GameView, Phase, Resolution, Side
from verde_chain.errors import VerdeError
from verde_chain.explorer.instruction import explain_step, f32

if TYPE_CHECKING:
    from verde_chain.agents.catalog import Bundles
    from verde_chain.job import Job

MAX_SAFE_INT = 2**53 - 1  # larger integers travel as strings (JavaScript numbers are doubles)
BUNDLE_RETRY_S = 15.0
LEVEL_NAMES = {1: "training steps", 2: "graph nodes", 3: "output elements", 4: "micro-steps"}


def jsonable(x: Any) -> Any:
    """Plain JSON: enums by name, bytes as 0x-hex, integers beyond 2**53 as decimal strings."""
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, bool) or x is None or isinstance(x, float | str):
        return x
    if isinstance(x, int):
        return x if -MAX_SAFE_INT <= x <= MAX_SAFE_INT else str(x)
    if isinstance(x, bytes | bytearray):
        return "0x" + bytes(x).hex()
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return str(x)


class _GameLog:
    """What is known of one game so far: its state after every block with one of its events."""

    def __init__(self) -> None:
        self.next_block = 0
        self.trace: list[tuple[int, GameView]] = []
        self.moves: list[dict[str, Any]] = []
        self.step_call: tuple[bytes, bytes, bytes] | None = None


class ChainView:
    """Read-only view of one JobMarket and its DisputeGame. Not thread-safe: one follower owns it."""

    def __init__(self, w3: Web3, artifacts: Mapping[str, Artifact], market: str, rpc_url: str,
                 bundles: Path | None = None) -> None:
        self.w3 = w3
        self.artifacts = artifacts
        self.rpc_url = rpc_url
        self.market = Market.at(w3, artifacts, market)
        self.bundles_dir = bundles
        self._bundles: Bundles | None = None
        self._bundle_failed: dict[bytes, tuple[float, str]] = {}  # spec hash -> (when, why), retried later
        self._games: DisputeGameClient | None = None
        self._reset()

    @classmethod
    def open(cls, args: argparse.Namespace) -> ChainView:
        """From ``--rpc-url`` / ``--market`` / ``--bundles``: every bad input is one clear error."""
        w3, artifacts, market = connect_market(args)  # every bad argument is one line (agents/endpoint.py)
        return cls(w3, artifacts, market, args.rpc_url, args.bundles)

    def _reset(self) -> None:
        self._seen: tuple[int, bytes] | None = None
        self._events: list[MarketEvent] = []
        self._events_next = 0
        self._logs: dict[int, _GameLog] = {}
        self._times: dict[int, int] = {}
        self._games = None

    # -- chain ----------------------------------------------------------------------------------------

    @property
    def games(self) -> DisputeGameClient:
        if self._games is None:
            addr = Web3.to_checksum_address(self.market.game_address())
            self._games = DisputeGameClient(
                self.w3, self.w3.eth.contract(address=addr, abi=self.artifacts["DisputeGame"].abi), self.artifacts)
        return self._games

    def check_deployed(self) -> None:
        check_market(self.w3, self.artifacts, self.market.address, self.rpc_url)

    @property
    def market_address(self) -> str:
        return self.market.address

    def head_block(self) -> int:
        return int(self.w3.eth.block_number)

    def head(self) -> dict[str, Any]:
        latest = self.w3.eth.get_block("latest")
        try:
            now = int(self.w3.eth.get_block("pending")["timestamp"])
        except Exception:  # noqa: BLE001 - a node without a pending block: the latest one's time
            now = int(latest["timestamp"])
        block, block_hash, block_time = int(latest["number"]), bytes(latest["hash"]), int(latest["timestamp"])
        self._forget_if_rewound(block)
        self._seen = (block, block_hash)
        self._times[block] = block_time
        return {"chain_id": self.w3.eth.chain_id, "block": block, "block_hash": block_hash, "block_time": block_time,
                "now": max(now, block_time)}

    def _forget_if_rewound(self, block: int) -> None:
        if self._seen is None:
            return
        n, h = self._seen
        try:
            same = block >= n and bytes(self.w3.eth.get_block(n)["hash"]) == h
        except BlockNotFound:
            same = False
        if not same:
            self._reset()

    def block_time(self, block: int) -> int:
        if block not in self._times:
            self._times[block] = int(self.w3.eth.get_block(block)["timestamp"])
        return self._times[block]

    # -- the whole picture ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything the pages show, read at one head (raises NoContracts / transport errors)."""
        head = self.head()
        self.check_deployed()
        self._sync_market_events(head["block"])
        jobs = {i: self.job(i) for i in range(1, self.market.job_count() + 1)}
        game_ids = sorted({int(e.args["gameId"]) for e in self._events if e.name == "DisputeOpened"})
        disputes = {g: self.dispute(g, head) for g in game_ids}
        return jsonable({"chain": head, "market": self.market.address, "game": self.games.contract.address,
                         "jobs": jobs, "disputes": disputes})

    def _sync_market_events(self, to_block: int) -> None:
        if to_block < self._events_next:
            return
        new = [e for name in MARKET_EVENTS for e in self.market.logs(name, self._events_next, to_block)]
        self._events = sorted(self._events + new, key=lambda e: (e.block, e.log_index))
        self._events_next = to_block + 1

    def _event_row(self, e: MarketEvent) -> dict[str, Any]:
        return {"name": e.name, "block": e.block, "time": self.block_time(e.block), "tx": e.tx_hash, "args": e.args}

    # -- jobs -------------------------------------------------------------------------------------

    def job(self, job_id: int) -> dict[str, Any]:
        st = job_status(self.market, self.games, job_id)
        chain_job = self.market.job(job_id)
        # every field the market stores, not a chosen few: new submission phases show up by themselves
        st["terms"] = dataclasses.asdict(chain_job.terms)
        st["slots"] = [{**row, **{k: v for k, v in dataclasses.asdict(s).items() if k not in row}}
                       for s, row in zip(self.market.slots(job_id), st["slots"])]
        st["events"] = [self._event_row(e) for e in self._events if e.args.get("jobId") == job_id]
        bundle, note = self._bundle(chain_job.terms.spec_hash)
        st["model"] = bundle.spec.to_json() if bundle is not None else None
        st["model_note"] = note
        return st

    def _bundle(self, spec_hash: bytes) -> tuple[Job | None, str | None]:
        """The job bundle behind a spec hash, or None and why (the chain holds only commitments)."""
        if self.bundles_dir is None:
            return None, "no --bundles directory given: model and node names unknown"
        from verde_chain.agents.catalog import Bundles

        if self._bundles is None:
            self._bundles = Bundles(self.bundles_dir)
        failed = self._bundle_failed
        if spec_hash in failed and time.monotonic() - failed[spec_hash][0] < BUNDLE_RETRY_S:
            return None, failed[spec_hash][1]
        try:
            job = self._bundles.fetch(spec_hash)
        except VerdeError as exc:
            failed[spec_hash] = (time.monotonic(), str(exc))
            return None, str(exc)
        failed.pop(spec_hash, None)
        return job, None

    # -- disputes ---------------------------------------------------------------------------------

    def dispute(self, game_id: int, head: dict[str, Any]) -> dict[str, Any]:
        st = dispute_status(self.market, self.games, game_id, head["now"])
        log = self._game_log(game_id, head["block"])
        v = log.trace[-1][1] if log.trace else self.games.game(game_id)
        roles = {v.defender: "defender", v.challenger: "challenger"}
        for m in log.moves:
            m["role"] = roles.get(m["sender"], "other")
        bundle, note = self._bundle(self.market.job(st["job_id"]).terms.spec_hash)
        revealed = v.desc_hash != bytes(32)  # the node's descriptor is on chain from revealNode on
        chosen = any(m["function"] == "chooseElement" for m in log.moves) and v.resolution != Resolution.PADDING
        st.update(
            moves=log.moves,
            parties=self._parties(log.moves, v),
            levels=self._levels(log, v),
            clocks=self._clocks(v, head["now"]),
            node_label=bundle.program.graph.nodes[v.node_index].label if bundle is not None and revealed else None,
            model_note=note,
            element_value=f32(v.value) if chosen else None,  # the defender's value of the disputed element
            end=self._end(log, v) if v.phase == Phase.RESOLVED else None,
        )
        return st

    def _game_log(self, game_id: int, to_block: int) -> _GameLog:
        log = self._logs.setdefault(game_id, _GameLog())
        if log.next_block > to_block or (log.trace and log.trace[-1][1].phase == Phase.RESOLVED):
            return log
        topic = "0x" + game_id.to_bytes(32, "big").hex()
        raw = self.w3.eth.get_logs({"address": self.games.contract.address, "fromBlock": log.next_block,
                                    "toBlock": to_block, "topics": [None, HexStr(topic)]})
        by_block: dict[int, list[bytes]] = {}
        for r in sorted(raw, key=lambda r: (r["blockNumber"], r["logIndex"])):
            txs = by_block.setdefault(int(r["blockNumber"]), [])
            if bytes(r["transactionHash"]) not in txs:
                txs.append(bytes(r["transactionHash"]))
        trace, moves = list(log.trace), list(log.moves)  # committed whole: a failed read leaves no half
        for block, txs in sorted(by_block.items()):
            for b, v in game_trace(self.games, game_id, block, block):
                prev = trace[-1][1] if trace else None
                trace.append((b, v))
                moves += [self._move(h, b, prev, v, log) for h in txs]
        log.trace, log.moves, log.next_block = trace, moves, to_block + 1
        return log

    def _move(self, tx_hash: bytes, block: int, prev: GameView | None, v: GameView, log: _GameLog) -> dict[str, Any]:
        tx = self.w3.eth.get_transaction(HexStr("0x" + tx_hash.hex()))
        receipt = self.w3.eth.get_transaction_receipt(HexStr("0x" + tx_hash.hex()))
        target = self.games.contract if tx["to"] == self.games.contract.address else self.market.contract
        try:
            fn, args = target.decode_function_input(tx["input"])
            name = fn.fn_name
        except Exception:  # noqa: BLE001 - a call through some other contract: name it by selector
            name, args = "0x" + bytes(tx["input"][:4]).hex(), {}
        if name == "step":
            log.step_call = (bytes(args["desc"]), bytes(args["preState"]), bytes(args["proof"]))
        iv = interval(v)
        return {
            "block": block, "time": self.block_time(block), "tx": tx_hash, "sender": tx["from"], "role": None,
            "function": name, "gas": int(receipt["gasUsed"]),
            "level": None if prev is None or prev.phase == Phase.NONE else prev.phase.level,
            "phase": v.phase.name, "interval": None if iv is None else dataclasses.asdict(iv),
        }

    @staticmethod
    def _parties(moves: list[dict[str, Any]], v: GameView) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for role, addr in (("defender", v.defender), ("challenger", v.challenger), ("other", None)):
            mine = [m for m in moves if m["role"] == role]
            out[role] = {"address": addr, "moves": len(mine), "gas": sum(m["gas"] for m in mine),
                         "moves_by_level": {lvl: sum(1 for m in mine if m["level"] == lvl) for lvl in (1, 2, 3, 4)}}
        return out

    def _levels(self, log: _GameLog, v: GameView) -> list[dict[str, Any]]:
        """Per level: the successive intervals (``trace.narrowing``), each with the move that made it."""
        shown: dict[int, list[dict[str, Any]]] = {lvl: [] for lvl in (1, 2, 3, 4)}
        for i in range(len(log.trace)):
            per = narrowing(log.trace[: i + 1])  # grows by appending only: new entries came with state i
            block = log.trace[i][0]
            by = [m for m in log.moves if m["block"] == block]
            for lvl, new in per.items():
                for iv in new[len(shown[lvl]):]:
                    shown[lvl].append({**dataclasses.asdict(iv), "block": block, "time": self.block_time(block),
                                       "by": by[-1]["role"] if by else None,
                                       "function": by[-1]["function"] if by else None})
        current = v.phase.level if v.phase not in (Phase.NONE, Phase.RESOLVED) else None
        last = max((lvl for lvl, ivs in shown.items() if ivs), default=0)
        out = []
        for lvl in (1, 2, 3, 4):
            ivs = shown[lvl]
            if current is not None:
                state = "active" if lvl == current else "settled" if lvl < current else "waiting"
            else:
                state = "ended" if lvl == last else "settled" if lvl < last else "not reached"
            out.append({"level": lvl, "name": LEVEL_NAMES[lvl], "state": state, "unit": ivs[0]["unit"] if ivs else None,
                        "total": ivs[0]["total"] if ivs else None, "intervals": ivs})
        return out

    @staticmethod
    def _clocks(v: GameView, now: int) -> dict[str, Any]:
        running = None
        if v.phase not in (Phase.NONE, Phase.RESOLVED):
            running = "defender" if v.phase.mover == Side.DEFENDER else "challenger"
        clock = ChessClockModel(v.defender_left, v.challenger_left, v.turn_started_at)
        return {"defender_left": v.defender_left, "challenger_left": v.challenger_left,
                "turn_started_at": v.turn_started_at, "now": now, "running": running,
                "expired": running is not None and clock.expired(v.phase.mover, now)}

    def _end(self, log: _GameLog, v: GameView) -> dict[str, Any]:
        before = log.trace[-2][1] if len(log.trace) > 1 else v
        winner = "challenger" if v.winner == v.challenger else "defender"
        end: dict[str, Any] = {
            "resolution": v.resolution.name, "winner": v.winner, "winner_role": winner,
            "loser_role": "defender" if winner == "challenger" else "challenger",
            "phase_before": before.phase.name, "instruction": None,
        }
        if v.resolution == Resolution.STEP and log.step_call is not None:
            ins = explain_step(*log.step_call)
            end["instruction"] = {**ins, "agreed_pre": before.claim_lo, "claimed_post": before.claim_hi,
                                  "defender_claim_holds": ins["post_state"] == "0x" + before.claim_hi.hex()}
        return end

"""A bot's durable memory: one SQLite file per bot.

Tables::

    meta   key -> JSON value        config, last processed block, counters
    jobs   job_id -> JSON record    what the bot knows and did about a job (role, slot, result)
    games  game_id -> JSON record   role, job, strategy state, resolution
    txs    one row per transaction  account, nonce, kind, level, game, raw signed bytes, hash,
                                    status (signed -> sent -> mined | failed | dropped), gas used

Every write is its own committed transaction (autocommit, ``synchronous=FULL``), or one of a
``batch()`` committed together, so a SIGKILL loses at most the statement (or batch) in flight. A transaction row is written *before* the transaction is
broadcast: after a crash the bot finds it by hash (mined or pending) or, if the node never saw
it, marks it dropped and re-derives the action from the chain's state.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (job_id INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS games (game_id INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS txs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account TEXT NOT NULL, nonce INTEGER NOT NULL, kind TEXT NOT NULL,
    game_id INTEGER, level INTEGER NOT NULL DEFAULT 0,
    raw BLOB, hash TEXT, status TEXT NOT NULL, gas_used INTEGER, error TEXT, created REAL NOT NULL
);
"""

OPEN_TX = ("signed", "sent")
_TX_COLUMNS = "SELECT id, account, nonce, kind, game_id, level, raw, hash, status, gas_used, error FROM txs"


@dataclass(frozen=True)
class TxRow:
    id: int
    account: str
    nonce: int
    kind: str
    game_id: int | None
    level: int
    raw: bytes
    hash: str
    status: str
    gas_used: int | None
    error: str | None


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Make every write inside one transaction (one disk sync); nested batches join the outer
        (so a write that must be durable before something leaves the process, like a signed
        transaction before its broadcast, must not run inside another batch)."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- meta -------------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- jobs and games ---------------------------------------------------------------------------
    def _records(self, table: str) -> dict[int, dict[str, Any]]:
        col = "job_id" if table == "jobs" else "game_id"
        rows = self.db.execute(f"SELECT {col}, data FROM {table} ORDER BY {col}").fetchall()
        return {int(k): json.loads(v) for k, v in rows}

    def _record(self, table: str, key: int) -> dict[str, Any] | None:
        col = "job_id" if table == "jobs" else "game_id"
        row = self.db.execute(f"SELECT data FROM {table} WHERE {col} = ?", (key,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def _update(self, table: str, key: int, **fields: Any) -> dict[str, Any]:
        col = "job_id" if table == "jobs" else "game_id"
        rec = self._record(table, key) or {}
        rec.update(fields)
        self.db.execute(f"INSERT OR REPLACE INTO {table} ({col}, data) VALUES (?, ?)",
                        (key, json.dumps(rec)))
        return rec

    def jobs(self) -> dict[int, dict[str, Any]]:
        return self._records("jobs")

    def job(self, job_id: int) -> dict[str, Any] | None:
        return self._record("jobs", job_id)

    def update_job(self, job_id: int, **fields: Any) -> dict[str, Any]:
        return self._update("jobs", job_id, **fields)

    def games(self) -> dict[int, dict[str, Any]]:
        return self._records("games")

    def game(self, game_id: int) -> dict[str, Any] | None:
        return self._record("games", game_id)

    def update_game(self, game_id: int, **fields: Any) -> dict[str, Any]:
        return self._update("games", game_id, **fields)

    # -- transactions -----------------------------------------------------------------------------
    def add_tx(self, account: str, nonce: int, kind: str, raw: bytes, tx_hash: str, game_id: int | None,
               level: int) -> int:
        cur = self.db.execute(
            "INSERT INTO txs (account, nonce, kind, game_id, level, raw, hash, status, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'signed', ?)",
            (account, nonce, kind, game_id, level, raw, tx_hash, time.time()),
        )
        return int(cur.lastrowid or 0)

    def set_tx(self, row_id: int, status: str, gas_used: int | None = None, error: str | None = None) -> None:
        self.db.execute("UPDATE txs SET status = ?, gas_used = COALESCE(?, gas_used), error = COALESCE(?, error)"
                        " WHERE id = ?", (status, gas_used, error, row_id))

    def txs(self, status: tuple[str, ...] | None = None) -> list[TxRow]:
        q = _TX_COLUMNS
        args: tuple[Any, ...] = ()
        if status:
            q += f" WHERE status IN ({', '.join('?' for _ in status)})"
            args = status
        return [TxRow(*r) for r in self.db.execute(q + " ORDER BY id", args).fetchall()]

    def tx(self, row_id: int) -> TxRow:
        return TxRow(*self.db.execute(_TX_COLUMNS + " WHERE id = ?", (row_id,)).fetchone())

    def open_txs(self, game_id: int) -> list[TxRow]:
        """This game's transactions still in flight (signed or sent, no receipt yet)."""
        return [r for r in self.txs(OPEN_TX) if r.game_id == game_id]

    def gas_used(self, game_id: int | None = None) -> int:
        q = "SELECT COALESCE(SUM(gas_used), 0) FROM txs WHERE status IN ('mined', 'failed')"
        if game_id is None:
            return int(self.db.execute(q).fetchone()[0])
        return int(self.db.execute(q + " AND game_id = ?", (game_id,)).fetchone()[0])

    def moves(self, game_id: int) -> int:
        """Successful transactions this bot sent in a game."""
        return int(self.db.execute("SELECT COUNT(*) FROM txs WHERE status = 'mined' AND game_id = ?",
                                   (game_id,)).fetchone()[0])

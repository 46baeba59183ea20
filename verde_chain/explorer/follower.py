"""Follow the chain on a background thread and keep the latest snapshot for the web server.

The server never talks to the node: requests and the event stream read ``Follower.state``, a dict
replaced whole on every refresh (one reference swap, so readers need no lock). The thread polls
the head every ``poll`` seconds and rebuilds the snapshot when the head moves (and every
``idle_refresh`` seconds anyway, for the clocks' "now" and for bundles published late).

What the page says when the chain is not there (``status``)::

    starting      no answer yet
    ok            following; ``message`` None
    unreachable   the RPC does not answer: "RPC unreachable at URL, retrying"; the last good data
                  stays on the page (marked stale) and polling goes on, so a restarted node is
                  picked up by itself
    no_contracts  the node answers but no JobMarket is at the address (e.g. a fresh chain after a
                  restart): said plainly, jobs cleared, and polling goes on until one is deployed
    error         anything else (shown with its type; polling goes on)
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from verde_chain.agents.wallet import TRANSIENT
from verde_chain.errors import ChainError
from verde_chain.explorer.errors import NoContracts

FAILURES_SHOWN = 2  # consecutive failed refreshes before the page says something is wrong


class Source(Protocol):
    """What the follower reads (``ChainView``; tests pass a stand-in)."""

    rpc_url: str

    def head_block(self) -> int: ...

    def snapshot(self) -> dict[str, Any]: ...

    @property
    def market_address(self) -> str: ...


class Follower:
    def __init__(self, source: Source, poll: float = 0.5, idle_refresh: float = 5.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.poll = poll
        self.idle_refresh = idle_refresh
        self.log = log or (lambda m: print(f"[explorer] {m}", file=sys.stderr, flush=True))
        self.version = 0
        self.state: dict[str, Any] = self._stamp({"status": "starting", "message": "connecting to the chain",
                                                  "jobs": {}, "disputes": {}, "stale": False})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_head: int | None = None
        self._last_refresh = 0.0
        self._failed = 0  # consecutive failed refreshes

    def _stamp(self, state: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        return {**state, "version": self.version, "rpc_url": self.source.rpc_url,
                "market": state.get("market") or self.source.market_address, "updated": time.time()}

    # -- one round --------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Poll once: rebuild the snapshot when the head moved (or when forced / idle too long)."""
        try:
            head = self.source.head_block()
            due = time.monotonic() - self._last_refresh >= self.idle_refresh
            if not force and head == self._last_head and self.state["status"] == "ok" and not due:
                return
            snap = self.source.snapshot()
            self._last_head = head
            self._last_refresh = time.monotonic()
            self._failed = 0
            self._set("ok", None, snap)
        except NoContracts as exc:
            self._fail("no_contracts", f"{exc}; waiting for a deployment", {"jobs": {}, "disputes": {}})
        except (*TRANSIENT, ChainError) as exc:
            self._fail("unreachable", f"RPC unreachable at {self.source.rpc_url}, retrying", None, str(exc))
        except Exception as exc:  # noqa: BLE001 - shown on the page and logged; the thread keeps following
            self._fail("error", f"could not read the chain: {type(exc).__name__}: {exc}; retrying", None)

    def _fail(self, status: str, message: str, data: dict[str, Any] | None, detail: str | None = None) -> None:
        # One failed read is retried before it is shown: a node can answer a block number a moment
        # before its logs reach that block (seen on Anvil while it mines), and that is no outage.
        self._last_head = None
        self._failed += 1
        if self._failed >= FAILURES_SHOWN:
            self._set(status, message, data, detail)

    def _set(self, status: str, message: str | None, data: dict[str, Any] | None, detail: str | None = None) -> None:
        prev = self.state
        if status != prev["status"]:
            text = message or f"following {self.source.rpc_url}"
            self.log(text + (f" ({detail})" if detail else ""))
        keep: dict[str, Any] = {k: prev[k] for k in ("jobs", "disputes", "chain", "game") if k in prev}
        base = {**keep, **data} if data is not None else keep
        since = prev.get("since") if status == prev["status"] else time.time()
        self.state = self._stamp({**base, "status": status, "message": message, "since": since,
                                  "stale": data is None})

    # -- thread -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="explorer-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.poll)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- what the server reads --------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The state without per-job and per-dispute detail: the list page and the event stream."""
        st = self.state
        jobs = [{k: j.get(k) for k in ("job_id", "status", "num_steps", "num_nodes", "reward", "token",
                                        "active_disputes")}
                | {k: v for k, v in j.items() if k.endswith("_deadline")}  # whatever deadlines the market has
                | {"model": (j.get("model") or {}).get("name"), "slots": len(j.get("slots", []))}
                for j in st["jobs"].values()]
        disputes = [{k: d.get(k) for k in ("game_id", "job_id", "kind", "phase", "level", "to_move", "winner",
                                           "resolution", "defender", "challenger")}
                    for d in st["disputes"].values()]
        return {k: v for k, v in st.items() if k not in ("jobs", "disputes")} | {"jobs": jobs, "disputes": disputes}

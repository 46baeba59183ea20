"""The explorer's web server: Starlette on uvicorn, JSON endpoints, server-sent events, local assets.

    GET /                       the page (one HTML file; the views are routed by the URL's #hash)
    GET /static/...             app.js, style.css: served from this package, nothing from a CDN
    GET /api/state              status, chain head, every job and dispute in brief
    GET /api/jobs/{id}          one job: spec, model, slots, disputes, deadlines, market events
    GET /api/disputes/{id}      one dispute: levels, moves, clocks, gas per party, the end
    GET /api/stream             server-sent events: ``state`` (the brief state) on every change

Every endpoint answers from the follower's last snapshot, so a slow or dead node never blocks a
request; the page re-reads its detail endpoint when the stream says the version moved.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from verde_chain.explorer.errors import ExplorerError
from verde_chain.explorer.follower import Follower

STATIC = Path(__file__).resolve().parent / "static"
HEARTBEAT_S = 10.0
STREAM_TICK_S = 0.2


def _detail(follower: Follower, kind: str, key: int) -> Response:
    st = follower.state
    item = st[kind].get(str(key))
    if item is None:
        have = ", ".join(sorted(st[kind], key=int)) or "none yet"
        what = "job" if kind == "jobs" else "dispute"
        return JSONResponse({"error": f"no {what} {key} on market {st['market']} (known: {have})",
                             "status": st["status"], "message": st["message"]}, status_code=404)
    head = {k: st.get(k) for k in ("version", "status", "message", "stale", "chain", "market", "game", "rpc_url")}
    return JSONResponse({**head, kind[:-1]: item})


def build_app(follower: Follower, closing: threading.Event | None = None) -> Starlette:
    """The app; ``closing`` set ends every event stream (so a shutdown need not cut them off)."""
    closing = closing or threading.Event()

    async def index(_: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    def brief() -> dict[str, Any]:
        # served_at lets the page advance the chain's clock from when this snapshot was taken
        return {**follower.summary(), "served_at": time.time()}

    async def state(_: Request) -> Response:
        return JSONResponse(brief())

    async def job(request: Request) -> Response:
        return _detail(follower, "jobs", int(request.path_params["job_id"]))

    async def dispute(request: Request) -> Response:
        return _detail(follower, "disputes", int(request.path_params["game_id"]))

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            sent, quiet = -1, 0.0
            while not closing.is_set() and not await request.is_disconnected():
                if follower.version != sent:
                    sent, quiet = follower.version, 0.0
                    yield f"event: state\ndata: {json.dumps(brief())}\n\n"
                elif quiet >= HEARTBEAT_S:  # keeps proxies and the browser from timing the stream out
                    quiet = 0.0
                    yield ": heartbeat\n\n"
                await asyncio.sleep(STREAM_TICK_S)
                quiet += STREAM_TICK_S

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    return Starlette(routes=[
        Route("/", index),
        Route("/api/state", state),
        Route("/api/jobs/{job_id:int}", job),
        Route("/api/disputes/{game_id:int}", dispute),
        Route("/api/stream", stream),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])


def bind(host: str, port: int) -> socket.socket:
    """Listen before serving, so a busy port is one clear error and port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ExplorerError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another port") from exc
    sock.listen(64)
    return sock


class ExplorerServer:
    """The follower plus uvicorn on a background thread (the demo and tests run it in-process)."""

    def __init__(self, follower: Follower, host: str = "127.0.0.1", port: int = 0) -> None:
        self.follower = follower
        self.sock = bind(host, port)
        self.host = host
        self.port = int(self.sock.getsockname()[1])
        self.closing = threading.Event()
        config = uvicorn.Config(build_app(follower, self.closing), log_level="warning", timeout_graceful_shutdown=5,
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> Self:
        if self._thread is not None:  # already serving (``with start_explorer(...)`` enters a started one)
            return self
        self.follower.start()
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="explorer-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closing.set()
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.follower.stop()
        self.sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

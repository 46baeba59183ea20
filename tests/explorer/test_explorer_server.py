"""The explorer's follower and JSON endpoints without a browser or a chain (fast).

A stand-in source plays the chain: answering, refusing connections, holding no contracts, or
failing oddly; the follower must say which, keep the last good data where that makes sense, and
recover by itself. The endpoints are read over HTTP from the real server on a free port.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from verde_chain import cli
from verde_chain.explorer.chain_view import MAX_SAFE_INT, jsonable
from verde_chain.explorer.errors import ExplorerError, NoContracts
from verde_chain.explorer.follower import Follower
from verde_chain.explorer.server import STATIC, ExplorerServer, bind

MARKET = "0x" + "ab" * 20


def _job(job_id: int) -> dict[str, Any]:
    return {"job_id": job_id, "status": "OPEN", "num_steps": 3, "num_nodes": 33, "reward": str(10**18 + 1),
            "token": {"address": "0x" + "00" * 20, "symbol": "ETH", "decimals": 18}, "active_disputes": 1,
            "submission_deadline": 1_000, "challenge_deadline": 4_600, "reveal_deadline": 2_000,
            "model": {"name": "digits-mlp"}, "slots": [{"slot": 0, "status": "SUBMITTED"}]}


class FakeChain:
    """Answers like ChainView, or fails the way a node does."""

    rpc_url = "http://127.0.0.1:1"
    market_address = MARKET

    def __init__(self) -> None:
        self.mode = "ok"
        self.block = 10
        self.snapshots = 0

    def _check(self) -> None:
        if self.mode == "down":
            raise requests.exceptions.ConnectionError("connection refused")
        if self.mode == "empty":
            raise NoContracts(f"no contracts deployed at {MARKET} on chain 31337 ({self.rpc_url})")
        if self.mode == "odd":
            raise KeyError("gameId")

    def head_block(self) -> int:
        self._check()
        return self.block

    def snapshot(self) -> dict[str, Any]:
        self._check()
        self.snapshots += 1
        return {"chain": {"chain_id": 31337, "block": self.block, "block_time": 100, "now": 105},
                "market": MARKET, "game": "0x" + "cd" * 20, "jobs": {"1": _job(1)},
                "disputes": {"1": {"game_id": 1, "job_id": 1, "phase": "L2_POST", "level": 2, "kind": "OUTSIDE"}}}


@pytest.fixture
def chain() -> FakeChain:
    return FakeChain()


@pytest.fixture
def follower(chain: FakeChain) -> Follower:
    f = Follower(chain, idle_refresh=3600, log=lambda m: None)
    f.refresh()
    return f


def test_jsonable_keeps_big_integers_exact() -> None:
    out = json.loads(json.dumps(jsonable({"a": MAX_SAFE_INT, "b": MAX_SAFE_INT + 1, "c": b"\x01\x02", 3: (True, None)})))
    assert out == {"a": MAX_SAFE_INT, "b": str(MAX_SAFE_INT + 1), "c": "0x0102", "3": [True, None]}


def test_follower_rebuilds_only_when_the_head_moves(chain: FakeChain, follower: Follower) -> None:
    assert follower.state["status"] == "ok" and chain.snapshots == 1
    v = follower.version
    follower.refresh()
    assert chain.snapshots == 1 and follower.version == v  # same head: nothing read, nothing pushed
    chain.block = 11
    follower.refresh()
    assert chain.snapshots == 2 and follower.version == v + 1


def test_follower_says_what_is_wrong_and_recovers(chain: FakeChain, follower: Follower) -> None:
    chain.mode = "odd"
    follower.refresh()
    assert follower.state["status"] == "ok"  # one failed read is retried before it is shown
    chain.mode = "down"
    follower.refresh()
    st = follower.state
    assert st["status"] == "unreachable" and st["message"] == f"RPC unreachable at {chain.rpc_url}, retrying"
    assert st["stale"] is True and "1" in st["jobs"]  # the last good data stays, marked stale
    chain.mode = "empty"
    follower.refresh()
    follower.refresh()
    st = follower.state
    assert st["status"] == "no_contracts" and st["message"].startswith(f"no contracts deployed at {MARKET}")
    assert st["jobs"] == {} and st["disputes"] == {}  # nothing there any more
    chain.mode = "odd"
    follower.refresh()
    follower.refresh()
    assert follower.state["status"] == "error" and "KeyError" in follower.state["message"]
    chain.mode = "ok"
    follower.refresh()  # the same head as before the outage is read again: a restarted node may differ
    st = follower.state
    assert st["status"] == "ok" and st["message"] is None and st["stale"] is False and "1" in st["jobs"]
    assert chain.snapshots == 2


class Client:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path.lstrip("/"), timeout=30)


@pytest.fixture
def client(follower: Follower) -> Any:
    with ExplorerServer(follower, port=0) as server:
        yield Client(server.url)


def test_endpoints(client: Client) -> None:
    st = client.get("/api/state").json()
    assert st["status"] == "ok" and st["market"] == MARKET and st["chain"]["block"] == 10
    (job,) = st["jobs"]
    assert job["model"] == "digits-mlp" and job["slots"] == 1 and job["reward"] == str(10**18 + 1)
    assert job["reveal_deadline"] == 2_000  # a deadline the market adds is passed on without naming it here
    assert st["disputes"][0]["phase"] == "L2_POST" and st["served_at"] >= st["updated"]
    detail = client.get("/api/jobs/1").json()
    assert detail["job"]["slots"] == [{"slot": 0, "status": "SUBMITTED"}] and detail["status"] == "ok"
    assert client.get("/api/disputes/1").json()["dispute"]["level"] == 2
    r = client.get("/api/jobs/7")
    assert r.status_code == 404 and r.json()["error"] == f"no job 7 on market {MARKET} (known: 1)"
    assert client.get("/api/disputes/2").status_code == 404
    assert client.get("/api/jobs/x").status_code == 404
    page = client.get("/")
    assert page.status_code == 200 and '<script src="/static/app.js">' in page.text
    for asset in ("app.js", "style.css"):
        r = client.get(f"/static/{asset}")
        assert r.status_code == 200 and r.text == (STATIC / asset).read_text()
    # every asset the page loads is local: no CDN, no remote font
    for asset in ("index.html", "app.js", "style.css"):
        text = (STATIC / asset).read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text


def test_stream_pushes_the_state(client: Client, chain: FakeChain, follower: Follower) -> None:
    with requests.get(client.url + "api/stream", stream=True, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines(decode_unicode=True)
        assert next(lines) == "event: state"
        first = json.loads(next(lines).removeprefix("data: "))
        assert first["status"] == "ok" and first["jobs"][0]["job_id"] == 1 and first["chain"]["block"] == 10
        chain.block = 11  # the follower's thread sees the new head and the stream pushes it
        second = next(json.loads(x.removeprefix("data: ")) for x in lines if x.startswith("data: "))
    assert second["chain"]["block"] == 11 and second["version"] > first["version"]


def test_a_busy_port_is_one_clear_error() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        with pytest.raises(ExplorerError, match=f"cannot listen on 127.0.0.1:{sock.getsockname()[1]}"):
            bind("127.0.0.1", sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.parametrize("argv,message", [
    (["--rpc-url", "localhost:8545"], "--rpc-url 'localhost:8545' is not an http(s) URL"),
    (["--market", "0x1234"], "--market '0x1234' is not an address"),
    (["--rpc-url", "http://127.0.0.1:9"], "no JSON-RPC node answers at http://127.0.0.1:9"),
])
def test_bad_arguments_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explorer", *argv, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"verde-chain explorer: error: {message}"), err

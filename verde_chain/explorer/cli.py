"""`verde-chain explorer`: serve the live explorer of a JobMarket until Ctrl-C (wired in ``cli.py``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from verde_chain.agents.commands import DEFAULT_STATE, chain_args

if TYPE_CHECKING:  # the web stack loads only when the explorer runs, not with every subcommand
    from verde_chain.chain.compile import Artifact
    from verde_chain.explorer.server import ExplorerServer

DEFAULT_PORT = 8600
DEFAULT_BUNDLES = DEFAULT_STATE / "bundles"


def configure(p: argparse.ArgumentParser) -> None:
    chain_args(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT}; 0 = any)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    p.add_argument("--bundles", type=Path, default=DEFAULT_BUNDLES,
                   help=f"job-bundle directory, for model and node names (default {DEFAULT_BUNDLES})")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between looks at the chain's head")


def start_explorer(rpc_url: str, market: str, artifacts: Mapping[str, Artifact], bundles: Path | None = None,
                   port: int = 0, host: str = "127.0.0.1", poll: float = 0.5) -> ExplorerServer:
    """Serve the explorer of `market` on a background thread (its own RPC connection)."""
    from verde_chain.agents.wallet import connect
    from verde_chain.explorer.chain_view import ChainView
    from verde_chain.explorer.follower import Follower
    from verde_chain.explorer.server import ExplorerServer

    view = ChainView(connect(rpc_url), artifacts, market, rpc_url, bundles)
    return ExplorerServer(Follower(view, poll=poll), host, port).start()


def run(args: argparse.Namespace) -> int:
    from verde_chain.explorer.chain_view import ChainView
    from verde_chain.explorer.follower import Follower
    from verde_chain.explorer.server import ExplorerServer

    view = ChainView.open(args)
    server = ExplorerServer(Follower(view, poll=args.poll), args.host, args.port).start()
    print(f"explorer: {server.url}  (JobMarket {view.market_address} on chain {view.w3.eth.chain_id} at "
          f"{args.rpc_url}); Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0

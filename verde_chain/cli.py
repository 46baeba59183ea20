"""`verde-chain` command line: one entry point, one subcommand per job a user has.

Subcommands register themselves through ``COMMANDS`` so later parts (jobs, trainers,
challengers, the demo) add to the same CLI without touching the parser setup.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from verde_chain.agents.catalog import JOB_KINDS
from verde_chain.agents.system import HELPER_CONTRACTS, deploy_full_system
from verde_chain.agents.system import SYSTEM_CONTRACTS as MARKET_SYSTEM
from verde_chain.chain.anvil import Anvil, install_signal_cleanup, stop_requested
from verde_chain.chain.compile import compile_contracts
from verde_chain.errors import VerdeError

Command = tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: list[Command] = []

# Contracts that make up a deployment: helpers + ScalarVM -> DisputeGame -> JobMarket (wired in order).
SYSTEM_CONTRACTS = [*HELPER_CONTRACTS, *MARKET_SYSTEM]


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None]):  # type: ignore[no-untyped-def]
    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append((name, help_text, configure, fn))
        return fn

    return wrap


def _node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8545, help="port to listen on (0 = any free port)")
    p.add_argument("--accounts", type=int, default=10, help="number of funded accounts")
    p.add_argument("--block-time", type=float, default=None, help="seconds per block (default: mine on demand)")


@command("node", "run a local Anvil chain in the foreground; print its RPC URL and funded accounts", _node_args)
def cmd_node(args: argparse.Namespace) -> int:
    install_signal_cleanup()
    with Anvil(port=args.port or None, accounts=args.accounts, block_time=args.block_time) as node:
        w3 = node.web3()
        print(f"RPC URL: {node.rpc_url}")
        print(f"Chain id: {w3.eth.chain_id}")
        print("Funded accounts (private keys derive from the standard test mnemonic):")
        for i, a in enumerate(w3.eth.accounts):
            print(f"  ({i}) {a}  {w3.from_wei(w3.eth.get_balance(a), 'ether')} ETH")
        print(f"Logs: {node.log_path}\nPress Ctrl-C to stop.", flush=True)
        try:
            while node.running and stop_requested() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    stopped_by = stop_requested()
    return 0 if stopped_by is None else 128 + stopped_by  # the status a process ended by the signal reports


def _deploy_args(p: argparse.ArgumentParser) -> None:
    from verde_chain.market.marketparams import PROFILES

    p.add_argument("--rpc-url", default=None, help="JSON-RPC endpoint (default: start an embedded Anvil)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="mainnet",
                   help="the JobMarket's immutable parameters: bounds on clocks, windows, deadlines and bonds "
                        "(mainnet: 12 s blocks, bond floor at 20 gwei; fast: 1 s blocks, 1 gwei; dev: fast with "
                        "windows and clocks of seconds, for a local chain only you use)")
    p.add_argument("--token-floor", action="append", default=[], metavar="TOKEN:MIN_BOND",
                   help="also allow jobs paid in ERC-20 TOKEN, with bonds of at least MIN_BOND (smallest units); "
                        "repeatable")
    p.add_argument("--out", type=Path, default=None, help="write the deployment record here (JSON)")
    p.add_argument("--json", action="store_true", help="print the deployment record as JSON")


@command("deploy", "compile and deploy the contracts; write a deployment record", _deploy_args)
def cmd_deploy(args: argparse.Namespace) -> int:
    from web3 import HTTPProvider, Web3

    from verde_chain.market.marketparams import PROFILES

    params = PROFILES[args.profile]
    for item in args.token_floor:
        token, _, amount = item.partition(":")
        if not Web3.is_address(token) or not amount.isdigit() or int(amount) == 0:
            raise VerdeError(f"--token-floor wants TOKEN:MIN_BOND (an address and a positive integer), got {item!r}")
        params = params.with_token(Web3.to_checksum_address(token), int(amount))
    artifacts = compile_contracts()
    node = None
    try:
        if args.rpc_url:
            rpc_url = args.rpc_url
            w3 = Web3(HTTPProvider(rpc_url))
            if not w3.is_connected():
                raise VerdeError(f"cannot reach {rpc_url}")
        else:
            node = Anvil()
            rpc_url = node.rpc_url
            w3 = node.web3()
        record, _ = deploy_full_system(w3, artifacts, rpc_url, params=params)
        out = args.out or Path("build") / "deployments" / f"{record.chain_id}.json"
        record.write(out)
        if args.json:
            print(json.dumps(record.__dict__, sort_keys=True))
        else:
            print(f"Deployed to chain {record.chain_id} at block {record.block} ({rpc_url}):")
            for name, addr in record.contracts.items():
                print(f"  {name:<20} {addr}")
            print(f"Deployment record: {out}")
    finally:
        if node is not None:
            node.stop()
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="last line of output is the report as one JSON object")
    p.add_argument("--seed", type=int, default=0, help="seed of the cheat site (step, node, element, bit)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cheat", default=None, metavar="STEP:NODE:ELEMENT[:BIT]",
                   help="flip this bit instead of a drawn one; or micro:STEP:NODE:ELEMENT:J[:BIT]: "
                        "instruction J of that element goes wrong (the dispute ends on it)")
    g.add_argument("--cheat-level", type=int, choices=(1, 2, 4), default=None,
                   help="where the cheat is caught: 4 one-step proof (a flipped bit, default), "
                        "2 node reveal (a lazy trainer), 1 timeout (a cheater that never answers)")
    p.add_argument("--job", choices=JOB_KINDS, default="digits")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: 100 digits, 8 transformer, 4 llama, 2 resnet18 / mobilenet_v2, "
                        "20 digits_cnn)")
    p.add_argument("--out", type=Path, default=Path("build") / "demo", help="output directory (bisection.png, state)")
    p.add_argument("--explorer", action="store_true", help="serve the live explorer of this run and print its URL")
    p.add_argument("--explorer-port", type=int, default=8600, help="the explorer's port (default 8600; 0 = any)")
    p.add_argument("--explorer-hold", action="store_true",
                   help="with --explorer: keep serving after the run ends, until Ctrl-C")


@command("demo", "run the end-to-end story on an embedded Anvil", _demo_args)
def cmd_demo(args: argparse.Namespace) -> int:
    from verde_chain.demo import run_demo

    return run_demo(json_out=args.json, seed=args.seed, cheat=args.cheat, cheat_level=args.cheat_level,
                    job_kind=args.job, steps=args.steps, out=args.out,
                    explorer_port=args.explorer_port if args.explorer or args.explorer_hold else None,
                    explorer_hold=args.explorer_hold)


def _register_agents() -> None:
    from verde_chain.agents import commands as c

    COMMANDS.extend([
        ("client", "post a job, follow it to the end and collect the outcome", c.configure_client, c.run_client),
        ("trainer", "trainer bot: `trainer run` stakes, trains with RepOps, submits and defends",
         c.configure_trainer, c.run_trainer),
        ("challenger", "challenger bot: `challenger run` re-executes submissions and disputes wrong ones",
         c.configure_challenger, c.run_challenger),
        ("dispute", "`dispute status GAME_ID`: a dispute's level, interval, clocks and outcome",
         c.configure_dispute, c.run_dispute_status),
    ])


_register_agents()


def _register_job() -> None:
    from verde_chain import job_cli

    help_text = "`job create`: a bundle from your model and data; `job status JOB_ID`: a job's slots and disputes"
    COMMANDS.append(("job", help_text, job_cli.configure, job_cli.run))


_register_job()


def _register_train() -> None:
    from verde_chain import train_cli

    COMMANDS.append(("train", "run a training job locally (no chain) with step commitments", train_cli.configure,
                     train_cli.run))


_register_train()


def _register_explorer() -> None:
    from verde_chain.explorer import cli as explorer_cli

    COMMANDS.append(("explorer", "serve a live explorer of a market's jobs and disputes in the browser",
                     explorer_cli.configure, explorer_cli.run))


_register_explorer()


def _register_bundles() -> None:
    from verde_chain.bundles import server

    COMMANDS.append(("bundles", "`bundles serve DIR`: publish job bundles over HTTP for bots on other machines",
                     server.configure, server.run))


_register_bundles()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verde-chain", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text, configure, fn in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(func=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return int(args.func(args))
    except VerdeError as exc:
        print(f"verde-chain {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

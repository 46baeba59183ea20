"""Argument parsing and entry points of the bot and status subcommands (wired in ``cli.py``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from web3 import Web3

from verde_chain.agents.bot import Bot, BotConfig
from verde_chain.agents.catalog import JOB_KINDS
from verde_chain.agents.endpoint import check_address, check_market, connect_node
from verde_chain.agents.errors import AgentError
from verde_chain.agents.policy import Policy
from verde_chain.agents.strategies import ChallengerStrategy, TrainerStrategy
from verde_chain.chain.compile import Artifact, compile_contracts
from verde_chain.chain.deploy import DeploymentRecord
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.graph.backend import THREADS_HELP, set_threads, thread_count
from verde_chain.job import Job, load_job
from verde_chain.market.types import ETH

DEFAULT_RPC = "http://127.0.0.1:8545"
RPC_ENV = "VERDE_RPC_URL"  # the --rpc-url of every command that talks to a market, when it is not given
DEFAULT_STATE = Path("build") / "agents"


def chain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rpc-url", default=os.environ.get(RPC_ENV, DEFAULT_RPC),
                   help=f"JSON-RPC endpoint (default ${RPC_ENV}, else {DEFAULT_RPC})")
    p.add_argument("--market", default=None,
                   help="JobMarket address (default: from build/deployments/<chain id>.json, see `deploy`)")


def bot_args(p: argparse.ArgumentParser, default_account: int) -> None:
    chain_args(p)
    p.add_argument("--account", type=int, default=default_account, help="index of the funded test account")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help="where bots keep SQLite files and bundles")
    p.add_argument("--db", type=Path, default=None,
                   help="this bot's SQLite file (default STATE_DIR/ROLE-ACCOUNT.sqlite)")
    p.add_argument("--bundles", type=Path, default=None, help="shared job-bundle directory (default STATE_DIR/bundles)")
    p.add_argument("--seed", type=int, default=0, help="seed of any random choice (cheat sites, garbage claims)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls when idle")
    p.add_argument("--start-block", type=int, default=0, help="first block to read events from on a fresh database")
    p.add_argument("--policy", type=policy_file, default=None,
                   help="JSON file of the jobs this bot accepts (agents/policy.py: tokens, clock_margin, "
                        "max_stake_to_share, min_window_blocks, horizon, max_bond, ...; default: built-in)")
    p.add_argument("--max-ticks", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=thread_count, default=None, help=THREADS_HELP)


def connect_market(args: argparse.Namespace) -> tuple[Web3, dict[str, Artifact], str]:
    """The node, the artifacts and the JobMarket (``--market``, else the deployment record's),
    every one checked first (``agents/endpoint.py``: one line naming the problem and the fix)."""
    if args.market is not None:
        check_address(args.market)
    w3 = connect_node(args.rpc_url)
    artifacts = compile_contracts()
    market, fix = args.market, "--market must be the JobMarket's address (`verde-chain deploy` prints it)"
    if market is None:
        rec = Path("build") / "deployments" / f"{w3.eth.chain_id}.json"
        if not rec.exists():
            raise AgentError(f"no --market given and no deployment record at {rec}; run `verde-chain deploy` first")
        try:
            market = DeploymentRecord.read(rec).contracts.get("JobMarket")
        except (OSError, ValueError, TypeError) as exc:
            raise AgentError(f"{rec} is not a deployment record ({type(exc).__name__}); run `verde-chain deploy` "
                             "again") from exc
        if market is None:
            raise AgentError(f"{rec} has no JobMarket; redeploy with `verde-chain deploy`")
        fix = f"the deployment record {rec} is stale (was the node restarted?): run `verde-chain deploy` again"
    check_market(w3, artifacts, market, args.rpc_url, fix)
    return w3, artifacts, Web3.to_checksum_address(market)


def policy_file(path: str) -> Policy:
    """``--policy FILE``, read while the arguments are parsed: a bad file is refused as an
    argument error (argparse's usage and one error line) before the bot connects anywhere."""
    try:
        return Policy.from_json(path)
    except AgentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _config(args: argparse.Namespace, role: str, market: str, strategy: str) -> BotConfig:
    name = f"{role}-{args.account}"
    db = args.db or args.state_dir / f"{name}.sqlite"
    bundles = args.bundles or args.state_dir / "bundles"
    policy = getattr(args, "policy", None) or Policy()
    return BotConfig(args.rpc_url, market, args.account, str(db), str(bundles), strategy, args.seed, name,
                     args.start_block, policy, bundle_url=getattr(args, "bundle_url", ""),
                     workers=getattr(args, "workers", 1))


def workers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=1,
                   help="train a job of S > 1 shards on this many processes (1..S; the same result)")


def _run_bot(bot: Bot, args: argparse.Namespace) -> int:
    set_threads(args.threads)  # the training and re-execution of every job this bot takes
    bot.log(f"running as {bot.address} (strategy {bot.cfg.strategy}); state in {bot.cfg.db}")
    try:
        bot.run(args.poll, max_ticks=args.max_ticks)
    except (KeyboardInterrupt, SystemExit):
        bot.log("stopped")
    finally:
        bot.close()
    return 0


# -- trainer / challenger ----------------------------------------------------------------------------

def configure_trainer(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="take jobs, train, submit and defend until stopped")
    bot_args(r, 2)
    r.add_argument("--strategy", default="honest",
                   help=f"{' | '.join(TrainerStrategy)} (with :PARAMS, see docs/agents.md)")
    r.add_argument("--max-jobs", type=int, default=1, help="jobs worked on at once")
    workers_arg(r)
    r.add_argument("--dispute-rivals", action="store_true",
                   help="dispute rival trainers whose result differs from ours (staking our slot, no bond)")


def run_trainer(args: argparse.Namespace) -> int:
    from verde_chain.agents.trainer import TrainerBot

    w3, artifacts, market = connect_market(args)
    cfg = _config(args, "trainer", market, args.strategy)
    return _run_bot(TrainerBot(w3, artifacts, cfg, max_jobs=args.max_jobs, dispute_rivals=args.dispute_rivals), args)


def configure_challenger(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="watch submissions, re-execute, dispute and play until stopped")
    bot_args(r, 4)
    r.add_argument("--strategy", default="honest",
                   help=f"{' | '.join(ChallengerStrategy)} (with :PARAMS, see docs/agents.md)")
    r.add_argument("--bond", type=int, default=None, help="bond per dispute in wei (default: the job's minimum)")
    workers_arg(r)


def run_challenger(args: argparse.Namespace) -> int:
    from verde_chain.agents.challenger import ChallengerBot

    w3, artifacts, market = connect_market(args)
    return _run_bot(ChallengerBot(w3, artifacts, _config(args, "challenger", market, args.strategy), bond=args.bond),
                    args)


# -- client --------------------------------------------------------------------------------------------

def configure_client(p: argparse.ArgumentParser) -> None:
    from verde_chain.agents.client import JobOffer

    d = JobOffer()
    bot_args(p, 1)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--job", choices=JOB_KINDS, default=d.kind, help="one of the example jobs")
    what.add_argument("--bundle", type=Path, default=None,
                      help="post this job bundle instead (a directory written by `verde-chain job create` or "
                           "save_job; checked, then published under the bundle directory trainers read)")
    p.add_argument("--steps", type=int, default=None, help=f"the example job's steps (default {d.steps}; a bundle "
                   "states its own)")
    p.add_argument("--token", type=_token_address, default=d.token,
                   help="ERC-20 token address the job pays reward, stakes and bonds in (default ETH); "
                        "the client approves the market for the reward before posting")
    p.add_argument("--reward", type=int, default=d.reward, help="in the token's smallest unit (wei for ETH)")
    p.add_argument("--stake", type=int, default=d.trainer_stake, help="trainer stake (smallest units)")
    p.add_argument("--bond", type=int, default=d.min_challenge_bond, help="minimum challenge bond (smallest units)")
    p.add_argument("--slots", type=int, default=d.slots)
    p.add_argument("--submission-window", type=int, default=d.submission_window, help="seconds")
    p.add_argument("--reveal-window", type=int, default=d.reveal_window,
                   help="seconds after the submission deadline in which trainers reveal their committed results")
    p.add_argument("--challenge-window", type=int, default=d.challenge_window,
                   help="seconds after the reveal deadline in which results can still be disputed")
    p.add_argument("--clock", type=int, default=d.clock_seconds, help="chess-clock seconds per party per game")
    p.add_argument("--arity", type=int, default=d.arity)
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    p.add_argument("--bundle-url", default="",
                   help="base URL where `verde-chain bundles serve` publishes --bundles (e.g. http://HOST:8600): the "
                   "job's bundleUri is BASE/<specHash hex>, for bots without the shared directory")


def _token_address(text: str) -> str:
    if text.lower() == "eth":
        return ETH
    if not Web3.is_address(text):
        raise argparse.ArgumentTypeError(f"not an address: {text!r} (want 0x + 40 hex digits, or ETH)")
    return str(Web3.to_checksum_address(text))


def run_client(args: argparse.Namespace) -> int:
    from verde_chain.agents.client import ClientBot, JobOffer

    job = _bundle(args.bundle, args.steps) if args.bundle is not None else None
    set_threads(args.threads)  # building the job's commitments
    w3, artifacts, market = connect_market(args)
    bot = ClientBot(w3, artifacts, _config(args, "client", market, "honest"))
    kind, steps = (job.spec.name, job.spec.steps) if job else (args.job, args.steps or JobOffer().steps)
    offer = JobOffer(kind, steps, args.reward, args.stake, args.bond, args.slots, args.submission_window,
                     args.challenge_window, args.arity, args.clock, args.seed or JobOffer().job_seed, args.token,
                     reveal_window=args.reveal_window)
    job_id = bot.post(offer, job)
    done = lambda: (bot.store.job(job_id) or {}).get("state") == "done"
    try:
        bot.run(args.poll, stop=done, max_ticks=args.max_ticks)
    except (KeyboardInterrupt, SystemExit):
        bot.log("stopped before the job was finalized; run again with the same --db to resume")
        return 1
    finally:
        rec = bot.store.job(job_id) or {}
        bot.close()
    if args.json:
        print(json.dumps({"job_id": job_id, **rec}, sort_keys=True))
    return 0 if rec.get("state") == "done" else 1


def _bundle(path: Path, steps: int | None) -> Job:
    """The bundle at ``path``, every commitment re-derived (``load_job``: a named error on one line)."""
    if not (path / "job.json").is_file() and not (path.is_file() and path.name == "job.json"):
        raise AgentError(f"--bundle {path}: no job.json there; write a bundle with `verde-chain job create ... --out "
                         f"{path}` (or save_job)")
    job = load_job(path)
    if steps is not None and steps != job.spec.steps:
        raise AgentError(f"--steps {steps}: the bundle {path} is a {job.spec.steps}-step job (its steps are part of "
                         "its spec; build another bundle to change them)")
    return job


# -- status --------------------------------------------------------------------------------------------

def job_status_args(s: argparse.ArgumentParser) -> None:
    """``job status``'s arguments (the ``job`` command is ``verde_chain/job_cli.py``)."""
    chain_args(s)
    s.add_argument("job_id", type=int)
    s.add_argument("--json", action="store_true")


def configure_dispute(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("status", help="a dispute game's level, interval, clocks and outcome")
    chain_args(s)
    s.add_argument("game_id", type=int)
    s.add_argument("--json", action="store_true")


def _views(args: argparse.Namespace) -> tuple[Web3, Market, DisputeGameClient]:
    w3, artifacts, market_addr = connect_market(args)
    market = Market.at(w3, artifacts, market_addr)
    game = w3.eth.contract(address=Web3.to_checksum_address(market.game_address()), abi=artifacts["DisputeGame"].abi)
    return w3, market, DisputeGameClient(w3, game, artifacts)


def run_job_status(args: argparse.Namespace) -> int:
    from verde_chain.agents.status import format_job, job_status

    _, market, games = _views(args)
    if not 1 <= args.job_id <= market.job_count():
        raise AgentError(f"no job {args.job_id} on market {market.address} (jobs: 1..{market.job_count()})")
    _emit(job_status(market, games, args.job_id), args.json, format_job)
    return 0


def run_dispute_status(args: argparse.Namespace) -> int:
    from verde_chain.agents.status import dispute_status, format_dispute

    w3, market, games = _views(args)
    if not 1 <= args.game_id <= games.game_count():
        raise AgentError(f"no game {args.game_id} (games: 1..{games.game_count()})")
    now = int(w3.eth.get_block("latest")["timestamp"])
    _emit(dispute_status(market, games, args.game_id, now), args.json, format_dispute)
    return 0


def _emit(st: dict[str, Any], as_json: bool, fmt: Any) -> None:
    print(json.dumps(st, sort_keys=True, default=str) if as_json else fmt(st))


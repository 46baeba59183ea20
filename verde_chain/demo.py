"""`verde-chain demo`: a training job, a cheat, and its refutation, all on a local chain.

Embedded Anvil; deploy ScalarVM -> DisputeGame -> JobMarket. A client bot posts the digits MLP
job (or the tiny transformer); two trainer bots take it, one honest and one that flips a single
bit of one tensor element at a step/node/element drawn from ``--seed`` (or given by ``--cheat``);
a challenger bot re-executes every submission and disputes the one that differs. The dispute is
played by the bots, move by move over JSON-RPC, down to one binary32 instruction executed by the
on-chain ScalarVM; the market slashes the cheater and pays the honest trainer.

Output: a live log (bots' actions and each level's interval narrowing), a report (winner, gas
per party, moves per level, wall time, the referee's one instruction against the job's total
instruction count), ``bisection.png`` in ``--out``, and with ``--json`` a last line holding the
report as one JSON object. Exit status 0 only when the honest side won.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from eth_typing import HexStr

from verde_chain import IMPORTED_AT
from verde_chain.agents.bot import Bot, BotConfig
from verde_chain.agents.challenger import ChallengerBot
from verde_chain.agents.client import ClientBot, JobOffer
from verde_chain.agents.errors import StrategyError
from verde_chain.agents.strategies import check_fault, draw_fault, parse_cheat, trainer_plan
from verde_chain.agents.system import Conductor, deploy_full_system
from verde_chain.agents.trace import game_trace, interval, plot_bisection, settled
from verde_chain.agents.trainer import TrainerBot
from verde_chain.chain.anvil import Anvil
from verde_chain.chain.compile import compile_contracts
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.chain.tx import gas_in_calls_to
from verde_chain.dispute.types import GameView, Phase
from verde_chain.graph.world import TrainingWorld
from verde_chain.job import Job
from verde_chain.market.types import JobStatus, SlotStatus

DEFAULT_STEPS = {"digits": 100, "transformer": 8, "llama": 4, "llama-inference": 1, "resnet18": 2, "mobilenet_v2": 2,
                 "digits_cnn": 20}
# The vision jobs' drawn cheats sit where the new semantics live: a conv or a batch norm node.
CHEAT_NODES = {k: ("conv", "batch_norm") for k in ("resnet18", "mobilenet_v2", "digits_cnn")}
# --cheat-level: where the cheat is caught. 4: a flipped bit, refuted by the one-step proof;
# 2: a lazy trainer, whose node reveal cannot be justified; 1: a cheater that never answers.
CHEAT_LEVELS = {1: "silent:0", 2: "lazy", 4: "bitflip"}


# The demo's wall time, measured part by part (``times_s`` in the report, in this order).
TIME_PARTS = {"imports": "imports", "compile": "compile", "chain": "Anvil + deploy", "job": "build + post the job",
              "training": "training (trainers' and challenger's runs)", "dispute": "bots on chain + dispute",
              "report": "report + picture"}


class Stopwatch:
    """Wall time cut into consecutive laps that add up to the total (rounded to 10 ms)."""

    def __init__(self, started: float) -> None:
        self.last = started
        self._laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self._laps[name] = now - self.last
        self.last = now

    def split(self, name: str, part: str, part_s: float, rest: str) -> None:
        """Close a lap of which ``part_s`` seconds (measured inside it) were ``part``, the rest ``rest``."""
        self.lap(name)
        whole = self._laps.pop(name)
        self._laps[part] = min(part_s, whole)
        self._laps[rest] = whole - self._laps[part]

    def laps(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in self._laps.items()}

    def total(self) -> float:
        """The wall time up to the last lap: the laps' sum (so the printed parts add up exactly)."""
        return round(sum(self.laps().values()), 2)


def job_instructions(job: Job) -> int:
    """Scalar binary32 instructions the whole job executes (every element's program, every step)."""
    per_step = sum(n.desc.numel * n.desc.num_steps for n in job.program.graph.nodes)
    return per_step * job.spec.steps


def cheater_strategy(job: Job, seed: int, cheat: str | None, cheat_level: int | None) -> str:
    if cheat and cheat.startswith("micro:"):
        trainer_plan(cheat, job, seed)  # refuses a site that changes nothing, before any bot runs
        return cheat
    if cheat:
        f = check_fault(job, parse_cheat(cheat))
        honest, lying = TrainingWorld.from_job(job), TrainingWorld.from_job(job, f)
        if honest.step_commitment(job.spec.steps) == lying.step_commitment(job.spec.steps):
            raise StrategyError(f"--cheat {cheat}: the flipped value is never read on the way to C_T (e.g. a loss "
                                "value, or a gradient a ReLU masks), so the 'cheater' submits the right result; "
                                "pick another site")
    elif cheat_level is not None and cheat_level != 4:
        return CHEAT_LEVELS[cheat_level]
    elif job.spec.kind == "inference":  # the lie is one logit of the batch of prompts
        f = draw_fault(job, seed, node=job.program.graph.named["output"])
    else:
        f = draw_fault(job, seed, labels=CHEAT_NODES.get(job.spec.name, ()))
    return f"bitflip:{f.step}:{f.node}:{f.element}:{f.bit}"


def cheat_in_words(strategy: str, job: Job) -> str:
    """What the cheating trainer does, in a sentence (the log's announcement and the picture's caption)."""
    name, *args = strategy.split(":")
    unit = "inference batch" if job.spec.kind == "inference" else "training step"

    def node(d: str) -> str:
        return f"node {d} ('{job.program.graph.nodes[int(d)].label}')"

    if name == "bitflip" and len(args) >= 4:
        s, d, e, b = args[:4]
        return (f"the cheating trainer flipped bit {b} of element {e} of {node(d)} at {unit} {s} and carried on from "
                "the wrong value, so the C_T it submitted is not the job's")
    if name == "micro" and len(args) >= 4:
        s, d, e, j = args[:4]
        return f"the cheating trainer got instruction {j} of element {e} of {node(d)} wrong at {unit} {s}"
    if name == "lazy":
        return ("the cheating trainer ran only part of the job and claimed its last state for every later step, "
                "which it cannot justify when asked for a node")
    if name == "silent":
        return "the cheating trainer submitted a wrong result, then never answered the dispute"
    return f"the cheating trainer plays {strategy!r} (docs/agents.md)"


class LiveView:
    """Prints each game's interval whenever a move narrows it (replaying states block by block)."""

    def __init__(self, games: DisputeGameClient, job: Job, start_block: int) -> None:
        self.games = games
        self.job = job
        self.next_block = start_block
        self.shown: dict[int, str] = {}
        self.last: dict[int, GameView] = {}

    def __call__(self) -> None:
        latest = self.games.w3.eth.block_number
        for gid in range(1, self.games.game_count() + 1):
            for _, v in game_trace(self.games, gid, self.next_block, latest):
                prev = self.last.get(gid)
                done = settled(prev, v) if prev is not None else None
                self.last[gid] = v
                if done is not None:
                    print(f"[game {gid}] L{done.level} settled on {done.unit} [{done.lo}, {done.hi}]", flush=True)
                iv = interval(v)
                text = str(iv) if iv else f"resolved ({v.resolution.name})"
                if iv and iv.level == 2:
                    text += f"  step {v.step}"
                if iv and iv.level >= 3:
                    node = self.job.program.graph.nodes[v.node_index]
                    text += f"  step {v.step}, node {v.node_index} ({node.label})"
                if iv and iv.level == 4 and v.phase == Phase.L4_STEP:
                    text += f"  element {v.element}: one instruction left"
                if self.shown.get(gid) != text:
                    self.shown[gid] = text
                    print(f"[game {gid}] {text}", flush=True)
        self.next_block = latest + 1


def _net_wei(bot: Bot) -> int:
    """What a bot got back from the market minus what it paid in (gas excluded)."""
    w3 = bot.w3
    paid_in = 0
    for t in bot.store.txs(("mined",)):
        paid_in += int(w3.eth.get_transaction(HexStr(t.hash))["value"])
    got = sum(int(e.args["amount"]) for e in bot.market.logs("Withdrawn", 0) if e.args["account"] == bot.address)
    return got - paid_in


def run_demo(json_out: bool = False, seed: int = 0, cheat: str | None = None, cheat_level: int | None = None,
             job_kind: str = "digits", steps: int | None = None, out: Path | None = None,
             explorer_port: int | None = None, explorer_hold: bool = False) -> int:
    """``explorer_port``: serve the live explorer of this run there (0: any free port) while it
    plays, and with ``explorer_hold`` after it ends too, until Ctrl-C."""
    clock = Stopwatch(IMPORTED_AT)
    clock.lap("imports")
    out = Path(out or Path("build") / "demo")
    state = out / "state"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    artifacts = compile_contracts()
    clock.lap("compile")
    with Anvil() as node, ExitStack() as serving:
        w3 = node.web3()
        record, _ = deploy_full_system(w3, artifacts, node.rpc_url)
        deploy_gas = sum(int(w3.eth.get_block(b)["gasUsed"]) for b in range(1, w3.eth.block_number + 1))
        market_addr = record.contracts["JobMarket"]
        print(f"[chain] Anvil {node.rpc_url}; JobMarket {market_addr}, DisputeGame {record.contracts['DisputeGame']}, "
              f"ScalarVM {record.contracts['ScalarVM']} ({deploy_gas} gas to deploy)", flush=True)
        if explorer_port is not None:
            from verde_chain.explorer.cli import start_explorer

            site = serving.enter_context(start_explorer(node.rpc_url, market_addr, artifacts, state / "bundles",
                                                        port=explorer_port))
            print(f"[explorer] watch this run live at {site.url}", flush=True)
        clock.lap("chain")

        def cfg(name: str, index: int, strategy: str = "honest") -> BotConfig:
            return BotConfig(node.rpc_url, market_addr, index, str(state / f"{name}.sqlite"), str(state / "bundles"),
                             strategy, seed, name)

        client = ClientBot(w3, artifacts, cfg("client", 1))
        offer = JobOffer(kind=job_kind, steps=steps or DEFAULT_STEPS[job_kind])
        job_id = client.post(offer)
        market = Market.at(w3, artifacts, market_addr)
        job = client.bundles.fetch(market.job(job_id).terms.spec_hash)
        strategy = cheater_strategy(job, seed, cheat, cheat_level)
        print(f"[demo] {cheat_in_words(strategy, job)} (strategy {strategy})", flush=True)
        honest = TrainerBot(w3, artifacts, cfg("trainer-honest", 2))
        cheater = TrainerBot(w3, artifacts, cfg("trainer-cheat", 3, strategy))
        challenger = ChallengerBot(w3, artifacts, cfg("challenger", 4))
        bots: list[Bot] = [client, honest, cheater, challenger]
        view = LiveView(challenger.games, job, w3.eth.block_number + 1)
        conductor = Conductor(w3, artifacts, market_addr, bots, on_round=view)
        clock.lap("job")
        conductor.run(lambda: (client.store.job(job_id) or {}).get("state") == "done"
                      and all(g.get("done") for b in bots for g in b.store.games().values()))
        # the bots' runs of the whole job (both trainers, the challenger's re-execution) happen
        # inside the conductor's rounds; the rest of them is the market and the game
        clock.split("bots", "training", sum(p.train_s for b in bots for p in b.plans.values()), "dispute")
        report = _report(w3, market, job, job_id, bots, deploy_gas, challenger, out, strategy)
        clock.lap("report")
        report["times_s"] = clock.laps()
        report["wall_s"] = clock.total()
        report["time_jumps"] = conductor.time_jumps
        _print_report(report)
        if json_out:
            print(json.dumps(report, sort_keys=True))
        if explorer_port is not None and explorer_hold:
            print(f"[explorer] still serving {site.url}; Ctrl-C to stop", flush=True)
            with suppress(KeyboardInterrupt):
                while node.running:
                    time.sleep(0.5)
    return 0 if report["honest_won"] else 1


def _report(w3: Any, market: Market, job: Job, job_id: int, bots: list[Bot], deploy_gas: int,
            challenger: ChallengerBot, out: Path, strategy: str) -> dict[str, Any]:
    _client, honest, cheater, _ = bots
    chain_job = market.job(job_id)
    slots = {b.name: market.slot(job_id, market.slot_of(job_id, b.address)) for b in (honest, cheater)}
    games = challenger.store.games()
    game_ids = sorted(set(games) | set(cheater.store.games()) | set(honest.store.games()))
    winners = {gid: challenger.games.game(gid).winner for gid in game_ids}
    honest_side = {honest.address, challenger.address}
    honest_won = (
        chain_job.status == JobStatus.FINALIZED
        and slots["trainer-honest"].status == SlotStatus.SETTLED
        and slots["trainer-cheat"].status == SlotStatus.REJECTED
        and chain_job.accepted_result == slots["trainer-honest"].result
        and bool(game_ids) and all(w in honest_side for w in winners.values())
    )
    net = {b.name: _net_wei(b) for b in bots}
    honest_won = honest_won and net["trainer-honest"] > 0 and net["challenger"] >= 0
    gas = {b.name: b.store.gas_used() for b in bots}
    gas["deployer"] = deploy_gas
    moves: Counter[str] = Counter()
    per_party: Counter[str] = Counter()
    referee: dict[str, Any] = {}
    for b in bots:
        for t in b.store.txs(("mined",)):
            if t.game_id is None or t.kind == "claimTimeout":
                continue
            moves[f"L{t.level}"] += 1
            per_party[b.name] += 1
            if t.kind == "step":
                tx = w3.eth.get_transaction(HexStr(t.hash))
                # the step transaction also carries the market's settlement of the game (rejecting
                # the result, assigning and burning the stake): reported apart from the proof
                referee = {"step_gas": t.gas_used, "settlement_gas": gas_in_calls_to(w3, t.hash, market.address),
                           "step_calldata_bytes": len(tx["input"]), "stepped_by": b.name}
    png = out / "bisection.png"
    first = game_ids[0] if game_ids else None
    caption = None
    if first is not None:
        rec = challenger.store.game(first) or cheater.store.game(first) or {}
        trace = game_trace(challenger.games, first, int(rec.get("block", 0)))
        final = trace[-1][1]
        last_step = [v for _, v in trace if v.phase == Phase.L4_STEP]
        if last_step:
            v = last_step[-1]
            node = job.program.graph.nodes[v.node_index]
            referee.update(step=v.step, node=v.node_index, node_label=node.label, element=v.element,
                           micro_step=v.lo, micro_steps=v.micro_steps)
        referee["resolution"] = final.resolution.name
        names = {side: _party(addr, bots) for side, addr in (("defender", final.defender),
                                                              ("challenger", final.challenger))}
        winner = names["defender" if final.winner == final.defender else "challenger"]
        caption = _caption(strategy, job, referee, names, winner)
        plot_bisection(trace, str(png), f"Dispute {first}: the {names['challenger']} against the "
                       f"{names['defender']}; the {winner} won ({final.resolution.name})", names, caption)
    total_instr = job_instructions(job)
    return {
        "honest_won": honest_won,
        "job": job.spec.name, "steps": job.spec.steps, "nodes": len(job.program.graph.nodes),
        "cheater_strategy": strategy,
        "accepted_result": "0x" + chain_job.accepted_result.hex(),
        "game_winners": {str(g): ("challenger" if w == challenger.address else "defender") for g, w in winners.items()},
        "gas_by_party": gas, "total_gas": sum(gas.values()),
        "net_wei_by_party": net,
        "moves_by_level": dict(sorted(moves.items())), "moves_by_party": dict(per_party),
        "max_moves_per_party": max(per_party.values(), default=0),
        "referee": {**referee, "instructions_executed_on_chain": 1 if "step_gas" in referee else 0},
        "job_instructions": total_instr,
        "picture": str(png) if png.exists() else None,
        "picture_caption": caption,
    }


def _party(address: str, bots: list[Bot]) -> str:
    """Who an address is in the demo, in words."""
    names = {"trainer-honest": "honest trainer", "trainer-cheat": "cheating trainer", "challenger": "honest challenger",
             "client": "client"}
    return next((names.get(b.name, b.name) for b in bots if b.address == address), address)


def _caption(strategy: str, job: Job, referee: dict[str, Any], names: dict[str, str], winner: str) -> str:
    """The picture's caption: the cheat, how the game ended, what that cost the loser."""
    cheat = cheat_in_words(strategy, job)
    how = {
        "STEP": (f"the four levels narrowed {job.spec.steps} steps down to step {referee.get('step')}, node "
                 f"{referee.get('node')} ('{referee.get('node_label')}'), element {referee.get('element')} and "
                 f"micro-step {referee.get('micro_step')} of {referee.get('micro_steps')}; the ScalarVM executed "
                 "that one binary32 instruction on chain"),
        "TIMEOUT": "a party's chess clock ran out before it moved",
    }.get(referee.get("resolution", ""), f"the game was resolved by {referee.get('resolution')}")
    lost = (f"the {names['defender']} forfeited its stake" if winner == names["challenger"]
            else f"the {names['challenger']} forfeited its bond")
    return (f"{cheat[0].upper()}{cheat[1:]}. The {names['challenger']} re-executed the job, disagreed and opened "
            f"this dispute against the {names['defender']}: {how}. The {winner} won; {lost}.")


def _print_report(r: dict[str, Any]) -> None:
    print("\n=== report ===")
    print(f"honest side won: {r['honest_won']}   job {r['job']} ({r['steps']} steps, {r['nodes']} nodes), "
          f"cheater: {r['cheater_strategy']}")
    print(f"games: {r['game_winners']}   accepted C_T {r['accepted_result'][:18]}...")
    gas = ", ".join(f"{k} {v:,}" for k, v in r["gas_by_party"].items())
    print(f"gas by party:   {gas}  (total {r['total_gas']:,})")
    print("net wei:        " + ", ".join(f"{k} {v / 1e18:+.2f} ETH" for k, v in r["net_wei_by_party"].items()))
    print(f"moves by level: {r['moves_by_level']}   by party: {r['moves_by_party']}")
    ref = r["referee"]
    if ref.get("step_gas"):
        print(f"referee: ONE binary32 instruction (micro-step {ref.get('micro_step')} of {ref.get('micro_steps')}, "
              f"element {ref.get('element')} of node {ref.get('node')} '{ref.get('node_label')}' at step "
              f"{ref.get('step')}) in {ref['step_gas']:,} gas ({ref['settlement_gas']:,} of it the market's settlement) "
              f"with {ref['step_calldata_bytes']} bytes of calldata, "
              f"against {r['job_instructions']:,} instructions in the job (1 in {r['job_instructions']:,})")
    else:
        print(f"referee: resolved by {ref.get('resolution')} without executing an instruction; the job has "
              f"{r['job_instructions']:,} instructions")
    parts = " + ".join(f"{TIME_PARTS[k]} {v}" for k, v in r["times_s"].items())
    print(f"wall time {r['wall_s']} s = {parts}")
    print(f"picture: {r['picture']}")

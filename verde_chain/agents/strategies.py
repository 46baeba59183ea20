"""Honest and adversarial behaviour of trainers and challengers, chosen by ``--strategy``.

A bot is dishonest in one of two ways (as in ``verde_chain/dispute/players.py``): through its
*World* (the execution it believes and commits to) or through its *conduct* in the game.

  trainer strategies
    honest                          correct execution, consistent play
    lazy[:K]                        runs only K steps (default T//2) and claims C_K for every later step
    poison[:K]                      trains on tampered batches from step K (default 1)
    bitflip[:STEP:NODE:ELEM[:BIT]]  flips one bit of one output element of one node at one step and
                                    carries on from there; without a site, one is drawn from --seed
    inconsistent                    honest claims at every level but a different final C_T
                                    (its L1 claims cannot be justified at L2)
    garbage                         a bit-flip cheat that posts random claims in the bisections
    silent[:N]                      a bit-flip cheat that stops moving after N moves in a game
  challenger strategies
    honest                          re-executes, disputes every result that differs from its own
    lying[:STEP:NODE:ELEM[:BIT]]    believes a faulty execution and disputes honest results
    random                          honest execution, uniformly random bisection choices
    silent[:N]                      a lying challenger that stops after N moves
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verde_chain.agents.errors import StrategyError
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute.cheats import TruncatedWorld
from verde_chain.dispute.players import PlayStyle
from verde_chain.dispute.world import World
from verde_chain.graph.world import OutputFault, TrainingWorld
from verde_chain.job import Job


class TrainerStrategy(enum.StrEnum):
    HONEST = "honest"
    LAZY = "lazy"
    POISON = "poison"
    BITFLIP = "bitflip"
    INCONSISTENT = "inconsistent"
    GARBAGE = "garbage"
    SILENT = "silent"
    MICRO = "micro"


class ChallengerStrategy(enum.StrEnum):
    HONEST = "honest"
    LYING = "lying"
    RANDOM = "random"
    SILENT = "silent"


@dataclass
class Plan:
    """What a bot believes and how it plays: its World, the players' style, an optional move
    budget after which it goes silent, and the final commitment it submits."""

    world: World
    style: PlayStyle = PlayStyle.CONSISTENT
    silent_after: int | None = None
    fault: OutputFault | None = None
    tamper_result: bool = False
    train_s: float = 0.0  # seconds spent in ``train`` (the demo's time breakdown)

    def result(self) -> bytes:
        c_t = self.world.step_commitment(self.world.num_steps)
        return keccak256(b"inconsistent" + c_t) if self.tamper_result else c_t


def parse(strategy: str, allowed: type[enum.StrEnum]) -> tuple[str, list[int]]:
    """``NAME[:INT[:INT...]]`` -> (NAME, [INT, ...]); NAME must be one of `allowed`."""
    name, *rest = strategy.split(":")
    choices = [s.value for s in allowed]
    if name not in choices:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(choices)}", strategy=strategy)
    try:
        return name, [int(x) for x in rest]
    except ValueError as exc:
        raise StrategyError(f"strategy {strategy!r}: parameters must be integers") from exc


def parse_cheat(text: str) -> OutputFault:
    """``step:node:element[:bit]`` (the demo's ``--cheat``)."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not all(p.lstrip("-").isdigit() for p in parts):
        raise StrategyError(f"--cheat wants step:node:element[:bit], got {text!r}")
    s, d, e, *b = (int(p) for p in parts)
    return OutputFault(s, d, e, b[0] if b else 0)


def honest_world(job: Job) -> TrainingWorld:
    return TrainingWorld.from_job(job)


def check_fault(job: Job, f: OutputFault) -> OutputFault:
    nodes = job.program.graph.nodes
    if not 1 <= f.step <= job.spec.steps:
        raise StrategyError(f"cheat step {f.step} not in 1..{job.spec.steps}")
    if not 0 <= f.node < len(nodes):
        raise StrategyError(f"cheat node {f.node} not in 0..{len(nodes) - 1}")
    if not 0 <= f.element < nodes[f.node].desc.numel:
        raise StrategyError(f"cheat element {f.element} not in 0..{nodes[f.node].desc.numel - 1} of node {f.node}")
    if not 0 <= f.bit < 32:
        raise StrategyError(f"cheat bit {f.bit} not in 0..31")
    return f


def draw_fault(job: Job, seed: int, honest_result: bytes | None = None, node: int | None = None,
               labels: tuple[str, ...] = ()) -> OutputFault:
    """A cheat site drawn from `seed` that changes the final commitment (a flip in a value nothing
    later reads, e.g. the reported loss of the last step, would change C_s but not C_T, and nobody
    could tell the cheater from an honest trainer at the market's level); `node` fixes the node
    (an inference job's logits); `labels` keeps the nodes whose label starts with one of these
    (e.g. ``conv``, ``batch_norm``)."""
    rng = random.Random(seed)
    nodes = [n for n in job.program.graph.nodes
             if not n.label.startswith("batch:") and (not labels or n.label.startswith(labels))]
    if node is not None:
        nodes = [job.program.graph.nodes[node]]
    if not nodes:
        raise StrategyError(f"no node labelled {labels} to cheat at")
    want = honest_result or honest_world(job).step_commitment(job.spec.steps)
    for _ in range(64):
        site = rng.choice(nodes)
        f = OutputFault(rng.randint(1, job.spec.steps), site.index, rng.randrange(site.desc.numel), rng.randrange(31))
        if TrainingWorld.from_job(job, f).step_commitment(job.spec.steps) != want:
            return f
    raise StrategyError(f"no cheat site found from seed {seed} that changes C_T")


def _fault_from(job: Job, args: list[int], seed: int) -> OutputFault:
    if not args:
        return draw_fault(job, seed)
    if len(args) not in (3, 4):
        raise StrategyError("a cheat site is STEP:NODE:ELEM[:BIT]")
    return check_fault(job, OutputFault(args[0], args[1], args[2], args[3] if len(args) == 4 else 0))


PlanBuilder = Callable[[Job, list[int], int], Plan]  # (job, the strategy's integer parameters, seed)


def _lazy(job: Job, args: list[int], seed: int) -> Plan:
    T = job.spec.steps
    k = args[0] if args else max(0, T // 2)
    if not 0 <= k < T:
        raise StrategyError(f"lazy:K wants 0 <= K < {T}")
    return Plan(TruncatedWorld(honest_world(job), k))


def _faulty(job: Job, site: list[int], seed: int, style: PlayStyle = PlayStyle.CONSISTENT,
            silent_after: int | None = None) -> Plan:
    """A bit-flip cheat at ``site`` (STEP:NODE:ELEM[:BIT], or one drawn from `seed`)."""
    f = _fault_from(job, site, seed)
    return Plan(TrainingWorld.from_job(job, f), style, silent_after, fault=f)


def _micro(job: Job, args: list[int], seed: int) -> Plan:
    """micro:STEP:NODE:ELEM:J[:BIT]: instruction J (1..N) of one element computes a wrong result
    (bit BIT, default 30, flipped) and the trainer keeps it, so the dispute ends on instruction J
    (a LOAD, an FMA, ...) instead of the element's last one."""
    from verde_chain.dispute.cheats import CheatError, MicroFault, MicroStepWorld

    if len(args) not in (4, 5):
        raise StrategyError("micro wants STEP:NODE:ELEM:J[:BIT]")
    f = check_fault(job, OutputFault(args[0], args[1], args[2], args[4] if len(args) == 5 else 30))
    n = job.program.graph.nodes[f.node].desc.num_steps
    if not 1 <= args[3] <= n:
        raise StrategyError(f"micro-step {args[3]} not in 1..{n} of node {f.node}")
    world = MicroStepWorld(job.program.graph, job.init_state, job.batch, job.spec.steps,
                           micro_fault=MicroFault(f.step, f.node, f.element, args[3], f.bit))
    try:
        world.step_commitment(job.spec.steps)
    except CheatError as exc:
        raise StrategyError(str(exc)) from exc
    return Plan(world)


def _silent(job: Job, args: list[int], seed: int) -> Plan:
    """silent[:N[:SITE]]: a cheat (at SITE, or one drawn from the seed) that stops after N moves."""
    return _faulty(job, args[1:], seed, silent_after=args[0] if args else 2)


TRAINER_PLANS: dict[TrainerStrategy, PlanBuilder] = {
    TrainerStrategy.HONEST: lambda job, args, seed: Plan(honest_world(job)),
    TrainerStrategy.LAZY: _lazy,
    TrainerStrategy.POISON: lambda job, args, seed: Plan(poisoned_world(job, args[0] if args else 1)),
    TrainerStrategy.BITFLIP: lambda job, args, seed: _faulty(job, args, seed),
    TrainerStrategy.INCONSISTENT: lambda job, args, seed: Plan(honest_world(job), tamper_result=True),
    TrainerStrategy.GARBAGE: lambda job, args, seed: _faulty(job, args, seed, PlayStyle.GARBAGE),
    TrainerStrategy.SILENT: _silent,
    TrainerStrategy.MICRO: _micro,
}
CHALLENGER_PLANS: dict[ChallengerStrategy, PlanBuilder] = {
    ChallengerStrategy.HONEST: lambda job, args, seed: Plan(honest_world(job)),
    ChallengerStrategy.LYING: lambda job, args, seed: _faulty(job, args, seed),
    ChallengerStrategy.RANDOM: lambda job, args, seed: Plan(honest_world(job), PlayStyle.RANDOM),
    ChallengerStrategy.SILENT: _silent,
}


def trainer_plan(strategy: str, job: Job, seed: int = 0) -> Plan:
    name, args = parse(strategy, TrainerStrategy)
    return TRAINER_PLANS[TrainerStrategy(name)](job, args, seed)


def challenger_plan(strategy: str, job: Job, seed: int = 0) -> Plan:
    name, args = parse(strategy, ChallengerStrategy)
    return CHALLENGER_PLANS[ChallengerStrategy(name)](job, args, seed)


def poisoned_world(job: Job, from_step: int) -> TrainingWorld:
    """Trains on batches whose first sample's features are shifted by 0.5 from `from_step` on.
    Its batch roots differ from the job's, so it can never justify a BATCH input on chain."""

    def batches(s: int) -> np.ndarray:
        b = np.array(job.batch(s), dtype=np.float32, copy=True)
        if s >= from_step:
            width = int(np.prod(job.dataset.X.shape[1:]))
            b[:width] += np.float32(0.5)
        return b

    return TrainingWorld(job.program.graph, job.init_state, batches, job.spec.steps)


ProgressFn = Callable[[int, int], None]


def train(plan: Plan, progress: ProgressFn | None = None) -> bytes:
    """Run every step of the plan's World (reporting progress) and return what it will submit."""
    T = plan.world.num_steps
    t0 = time.perf_counter()
    for s in range(1, T + 1):
        plan.world.step_commitment(s)
        if progress:
            progress(s, T)
    result = plan.result()
    plan.train_s += time.perf_counter() - t0
    return result

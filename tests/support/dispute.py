"""Helpers of the dispute tests: a game environment on Anvil, driving a game to a phase, bounds,
and one game over a real training job (the real DisputeGame refereed by the real ScalarVM)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.toy import ToyJob, ToyWorld
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.tx import call
from verde_chain.commit.tensor import LEAF_ELEMS
from verde_chain.dispute import bisection, runner
from verde_chain.dispute import players as pl
from verde_chain.dispute.types import GameParams, GameView, Phase, Resolution, Seen
from verde_chain.dispute.world import World
from verde_chain.errors import ContractRevert
from verde_chain.graph.data import batch_root_list
from verde_chain.graph.world import TrainingWorld

CLOCK = 3600
NUMELS = (1, 129, 300)  # 1, 2 and 3 output leaves (3: a padding leaf in the output tree)
MICRO = (0, 1, 7, 20)  # N = 0 (empty program), 1 (direct step), small and larger traces


@dataclass(repr=False)
class Env:
    """A DisputeGame on its stepper, created through a ResolverMock, with two parties."""

    w3: Any
    artifacts: Any
    client: DisputeGameClient
    stepper: Any
    resolver: Any
    defender: str
    challenger: str

    @classmethod
    def deploy(cls, w3: Any, deploy: Callable[..., Any], artifacts: Any, stepper: str = "ToyStepper") -> Env:
        st = deploy(stepper)
        game = deploy("DisputeGame", st.address)
        return cls(w3, artifacts, DisputeGameClient(w3, game, artifacts), st, deploy("ResolverMock"),
                   w3.eth.accounts[1], w3.eth.accounts[2])

    def create(self, job: ToyJob, final: bytes, k: int = 4, clock: int = CLOCK, ckpt: int = 1) -> int:
        """A game over a toy job whose defender claims C_T = `final` (level 1 on checkpoint grid `ckpt`)."""
        return self.create_from(job, ToyWorld(job).step_commitment(0), final, k, clock, ckpt)

    def create_from(self, job: Any, c0: bytes, final: bytes, k: int = 4, clock: int = CLOCK, ckpt: int = 1) -> int:
        """A game over any job with graph_root/batch_root/num_steps/num_nodes, from C_0 to C_T = `final`."""
        p = GameParams(self.defender, self.challenger, c0, final, job.num_steps, job.graph_root, job.batch_root, k,
                       clock, job.num_nodes, ckpt)
        return self.client.create_game_via(self.resolver, p)

    def play(self, gid: int, dworld: World, cworld: World, dstrat: str = "consistent", cstrat: str = "consistent",
             seed: int = 0) -> runner.Outcome:
        return runner.play(self.client, gid, pl.Defender(dworld, dstrat, seed), pl.Challenger(cworld, cstrat, seed),
                           lambda s: increase_time(self.w3, s))

    def callbacks(self, gid: int) -> list[tuple[str, str, str]]:
        return [tuple(c) for c in call(self.resolver.functions.callbacks(gid), self.artifacts)]

    def expect(self, gid: int, out: runner.Outcome, winner: str, resolution: Resolution | None = None) -> None:
        loser = self.challenger if winner == self.defender else self.defender
        assert out.winner == winner, (out.resolution, out.reverts)
        if resolution is not None:
            assert out.resolution == resolution
        # the resolver was called back exactly once, by the game, with the right parties
        assert self.callbacks(gid) == [(self.client.contract.address, winner, loser)]

    def advance_to(self, gid: int, liar: World, honest: World, lying_defender: bool, target: Phase) -> bool:
        """Play until the game reaches `target`; False if this game never passes through it."""
        dworld, cworld = (liar, honest) if lying_defender else (honest, liar)
        d, c = pl.Defender(dworld), pl.Challenger(cworld)
        seen = Seen()
        for _ in range(200):
            v = self.client.game(gid)
            if v.phase == target:
                return True
            if v.phase == Phase.RESOLVED:
                return False
            player = d if v.phase.mover.name == "DEFENDER" else c
            sender = v.defender if player is d else v.challenger
            move = player.move(v, seen)
            assert move is not None
            seen = runner.apply(self.client, gid, move, sender, v.phase.level, seen)
        raise AssertionError("game too long")


def revert(fn: Callable[[], Any]) -> ContractRevert:
    """The ContractRevert `fn` raises (fails the test if it does not revert)."""
    with pytest.raises(ContractRevert) as err:
        fn()
    return err.value


def within_bound(out: runner.Outcome, job: ToyJob, k: int, ckpt: int = 1) -> None:
    leaves = max(-(-n.numel // LEAF_ELEMS) for n in job.nodes)
    micro = max(max(n.micro_steps for n in job.nodes), 1)
    b = bisection.move_bound(job.num_steps, job.num_nodes, leaves, micro, k, ckpt)
    # +1: the winner of a timeout game also sends claimTimeout
    assert out.total_moves("defender") <= b.defender + 1
    assert out.total_moves("challenger") <= b.challenger + 1


@dataclass
class Played:
    out: runner.Outcome
    final: GameView
    events: list[str]
    defender: str
    challenger: str


def play_real(w3: Any, deploy: Any, artifacts: Any, dworld: TrainingWorld, cworld: World, *,
              steps: int, arity: int, clock: int, dstrat: str = "consistent", cstrat: str = "consistent") -> Played:
    """Play one game over a real training job with the real DisputeGame and ScalarVM, through a
    ResolverMock; checks that the resolver heard the result exactly once, with the right parties."""
    env = Env.deploy(w3, deploy, artifacts, "ScalarVM")
    g = dworld.graph
    params = GameParams(
        env.defender, env.challenger, dworld.step_commitment(0), dworld.step_commitment(steps), steps, g.root(),
        batch_root_list(dworld.batch_roots), arity, clock, len(g.nodes),
    )
    gid = env.client.create_game_via(env.resolver, params)
    out = runner.play(env.client, gid, pl.Defender(dworld, dstrat, seed=1), pl.Challenger(cworld, cstrat, seed=1),
                      lambda s: increase_time(w3, s))
    env.expect(gid, out, out.winner)
    assert out.final is not None
    return Played(out, out.final, [n for n, _ in env.client.history(gid)], env.defender, env.challenger)

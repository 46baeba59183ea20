"""Games over a small real-kernel job (verde_chain/dispute/kernel_world.py) refereed by the real
ScalarVM: a lying defender is narrowed to its faulty instruction and convicted by the one-step
proof; an honest defender beats a lying, randomly choosing challenger."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.support.dispute import Env
from verde_chain.dispute.cheats import MicroFault
from verde_chain.dispute.kernel_world import KernelJob, KernelWorld
from verde_chain.dispute.types import Resolution


def test_kernel_world_diverges_only_from_its_micro_fault() -> None:
    job = KernelJob(3, seed=1)
    desc = job.nodes[1][0]
    honest, liar = KernelWorld(job), KernelWorld(job, MicroFault(2, 1, 5, desc.num_steps, bit=0))
    assert [honest.step_commitment(s) == liar.step_commitment(s) for s in range(3)] == [True, True, False]
    n = liar.micro_steps(2, 1)
    same = [honest.micro_state(2, 1, 5, j) == liar.micro_state(2, 1, 5, j) for j in range(n + 1)]
    assert same == [j < n for j in range(n + 1)]


@pytest.mark.chain
@pytest.mark.parametrize("seed", range(3))
def test_games_refereed_by_scalar_vm(w3, deploy, artifacts, seed: int) -> None:  # type: ignore[no-untyped-def]
    env = Env.deploy(w3, deploy, artifacts, "ScalarVM")
    rng = random.Random(seed)
    job = KernelJob(3, seed=seed)
    honest = KernelWorld(job)
    d = rng.randrange(job.num_nodes)
    desc = job.nodes[d][0]
    fault = MicroFault(3, d, rng.randrange(desc.numel), rng.randrange(1, desc.num_steps + 1), bit=0)
    liar = KernelWorld(job, fault)
    if liar.step_commitment(3) == honest.step_commitment(3):  # the flipped register was dead
        fault = replace(fault, micro=desc.num_steps)
        liar = KernelWorld(job, fault)
    assert liar.step_commitment(3) != honest.step_commitment(3)
    # lying defender vs honest challenger: narrowed to the faulty instruction, the VM convicts it
    gid = env.create_from(job, honest.step_commitment(0), liar.step_commitment(3), 2)
    out = env.play(gid, liar, honest)
    env.expect(gid, out, env.challenger, Resolution.STEP)
    assert out.final is not None and (out.final.node_index, out.final.element) == (fault.node, fault.element)
    assert out.final.lo == fault.micro - 1
    # honest defender vs lying (random-choosing) challenger
    gid = env.create_from(job, honest.step_commitment(0), honest.step_commitment(3), 4)
    out = env.play(gid, honest, liar, cstrat="random", seed=seed)
    env.expect(gid, out, env.defender)



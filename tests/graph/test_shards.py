"""S micro-batch shards in the canonical program: the encoding, the graph and the combination node."""

from __future__ import annotations

import numpy as np
import pytest
from eth_abi import decode as abi_decode

from verde_chain.examples.digits import digits_job
from verde_chain.graph.distributed import shard_ranges
from verde_chain.graph.errors import GraphError, JobSpecError
from verde_chain.job import SPEC_TYPES, Job, JobSpec
from verde_chain.vm import scalarvm as vm


@pytest.fixture(scope="module")
def one() -> Job:
    return digits_job(steps=2)


@pytest.fixture(scope="module")
def four() -> Job:
    return digits_job(steps=2, shards=4)


def _head_words(spec: JobSpec) -> int:
    """abi.encode of a tuple with dynamic fields starts with the offset of the first: its head size."""
    return int.from_bytes(spec.encode()[:32], "big") // 32


def test_one_shard_keeps_the_encoding_and_more_append_one_field(one: Job, four: Job) -> None:
    assert _head_words(one.spec) == 16 and "shards" not in one.spec.to_json()
    assert _head_words(four.spec) == 17 and four.spec.to_json()["shards"] == 4
    assert abi_decode([*SPEC_TYPES, "uint256"], four.spec.encode())[-1] == 4
    for job in (one, four):
        back = JobSpec.from_json(job.spec.to_json())
        assert back == job.spec and back.hash() == job.spec.hash()
    assert one.spec.hash() != four.spec.hash()


def test_shard_blocks_repeat_the_step_and_combine_in_fixed_order(one: Job, four: Job) -> None:
    g1, g4 = one.program.graph, four.program.graph
    assert g1.shard_blocks == ()
    blocks = g4.shard_blocks
    assert len(blocks) == 4 and all(hi - lo == blocks[0][1] - blocks[0][0] for lo, hi in blocks)
    # the same kernels but the unpacks (x and labels: each shard reads its own part of the batch)
    same = [[n.desc_hash for n in g4.nodes[lo + 2 : hi]] for lo, hi in blocks]
    assert same[0] == same[3] and g4.nodes[blocks[0][0]].desc_hash != g4.nodes[blocks[3][0]].desc_hash
    combines = [n for n in g4.nodes if n.label.startswith("combine:")]
    assert {n.label for n in combines} == {"combine:loss"} | {f"combine:{s.name}" for s in g4.states
                                                                if s.role == "param"}
    # each combination reads one tensor of every shard's block, in shard order
    for n in combines:
        owners = [next(k for k, (lo, hi) in enumerate(blocks) if lo <= s.index < hi) for s in n.inputs]
        assert owners == [0, 1, 2, 3]


def test_combination_is_the_ascending_sum_over_s_and_the_scalarvm_agrees(four: Job) -> None:
    g = four.program.graph
    res = four.make_run(steps=1, checkpoint_interval=0).exec.run_step(
        four.make_run(steps=1).init, four.batch(1))
    node = next(n for n in g.nodes if n.label == "combine:0.weight")
    ins = [res.outputs[s.index] for s in node.inputs]
    want = (((ins[0] + ins[1]) + ins[2]) + ins[3]) / np.float32(4)
    assert want.dtype == np.float32
    assert res.outputs[node.index].view(np.uint32).tolist() == want.view(np.uint32).tolist()
    for e in (0, 17, len(want) - 1):  # the referee's softfloat runs the same program to the same bits
        assert vm.run_states(node.desc, ins, e)[-1].regs[0] == int(want.view(np.uint32)[e])


def test_sharded_step_is_the_full_batch_step_up_to_rounding(one: Job, four: Job) -> None:
    r1 = one.make_run(steps=1).exec.run_step(one.make_run(steps=1).init, one.batch(1))
    r4 = four.make_run(steps=1).exec.run_step(four.make_run(steps=1).init, four.batch(1))
    assert four.spec.batch_size == one.spec.batch_size
    assert r4.output(four.program.graph, "loss") == pytest.approx(r1.output(one.program.graph, "loss"), rel=1e-5)
    g1 = r1.outputs[one.program.graph.named["grad:0.weight"]]
    g4 = r4.outputs[four.program.graph.named["grad:0.weight"]]
    np.testing.assert_allclose(g4, g1, rtol=1e-4, atol=1e-6)
    assert r1.commitment != r4.commitment


def test_shards_are_refused_where_they_cannot_split() -> None:
    with pytest.raises(JobSpecError, match="does not split into 5 equal shards"):
        digits_job(steps=1, shards=5)
    with pytest.raises(GraphError, match="3 workers for 2 shards"):
        shard_ranges(2, 3)
    assert shard_ranges(4, 3) == [range(1), range(1, 2), range(2, 4)]

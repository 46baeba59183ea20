"""A dispute over the shards' combination: a trainer that sums the shards' gradients wrongly is
convicted at the combination node by the on-chain ScalarVM executing one of its instructions."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dispute import play_real
from verde_chain.dispute.types import Resolution
from verde_chain.examples.digits import digits_job
from verde_chain.graph.world import OutputFault, TrainingWorld


@pytest.mark.chain
def test_a_wrong_combination_loses_at_the_combine_node(w3: Any, deploy: Any, artifacts: Any) -> None:
    job = digits_job(steps=3, shards=2, checkpoint_interval=1)
    node = next(n for n in job.program.graph.nodes if n.label == "combine:2.weight")
    assert len(node.inputs) == 2 and node.desc.num_steps == 5  # LOAD LOAD ADD CONST DIV
    liar = TrainingWorld.from_job(job, OutputFault(2, node.index, 3, 7))
    g = play_real(w3, deploy, artifacts, liar, TrainingWorld.from_job(job), steps=3, arity=4, clock=600)
    assert g.out.winner == g.challenger and g.out.resolution == Resolution.STEP, (g.out.resolution, g.out.reverts)
    v = g.final
    assert (v.step, v.node_index, v.element) == (2, node.index, 3)
    assert "Stepped" in g.events and v.lo == node.desc.num_steps - 1  # the DIV, executed on chain

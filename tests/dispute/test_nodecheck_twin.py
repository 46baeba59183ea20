"""NodeCheck.sol (contracts/dispute/) against its Python twin verde_chain/dispute/nodecheck.py: the
referee's L2 decision on good and tampered node reveals, on the same game state. Both must refuse a
reveal with the same custom error, name and fields (Merkle failures come from CommitErrors.sol)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.support.dispute import NUMELS, Env
from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute.nodecheck import check_node
from verde_chain.dispute.types import Phase
from verde_chain.errors import CustomError


def decoded(fn: Callable[[], Any]) -> tuple[str, dict[str, object]] | None:
    """(name, fields) of the custom error `fn` raises (a twin's or a decoded revert), None if none."""
    try:
        fn()
    except CustomError as err:
        return err.decoded
    return None


@pytest.mark.chain
@pytest.mark.parametrize("node", [0, 2, 3])  # sources: (batch, prev) / (node, prev, batch) / (node, prev, node)
def test_referee_twin_on_tampered_reveals(env: Env, node: int) -> None:
    job = ToyJob(5, default_graph(5, NUMELS, (3, 5)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("micro", 4, node, 0, 1))
    gid = env.create(job, liar.step_commitment(5), 2)
    assert env.advance_to(gid, liar, honest, True, Phase.L2_REVEAL)
    v = env.client.game(gid)
    assert (v.step, v.cursor) == (4, node)
    good = liar.node_reveal(v.step, v.cursor)

    def flip(b: bytes) -> bytes:
        return bytes([b[0] ^ 1]) + b[1:]

    def with_proof(i: int, p: Any) -> Any:
        return replace(good, input_proofs=good.input_proofs[:i] + (p,) + good.input_proofs[i + 1:])

    cases = {
        "output root": replace(good, output_root=flip(good.output_root)),
        "desc": replace(good, desc=good.desc + b"\x00"),
        "graph sibling": replace(good, graph_proof=(flip(good.graph_proof[0]),) + good.graph_proof[1:]),
        "graph proof length": replace(good, graph_proof=good.graph_proof[:-1]),
        "sources": replace(good, sources=good.sources[::-1]),
        "missing proof": replace(good, input_proofs=good.input_proofs[:-1]),
    }
    for i, p in enumerate(good.input_proofs):
        cases[f"input {i} sibling"] = with_proof(i, replace(p, proof=(flip(p.proof[0]),) + p.proof[1:]))
        if p.batch_roots:
            roots = (flip(p.batch_roots[0]),) + p.batch_roots[1:]
            cases[f"input {i} batch"] = with_proof(i, replace(p, batch_roots=roots))
        else:
            two = replace(p.node, output_roots=p.node.output_roots * 2)
            cases[f"input {i} outputs"] = with_proof(i, replace(p, node=two))
            other = replace(p.node, desc_hash=flip(p.node.desc_hash))
            cases[f"input {i} preimage"] = with_proof(i, replace(p, node=other))
    seen_names = set()
    for label, bad in cases.items():
        py = decoded(lambda bad=bad: check_node(v, node, bad))
        sol = decoded(lambda bad=bad: env.client.reveal_node(gid, bad, env.defender))
        assert py == sol and py is not None, (label, py, sol)
        seen_names.add(py[0])
    assert {"NodeMismatch", "InvalidProof", "BadProofLength", "InputCountMismatch", "BadOutputCount"} <= seen_names
    assert check_node(v, node, good) == keccak256(good.desc)
    env.client.reveal_node(gid, good, env.defender)
    assert env.client.game(gid).phase in (Phase.L3_POST, Phase.L3_CHUNK)


@pytest.mark.chain
def test_referee_twin_on_unjustified_input(env: Env) -> None:
    job = ToyJob(5, default_graph(5, NUMELS, (3,)))
    honest, liar = ToyWorld(job), ToyWorld(job, Fault("input", 3, 2))
    gid = env.create(job, liar.step_commitment(5), 4)
    assert env.advance_to(gid, liar, honest, True, Phase.L2_REVEAL)
    v = env.client.game(gid)
    bad = liar.node_reveal(v.step, v.cursor)
    py = decoded(lambda: check_node(v, v.cursor, bad))
    sol = decoded(lambda: env.client.reveal_node(gid, bad, env.defender))
    assert py == sol and py is not None and py[0] == "InputNotJustified"

"""Python twin of ``contracts/dispute/NodeCheck.sol``: the referee's L2 decision on a revealed node.

Bots run it before sending ``revealNode`` (a reveal that would revert costs gas and time), and the
differential test runs it against the contract on the same (good and tampered) reveals. A refused
reveal raises ``CustomError`` with the name and fields the contract reverts with: DisputeErrors.sol
for the node rules, CommitErrors.sol (``CommitmentError``: InvalidProof, BadProofLength,
IndexOutOfRange) for the Merkle openings.

    preimage   node_hash(d, keccak(desc), inputRoots, [outputRoot]) == leaf d of C_hi
    structure  structure_leaf(d, keccak(desc), sources) is leaf d of graphRoot
    inputs     NodeOutput(d' < d): output of node d' opened in C_hi
               PrevStepNodeOutput(d'): output of node d' opened in C_lo
               Batch(b): entry b of the step's batch list opened at leaf step-1 of batchRoot

The structure and batch leaves are the graph's own encodings (``graph.structure.structure_leaf``,
``graph.data.batch_leaf``), defined once.
"""

from __future__ import annotations

from verde_chain.commit import merkle, tensor
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute.types import GameView, InputProof, NodeReveal
from verde_chain.errors import CustomError
from verde_chain.graph.data import batch_leaf
from verde_chain.graph.structure import SourceKind, structure_leaf


def check_node(v: GameView, d: int, r: NodeReveal) -> bytes:
    """Raise like NodeCheck.check would for leaf `d` of game `v`; return the descriptor hash."""
    desc_hash = keccak256(r.desc)
    h = tensor.node_hash(d, desc_hash, r.input_roots, [r.output_root])
    if h != v.node:
        raise CustomError("NodeMismatch", computed=h, expected=v.node)
    merkle.verify(v.graph_root, structure_leaf(d, desc_hash, r.sources), d, v.num_nodes, list(r.graph_proof))
    n = len(r.input_roots)
    for count in (len(r.sources), len(r.input_proofs)):
        if count != n:
            raise CustomError("InputCountMismatch", given=n, expected=count)
    for i, ((kind, index), claimed, p) in enumerate(zip(r.sources, r.input_roots, r.input_proofs)):
        justify(v, d, i, SourceKind(kind), index, claimed, p)
    return desc_hash


def justify(v: GameView, d: int, i: int, kind: SourceKind, index: int, claimed: bytes, p: InputProof) -> None:
    """NodeCheck.justify: input ``i``'s claimed root is the one its source opens to."""
    if kind == SourceKind.BATCH:
        merkle.verify(v.batch_root, batch_leaf(p.batch_roots), v.step - 1, v.num_steps, list(p.proof))
        if index >= len(p.batch_roots):
            raise CustomError("BatchIndexOutOfRange", index=index, count=len(p.batch_roots))
        justified = p.batch_roots[index]
    else:
        if kind == SourceKind.NODE_OUTPUT:
            if index >= d:
                raise CustomError("SourceNotEarlier", input=i, source=index, node=d)
            root = v.disputed_state
        else:
            root = v.agreed_state
        if len(p.node.output_roots) != 1:
            raise CustomError("BadOutputCount", count=len(p.node.output_roots))
        leaf = tensor.node_hash(index, p.node.desc_hash, p.node.input_roots, p.node.output_roots)
        merkle.verify(root, leaf, index, v.num_nodes, list(p.proof))
        justified = p.node.output_roots[0]
    if justified != claimed:
        raise CustomError("InputNotJustified", input=i, claimed=claimed, justified=justified)

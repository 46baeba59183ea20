// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "../commit/Merkle.sol";
import {TensorCommit} from "../commit/TensorCommit.sol";
import {Game, InputSource, InputProof, NodeReveal} from "./GameTypes.sol";
import {SourceKind} from "./SourceKind.sol";
import {
    NodeMismatch,
    InputCountMismatch,
    SourceNotEarlier,
    BadOutputCount,
    BatchIndexOutOfRange,
    InputNotJustified
} from "./DisputeErrors.sol";

/// @title NodeCheck — the referee's L2 decision on a revealed node (twin: verde_chain/dispute/nodecheck.py)
/// @notice A node revealed at leaf d of the disputed step commitment C_hi is accepted only if
///
///   preimage   keccak(abi.encode(d, keccak(desc), inputRoots, [outputRoot])) == leaf d of C_hi
///   structure  keccak(abi.encode(d, keccak(desc), sources)) is leaf d of graphRoot (the client's)
///   inputs     every input root equals what its source justifies:
///                NodeOutput(d' < d)       output of node d' opened in C_hi (earlier: accepted)
///                PrevStepNodeOutput(d')   output of node d' opened in C_lo (agreed)
///                Batch(b)                 entry b of the step's batch, opened in batchRoot at step-1
///
/// Anything else reverts, so a defender that cannot justify its node cannot move and loses on time.
library NodeCheck {
    /// @notice Run every L2 check on `r` for leaf `d`; return the node's descriptor hash.
    function check(Game storage g, uint256 d, NodeReveal calldata r) internal view returns (bytes32 descHash) {
        descHash = keccak256(r.desc);
        bytes32[] memory outs = new bytes32[](1);
        outs[0] = r.outputRoot;
        bytes32 h = TensorCommit.nodeHash(d, descHash, r.inputRoots, outs);
        // INVARIANT (L2 binding to L1): the node is leaf d of the disputed C_hi.
        if (h != g.node) revert NodeMismatch(h, g.node);
        // INVARIANT: op, attributes and wiring are the client's, not the defender's choice.
        Merkle.verify(g.graphRoot, keccak256(abi.encode(d, descHash, r.sources)), d, g.numNodes, r.graphProof);
        uint256 n = r.inputRoots.length;
        if (r.sources.length != n) revert InputCountMismatch(n, r.sources.length);
        if (r.inputProofs.length != n) revert InputCountMismatch(n, r.inputProofs.length);
        for (uint256 i = 0; i < n; ++i) {
            justify(g, d, i, r.sources[i], r.inputRoots[i], r.inputProofs[i]);
        }
    }

    /// @notice Revert unless input i's claimed root is what its graph-given source says it is.
    function justify(
        Game storage g,
        uint256 d,
        uint256 i,
        InputSource calldata src,
        bytes32 claimed,
        InputProof calldata p
    ) internal view {
        bytes32 justified;
        if (src.kind == SourceKind.Batch) {
            // SAFETY: the batch of step s is leaf s - 1 of the job's batch list; no other batch fits.
            Merkle.verify(g.batchRoot, keccak256(abi.encode(p.batchRoots)), g.step - 1, g.numSteps, p.proof);
            if (src.index >= p.batchRoots.length) revert BatchIndexOutOfRange(src.index, p.batchRoots.length);
            justified = p.batchRoots[src.index];
        } else {
            bytes32 root;
            if (src.kind == SourceKind.NodeOutput) {
                // INVARIANT: same-step inputs come from earlier nodes, which the challenger
                // accepted by descending to the first node where it disagrees.
                if (src.index >= d) revert SourceNotEarlier(i, src.index, d);
                root = g.disputedState;
            } else {
                // Previous-step outputs are opened in the agreed C_lo.
                root = g.agreedState;
            }
            if (p.node.outputRoots.length != 1) revert BadOutputCount(p.node.outputRoots.length);
            bytes32 leaf = TensorCommit.nodeHash(src.index, p.node.descHash, p.node.inputRoots, p.node.outputRoots);
            Merkle.verify(root, leaf, src.index, g.numNodes, p.proof);
            justified = p.node.outputRoots[0];
        }
        if (justified != claimed) revert InputNotJustified(i, claimed, justified);
    }
}

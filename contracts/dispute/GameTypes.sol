// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {SourceKind} from "./SourceKind.sol";

/// @title GameTypes — the dispute game's enums and structs (twin: verde_chain/dispute/types.py)
/// @notice Levels of one game (each bound to the one above, see docs/protocol.md "Dispute game"):
///
///   L1 steps     k-ary bisection over [0, T]            -> agreed C_lo, disputed C_hi (hi = lo + 1)
///   L2 node      k-ary descent of C_hi's node tree      -> node d, revealed and justified
///   L3 element   k-ary descent of node d's output tree  -> chunk revealed, element e, value v
///   L4 micro     k-ary bisection over [0, N] states     -> agreed s_j, disputed s_{j+1}
///   step         IStepper.step(ctx, s_j preimage)       -> equals s_{j+1}? defender wins : challenger wins

/// @notice Which party a move, a clock or a resolution belongs to.
enum Side {
    Defender,
    Challenger
}

/// @notice Where a game stands. The party to move is a function of the phase only (see `mover`).
enum Phase {
    None, //          no such game
    L1Post, //        defender posts the split-point step commitments
    L1Choose, //      challenger picks a sub-interval
    L2Post, //        defender reveals the next layers of C_hi's node tree below the cursor
    L2Choose, //      challenger picks a child (the leftmost one that differs from its own tree)
    L2Reveal, //      defender reveals node d's preimage, structure and input justifications
    L3Post, //        defender reveals the next layers of the output tensor tree
    L3Choose, //      challenger picks a child that differs
    L3Chunk, //       defender reveals the 512-byte leaf chunk under the cursor
    L3Element, //     challenger names an element of the chunk
    L4Start, //       defender reveals its final micro-state (binds s_N to the element's value)
    L4Post, //        defender posts the split-point micro-state hashes
    L4Choose, //      challenger picks a sub-interval
    L4Step, //        anyone executes the one disputed micro-step (the defender's clock runs)
    Resolved //       over; `winner` is set
}

/// @notice Why a game ended.
enum Resolution {
    Step, //          the one-step proof decided
    Timeout, //       the party to move ran out of clock
    Padding, //       the descent ended on padding (beyond the tree's size or the tensor's numel)
    EmptyProgram //   the element's program has no steps and the final state is the initial one
}

/// @notice Where a node's input comes from: a SourceKind (dispute/SourceKind.sol, generated from
///         verde_chain/graph/structure.py) and an index. NodeOutput: output of node `index` < d of
///         the same step (in C_hi); PrevStepNodeOutput: output of node `index` of the previous step
///         (in C_lo, agreed); Batch: tensor `index` of the step's batch (in the job's batchRoot).
struct InputSource {
    SourceKind kind;
    uint32 index;
}

/// @notice What the creator (the job market) hands the game. All fields bind the game to the job.
struct GameParams {
    address defender; //          the party whose claim C_T is disputed
    address challenger; //        the party that disagrees
    bytes32 initialCommitment; // C_0, fixed by the job
    bytes32 finalCommitment; //   C_T, the defender's submission
    uint64 numSteps; //           T >= 1
    bytes32 graphRoot; //         Merkle root over structure leaves keccak(abi.encode(d, descHash, InputSource[]))
    bytes32 batchRoot; //         Merkle root over T leaves keccak(abi.encode(bytes32[] batchTensorRoots of step s))
    uint32 arity; //              k: a power of two in [2, 256]
    uint64 clockSeconds; //       each party's chess-clock budget (every game has its own clock)
    uint32 numNodes; //           nodes per step: size of every C_s tree and of the graph tree
    uint64 checkpointInterval; // N >= 1: level 1 splits at multiples of N first (Bisection.grid)
}

/// @notice Preimage of a node hash (TensorCommit.nodeHash) other than its index.
struct NodePreimage {
    bytes32 descHash;
    bytes32[] inputRoots;
    bytes32[] outputRoots;
}

/// @notice Justification of one input root of the revealed node. Which fields are used depends
///         on the input's kind: NodeOutput/PrevStepNodeOutput open `node` at the source index in
///         C_hi/C_lo with `proof`; Batch opens keccak(abi.encode(batchRoots)) at leaf step-1 of
///         the job's batchRoot with `proof` and takes batchRoots[index].
struct InputProof {
    NodePreimage node;
    bytes32[] batchRoots;
    bytes32[] proof;
}

/// @notice The defender's L2 reveal of node d (the leaf the descent ended on).
struct NodeReveal {
    bytes desc; //                the kernel descriptor; descHash = keccak256(desc)
    bytes32[] inputRoots;
    bytes32 outputRoot; //        a primitive node has exactly one output
    InputSource[] sources; //     the node's wiring, checked against graphRoot
    bytes32[] graphProof; //      opens the structure leaf d in graphRoot
    InputProof[] inputProofs; //  one per input
}

/// @notice Each party's remaining time and when the current turn began.
struct ChessClock {
    uint64 defenderLeft;
    uint64 challengerLeft;
    uint64 turnStartedAt;
}

/// @notice Everything the game stores. Search state is shared by the levels:
///         bisection levels (L1, L4) use lo/hi/claimLo/claimHi; descent levels (L2, L3) use
///         cursor (node index at the current depth), depthLeft and node (its hash).
struct Game {
    address defender;
    address challenger;
    address resolver;
    Phase phase;
    uint32 arity;
    uint32 numNodes;
    uint64 numSteps;
    uint64 checkpointInterval;
    bytes32 initialCommitment;
    bytes32 finalCommitment;
    bytes32 graphRoot;
    bytes32 batchRoot;
    ChessClock clock;
    // -- current search ---------------------------------------------------------------------
    uint256 lo;
    uint256 hi;
    bytes32 claimLo;
    bytes32 claimHi;
    bytes32 pending; //           keccak256(abi.encode(claims)) of the defender's last post
    uint256 cursor;
    uint256 depthLeft;
    bytes32 node;
    // -- L1 result ----------------------------------------------------------------------------
    uint64 step; //               hi of the final L1 interval; C_lo = agreedState, C_hi = disputedState
    bytes32 agreedState;
    bytes32 disputedState;
    // -- L2 result ----------------------------------------------------------------------------
    uint32 nodeIndex;
    bytes32 descHash;
    bytes32 outputRoot;
    uint256 outputNumel;
    uint256 microSteps; //        N, from the stepper
    bytes32[] inputRoots;
    // -- L3 result ----------------------------------------------------------------------------
    uint64 element;
    uint32 value;
    // -- outcome ------------------------------------------------------------------------------
    address winner;
    Resolution resolution;
}

// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "../commit/Merkle.sol";
import {TensorCommit} from "../commit/TensorCommit.sol";
import {BadChunkLength} from "../commit/CommitErrors.sol";
import {Bisection} from "./Bisection.sol";
import {NodeCheck} from "./NodeCheck.sol";
import {Clock} from "./Clock.sol";
import {
    Side,
    Phase,
    Resolution,
    GameParams,
    NodeReveal,
    ChessClock,
    Game
} from "./GameTypes.sol";
import {IStepper, StepContext} from "../vm/IStepper.sol";
import {IDisputeResolver} from "./IDisputeResolver.sol";
import "./DisputeErrors.sol";

/// @title DisputeGame — the four-level refereed bisection game (client: verde_chain/chain/dispute_client.py)
/// @notice One contract hosts every game. A game decides a single question: is the defender's
///         final commitment C_T correct? Only the defender posts claims; the challenger only
///         chooses where it disagrees. Turn order (D = defender, C = challenger):
///
///   L1  D postClaims  <-> C choose         until hi = lo + 1       (k-ary bisection over steps)
///   L2  D postClaims  <-> C choose         until a leaf d of C_hi  (k-ary Merkle descent)
///       D revealNode                                              (structure + input justification)
///   L3  D postClaims  <-> C choose         until a leaf of the output tree
///       D revealChunk  -> C chooseElement                          (element e, value v)
///   L4  D revealFinalState                                         (s_N must yield v)
///       D postClaims  <-> C choose         until [j, j+1]          (k-ary bisection over states)
///       anyone: step                                               (stepper decides)
///   any time: claimTimeout when the party to move has run out of clock
///
/// The creator of a game (the job market) is its resolver and is called back once, last.
/// The game holds no funds; it only reports who won.
contract DisputeGame {
    using Clock for ChessClock;

    uint256 internal constant BISECT_MASK = (1 << uint8(Phase.L1Post)) | (1 << uint8(Phase.L2Post))
        | (1 << uint8(Phase.L3Post)) | (1 << uint8(Phase.L4Post));
    uint256 internal constant CHOOSE_MASK = (1 << uint8(Phase.L1Choose)) | (1 << uint8(Phase.L2Choose))
        | (1 << uint8(Phase.L3Choose)) | (1 << uint8(Phase.L4Choose));

    /// @notice The machine the last level's one-step proof runs on.
    IStepper public immutable stepper;
    /// @notice Number of games created; ids are 1..gameCount.
    uint256 public gameCount;
    mapping(uint256 gameId => Game) internal _games;

    event GameCreated(
        uint256 indexed gameId,
        address indexed defender,
        address indexed challenger,
        address resolver,
        bytes32 initialCommitment,
        bytes32 finalCommitment,
        uint64 numSteps,
        uint32 numNodes,
        uint32 arity,
        uint64 clockSeconds,
        uint64 checkpointInterval
    );
    /// @notice Defender's claims at the split points of [lo, hi] (levels 1 and 4).
    event Bisected(uint256 indexed gameId, uint8 level, uint256 lo, uint256 hi, bytes32[] claims);
    /// @notice Defender's layer of tree nodes below `cursor`, `depthLeft` levels above the leaves
    ///         (levels 2 and 3).
    event SubtreeRevealed(uint256 indexed gameId, uint8 level, uint256 cursor, uint256 depthLeft, bytes32[] nodes);
    /// @notice Challenger's choice. Bisection levels: the new [lo, hi]. Descent levels: the new
    ///         cursor as `lo` and the levels left as `hi`.
    event Chosen(uint256 indexed gameId, uint8 level, uint256 choice, uint256 lo, uint256 hi);
    event NodeRevealed(
        uint256 indexed gameId,
        uint256 step,
        uint256 node,
        bytes32 descHash,
        bytes32[] inputRoots,
        bytes32 outputRoot,
        uint256 outputNumel,
        uint256 microSteps
    );
    /// @notice Defender's leaf chunk `leafIndex` of the output tensor (128 elements).
    event ElementRevealed(uint256 indexed gameId, uint256 leafIndex, bytes chunk);
    event ElementChosen(uint256 indexed gameId, uint256 element, uint32 value);
    event FinalStateRevealed(
        uint256 indexed gameId, bytes32 initialState, bytes32 finalState, uint256 microSteps, bytes finalPreimage
    );
    event Stepped(
        uint256 indexed gameId, address caller, uint256 microStep, bytes32 preState, bytes32 postState, bytes32 claimed
    );
    event Resolved(uint256 indexed gameId, address indexed winner, address indexed loser, Resolution resolution);

    constructor(IStepper stepper_) {
        stepper = stepper_;
    }

    // -- creation ---------------------------------------------------------------------------------

    /// @notice Open a game; the caller becomes its resolver (called back on resolution).
    function createGame(GameParams calldata p) external returns (uint256 gameId) {
        if (p.defender == address(0) || p.challenger == address(0) || p.defender == p.challenger) {
            revert InvalidParties(p.defender, p.challenger);
        }
        // SAFETY: descent levels reveal log2(k) tree levels per round; k must be a power of two.
        if (p.arity < 2 || p.arity > 256 || (p.arity & (p.arity - 1)) != 0) revert InvalidArity(p.arity);
        if (p.numSteps == 0 || p.numNodes == 0 || p.clockSeconds == 0 || p.checkpointInterval == 0) {
            revert InvalidGameSize(p.numSteps, p.numNodes, p.clockSeconds, p.checkpointInterval);
        }
        // SAFETY: the resolution callback to a code-less address would revert every final move.
        if (msg.sender.code.length == 0) revert ResolverNotContract(msg.sender);
        gameId = ++gameCount;
        Game storage g = _games[gameId];
        g.defender = p.defender;
        g.challenger = p.challenger;
        g.resolver = msg.sender;
        g.arity = p.arity;
        g.numNodes = p.numNodes;
        g.numSteps = p.numSteps;
        g.checkpointInterval = p.checkpointInterval;
        g.initialCommitment = p.initialCommitment;
        g.finalCommitment = p.finalCommitment;
        g.graphRoot = p.graphRoot;
        g.batchRoot = p.batchRoot;
        g.clock.start(p.clockSeconds);
        // INVARIANT (L1 binding to the job): the first state is the job's C_0, the last the
        // defender's submission; neither party chooses them.
        g.hi = p.numSteps;
        g.claimLo = p.initialCommitment;
        g.claimHi = p.finalCommitment;
        emit GameCreated(
            gameId,
            p.defender,
            p.challenger,
            msg.sender,
            p.initialCommitment,
            p.finalCommitment,
            p.numSteps,
            p.numNodes,
            p.arity,
            p.clockSeconds,
            p.checkpointInterval
        );
        if (p.numSteps == 1) _enterL2(g);
        else g.phase = Phase.L1Post;
    }

    // -- defender: claims and layers ---------------------------------------------------------------

    /// @notice Defender's round: the n - 1 split-point claims (L1, L4) or the 2^m nodes
    ///         m levels below the cursor (L2, L3).
    function postClaims(uint256 gameId, bytes32[] calldata claims) external {
        Game storage g = _begin(gameId, BISECT_MASK, false);
        Phase ph = g.phase;
        uint8 level = _level(ph);
        if (ph == Phase.L1Post || ph == Phase.L4Post) {
            Bisection.checkClaimCount(g.lo, g.hi, g.arity, _grid(g, ph), claims.length);
            emit Bisected(gameId, level, g.lo, g.hi, claims);
        } else {
            Bisection.checkSubtree(g.node, claims, Bisection.descentLevels(g.arity, g.depthLeft));
            emit SubtreeRevealed(gameId, level, g.cursor, g.depthLeft, claims);
        }
        g.pending = keccak256(abi.encode(claims));
        g.phase = Phase(uint8(ph) + 1);
    }

    // -- challenger: choices ------------------------------------------------------------------------

    /// @notice Challenger's round: pick sub-interval / child `choice` of the claims just posted
    ///         (resubmitted in full; the game stores only their hash).
    function choose(uint256 gameId, uint256 choice, bytes32[] calldata claims) external {
        Game storage g = _begin(gameId, CHOOSE_MASK, false);
        bytes32 h = keccak256(abi.encode(claims));
        // SAFETY: choices refer to this round's claims only; stale or forged vectors are refused.
        if (h != g.pending) revert ClaimsMismatch(h, g.pending);
        Phase ph = g.phase;
        uint8 level = _level(ph);
        if (ph == Phase.L1Choose || ph == Phase.L4Choose) {
            (g.lo, g.hi, g.claimLo, g.claimHi) =
                Bisection.narrow(g.lo, g.hi, g.arity, _grid(g, ph), g.claimLo, g.claimHi, claims, choice);
            emit Chosen(gameId, level, choice, g.lo, g.hi);
            if (g.hi - g.lo > 1) g.phase = Phase(uint8(ph) - 1);
            else if (ph == Phase.L1Choose) _enterL2(g);
            else g.phase = Phase.L4Step;
        } else {
            if (choice >= claims.length) revert ChoiceOutOfRange(choice, claims.length);
            uint256 m = Bisection.descentLevels(g.arity, g.depthLeft);
            g.cursor = (g.cursor << m) | choice;
            g.depthLeft -= m;
            g.node = claims[choice];
            emit Chosen(gameId, level, choice, g.cursor, g.depthLeft);
            if (g.depthLeft > 0) g.phase = Phase(uint8(ph) - 1);
            else if (ph == Phase.L2Choose) _nodeLeaf(gameId, g);
            else _chunkLeaf(gameId, g);
        }
    }

    // -- L2: the node --------------------------------------------------------------------------------

    /// @notice Defender reveals node d (the leaf the L2 descent ended on): its preimage, its
    ///         structure against the graph commitment and a justification for every input root.
    function revealNode(uint256 gameId, NodeReveal calldata r) external {
        Game storage g = _begin(gameId, 1 << uint8(Phase.L2Reveal), false);
        uint256 d = g.cursor;
        // INVARIANT (L2): preimage in C_hi, structure in the graph, every input justified.
        bytes32 descHash = NodeCheck.check(g, d, r);
        (uint256 numel, uint256 microSteps) = stepper.describe(r.desc);
        if (numel == 0) revert EmptyOutput(descHash);
        g.nodeIndex = uint32(d);
        g.descHash = descHash;
        g.outputRoot = r.outputRoot;
        g.outputNumel = numel;
        g.microSteps = microSteps;
        g.inputRoots = r.inputRoots;
        emit NodeRevealed(gameId, g.step, d, descHash, r.inputRoots, r.outputRoot, numel, microSteps);
        // INVARIANT (L3 binding to L2): the element search runs in this node's output tree.
        _startDescent(g, r.outputRoot, Merkle.depth(TensorCommit.leafCount(numel)), Phase.L3Post);
        if (g.depthLeft == 0) _chunkLeaf(gameId, g);
    }

    // -- L3: the element -------------------------------------------------------------------------------

    /// @notice Defender reveals the 512-byte chunk of the output leaf under the cursor.
    function revealChunk(uint256 gameId, bytes calldata chunk) external {
        Game storage g = _begin(gameId, 1 << uint8(Phase.L3Chunk), false);
        if (chunk.length != TensorCommit.LEAF_BYTES) revert BadChunkLength(chunk.length, TensorCommit.LEAF_BYTES);
        bytes32 h = keccak256(chunk);
        if (h != g.node) revert ChunkMismatch(h, g.node);
        emit ElementRevealed(gameId, g.cursor, chunk);
        g.phase = Phase.L3Element;
    }

    /// @notice Challenger names the element of the revealed chunk it disagrees with.
    function chooseElement(uint256 gameId, uint256 element, bytes calldata chunk) external {
        Game storage g = _begin(gameId, 1 << uint8(Phase.L3Element), false);
        bytes32 h = keccak256(chunk);
        if (h != g.node) revert ChunkMismatch(h, g.node);
        if (element / TensorCommit.LEAF_ELEMS != g.cursor) revert ElementNotInChunk(element, g.cursor);
        uint256 off = (element % TensorCommit.LEAF_ELEMS) * 4;
        uint32 bits = uint32(bytes4(chunk[off:off + 4]));
        emit ElementChosen(gameId, element, bits);
        if (element >= g.outputNumel) {
            // INVARIANT: padding elements are zero; a non-zero one is a lie by the defender.
            _resolve(gameId, g, bits != 0 ? Side.Challenger : Side.Defender, Resolution.Padding);
            return;
        }
        g.element = uint64(element);
        g.value = bits;
        g.phase = Phase.L4Start;
    }

    // -- L4: micro-steps and the one step ----------------------------------------------------------------

    /// @notice Defender reveals its final micro-state; it must decode to the element's value.
    function revealFinalState(uint256 gameId, bytes calldata desc, bytes calldata finalState) external {
        Game storage g = _begin(gameId, 1 << uint8(Phase.L4Start), false);
        StepContext memory ctx = _context(g, desc, 0);
        bytes32 s0 = stepper.initialStateHash(ctx);
        (bytes32 sn, uint32 v) = stepper.finalValue(finalState);
        bytes32 kh = keccak256(finalState);
        if (sn != kh) revert StateMismatch(sn, kh);
        // INVARIANT (L4 binding to L3): the last state of the bisection yields the opened value.
        if (v != g.value) revert FinalValueMismatch(g.value, v);
        uint256 n = g.microSteps;
        emit FinalStateRevealed(gameId, s0, kh, n, finalState);
        if (n == 0) {
            // No instruction to dispute: the value is the initial state's, fixed by the protocol.
            if (kh != s0) revert StateMismatch(kh, s0);
            _resolve(gameId, g, Side.Defender, Resolution.EmptyProgram);
            return;
        }
        // INVARIANT (L4 binding): the first state is fixed by the stepper, not by either party.
        g.lo = 0;
        g.hi = n;
        g.claimLo = s0;
        g.claimHi = kh;
        g.phase = n == 1 ? Phase.L4Step : Phase.L4Post;
    }

    /// @notice Execute the disputed micro-step [lo, lo + 1]. Anyone may call it (normally the
    ///         defender, whose clock runs); the stepper's post-state decides the game.
    function step(uint256 gameId, bytes calldata desc, bytes calldata preState, bytes calldata proof) external {
        Game storage g = _begin(gameId, 1 << uint8(Phase.L4Step), true);
        bytes32 pre = keccak256(preState);
        // INVARIANT: the step starts from the agreed state s_j, not from a state of the caller's choice.
        if (pre != g.claimLo) revert StateMismatch(pre, g.claimLo);
        StepContext memory ctx = _context(g, desc, g.lo);
        bytes32 post = stepper.step(ctx, preState, proof);
        emit Stepped(gameId, msg.sender, g.lo, pre, post, g.claimHi);
        _resolve(gameId, g, post == g.claimHi ? Side.Defender : Side.Challenger, Resolution.Step);
    }

    // -- timeouts ----------------------------------------------------------------------------------------

    /// @notice Anyone: end the game when the party to move has run out of clock; it loses.
    function claimTimeout(uint256 gameId) external {
        Game storage g = _games[gameId];
        Phase ph = g.phase;
        if (ph == Phase.None) revert UnknownGame(gameId);
        if (ph == Phase.Resolved) revert GameAlreadyResolved(gameId, g.winner);
        Side late = _mover(ph);
        g.clock.requireExpired(late);
        _resolve(gameId, g, late == Side.Defender ? Side.Challenger : Side.Defender, Resolution.Timeout);
    }

    // -- views -------------------------------------------------------------------------------------------

    function getGame(uint256 gameId) external view returns (Game memory) {
        return _games[gameId];
    }

    /// @notice The address whose move it is (address(0) once resolved or for unknown games).
    function turn(uint256 gameId) external view returns (address) {
        Game storage g = _games[gameId];
        if (g.phase == Phase.None || g.phase == Phase.Resolved) return address(0);
        return _mover(g.phase) == Side.Defender ? g.defender : g.challenger;
    }

    // -- internals ---------------------------------------------------------------------------------------

    /// @dev Common prologue of every move: the game exists and runs, the move belongs to the
    ///      phase, the caller is the party to move (unless anyone may move), and its clock is charged.
    function _begin(uint256 gameId, uint256 phaseMask, bool anyone) internal returns (Game storage g) {
        g = _games[gameId];
        Phase ph = g.phase;
        if (ph == Phase.None) revert UnknownGame(gameId);
        // INVARIANT: nothing moves a resolved game (no replays, no second resolution).
        if (ph == Phase.Resolved) revert GameAlreadyResolved(gameId, g.winner);
        if ((phaseMask & (1 << uint8(ph))) == 0) revert WrongPhase(gameId, uint8(ph));
        Side side = _mover(ph);
        address expected = side == Side.Defender ? g.defender : g.challenger;
        if (!anyone && msg.sender != expected) revert NotYourTurn(gameId, msg.sender, expected);
        g.clock.charge(side);
    }

    function _mover(Phase ph) internal pure returns (Side) {
        if (
            ph == Phase.L1Choose || ph == Phase.L2Choose || ph == Phase.L3Choose || ph == Phase.L3Element
                || ph == Phase.L4Choose
        ) return Side.Challenger;
        return Side.Defender;
    }

    /// @dev Grid step of a bisection level: L1 splits at the job's checkpoints first (claims the
    ///      trainer has stored), L4 evenly over micro-states.
    function _grid(Game storage g, Phase ph) internal view returns (uint256) {
        return ph <= Phase.L1Choose ? g.checkpointInterval : 1;
    }

    function _level(Phase ph) internal pure returns (uint8) {
        if (ph <= Phase.L1Choose) return 1;
        if (ph <= Phase.L2Reveal) return 2;
        if (ph <= Phase.L3Element) return 3;
        return 4;
    }

    /// @dev L1 is over: [lo, lo + 1]. C_lo is agreed, C_hi disputed; search C_hi's node tree.
    function _enterL2(Game storage g) internal {
        g.step = uint64(g.hi);
        g.agreedState = g.claimLo;
        g.disputedState = g.claimHi;
        // INVARIANT (L2 binding to L1): the descent starts at the disputed step commitment.
        _startDescent(g, g.claimHi, Merkle.depth(g.numNodes), Phase.L2Post);
        if (g.depthLeft == 0) g.phase = Phase.L2Reveal; // one node per step: leaf 0 is C_hi itself
    }

    function _startDescent(Game storage g, bytes32 root, uint256 depth, Phase post) internal {
        g.node = root;
        g.cursor = 0;
        g.depthLeft = depth;
        g.phase = post;
    }

    /// @dev The L2 descent reached leaf `cursor` of C_hi.
    function _nodeLeaf(uint256 gameId, Game storage g) internal {
        if (g.cursor >= g.numNodes) {
            // INVARIANT: leaves beyond numNodes are ZERO in every honest tree.
            _resolve(gameId, g, g.node != bytes32(0) ? Side.Challenger : Side.Defender, Resolution.Padding);
        } else {
            g.phase = Phase.L2Reveal;
        }
    }

    /// @dev The L3 descent reached leaf `cursor` of the output tensor tree.
    function _chunkLeaf(uint256 gameId, Game storage g) internal {
        if (g.cursor >= TensorCommit.leafCount(g.outputNumel)) {
            _resolve(gameId, g, g.node != bytes32(0) ? Side.Challenger : Side.Defender, Resolution.Padding);
        } else {
            g.phase = Phase.L3Chunk;
        }
    }

    function _context(Game storage g, bytes calldata desc, uint256 microStep)
        internal
        view
        returns (StepContext memory ctx)
    {
        bytes32 h = keccak256(desc);
        if (h != g.descHash) revert DescriptorMismatch(h, g.descHash);
        ctx = StepContext({
            descHash: h,
            desc: desc,
            inputRoots: g.inputRoots,
            element: g.element,
            microStep: microStep
        });
    }

    /// @dev Effects first, then the one interaction: the resolver callback.
    function _resolve(uint256 gameId, Game storage g, Side winnerSide, Resolution why) internal {
        (address w, address l) =
            winnerSide == Side.Defender ? (g.defender, g.challenger) : (g.challenger, g.defender);
        g.phase = Phase.Resolved;
        g.winner = w;
        g.resolution = why;
        emit Resolved(gameId, w, l, why);
        IDisputeResolver(g.resolver).onDisputeResolved(gameId, w, l);
    }
}

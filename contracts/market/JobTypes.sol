// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {InvalidJobTerms} from "./MarketErrors.sol";
import {GameParams} from "../dispute/GameTypes.sol";

/// @notice What a client posts. Times are unix seconds; amounts are in `token` units (wei for ETH).
/// @dev Twin: verde_chain.market.types.JobTerms (same field order; it is passed as one tuple).
struct JobTerms {
    address token; // payment/stake token; address(0) = ETH
    bytes32 specHash; // hash of the off-chain job description (ONNX model, optimizer, loss, ...)
    string bundleUri; // where the bundle hashing to specHash can be fetched (may be empty)
    bytes32 graphRoot; // Merkle root over per-node structure leaves of the training graph
    bytes32 initialCommitment; // C_0: step commitment of the initial state
    bytes32 batchRoot; // Merkle list root over the per-step batch roots
    uint64 numSteps; // T: training steps; the result is C_T
    uint64 checkpointInterval; // trainers keep every N-th step commitment (checkpoint list)
    uint256 reward; // paid by the client, split among accepted trainers
    uint256 trainerStake; // each trainer locks this to take a slot
    uint256 minChallengeBond; // an outside challenger locks at least this to open a dispute
    uint32 slots; // number of trainer slots (redundant trainers)
    uint64 submissionDeadline; // last second at which slots can be taken and results committed
    uint64 revealWindow; // seconds after submissionDeadline during which commitments are revealed
    uint64 challengeWindow; // seconds after the reveal deadline during which disputes can still be opened
    uint32 arity; // k of the k-ary searches in the dispute game (a power of two in [2, 256])
    uint64 clockSeconds; // chess-clock budget of each party in a dispute game
    uint32 numNodes; // nodes per training step: size of every C_s tree and of the graph tree
}

/// @notice Life of a job: Open until finalised; Finalized once the reward and stakes are settled.
enum JobStatus {
    None,
    Open,
    Finalized
}

/// @notice Life of a trainer slot.
///   Joined --commit--> Committed --reveal--> Revealed --beaten in a game--> Rejected
///   Joined/Committed/Revealed --finalize--> Settled   (a slot never revealed forfeits its stake)
enum SlotStatus {
    Empty,
    Joined,
    Committed,
    Revealed,
    Rejected,
    Settled
}

/// @notice A job as stored by the market.
struct Job {
    JobTerms terms;
    address client;
    JobStatus status;
    uint32 slotsTaken;
    uint32 activeDisputes; // games still being played; finalisation waits for zero
    uint256 rewardHeld; // reward still in escrow (zeroed at finalisation)
    bytes32 acceptedResult; // C_T accepted at finalisation (zero if none)
}

/// @notice One trainer's slot in a job.
struct Slot {
    address trainer;
    SlotStatus status;
    uint32 openAgainst; // games running against this result (they price the next dispute)
    uint32 openAsRival; // rival games this slot opened and still plays (its result is at stake there too)
    uint256 stakeHeld; // stake still in escrow; zeroed when forfeited or settled
    bytes32 commitment; // keccak256(abi.encode(result, checkpointRoot, salt, trainer))
    bytes32 result; // C_T claimed by the trainer (set at reveal)
    bytes32 checkpointRoot; // optional Merkle list root over its checkpoint commitments (set at reveal)
    uint256 beatenBy; // the earliest-opened game that beat this result (0: none)
    address beatenWinner; // that game's winner, paid the stake (less the burn) once no game of the slot runs
}

/// @notice Who opened a dispute: an outside challenger with a bond, or a rival trainer staking its slot.
enum DisputeKind {
    None,
    Outside,
    Rival
}

/// @notice A dispute = one game in the DisputeGame, defender = the disputed slot's trainer.
struct Dispute {
    uint256 jobId;
    DisputeKind kind;
    bool active;
    uint32 defenderSlot;
    uint32 challengerSlot; // rival disputes only
    address challenger;
    uint256 bond; // locked by every dispute; a rival also puts its own result (and stake) at risk
}

/// @notice Pure rules of the market, kept out of the contract so they can be tested and read alone.
library JobTypes {
    /// @notice Reject specs that would make a job unplayable or unpayable.
    function validate(JobTerms calldata s) internal pure {
        if (s.numSteps == 0) revert InvalidJobTerms("numSteps", s.numSteps);
        if (s.checkpointInterval == 0 || s.checkpointInterval > s.numSteps) {
            revert InvalidJobTerms("checkpointInterval", s.checkpointInterval);
        }
        if (s.slots == 0) revert InvalidJobTerms("slots", s.slots);
        // SAFETY: a zero stake would let anyone take every slot for free and block the job.
        if (s.trainerStake == 0) revert InvalidJobTerms("trainerStake", 0);
        // (clock, windows, deadline and bond are bounded by the market parameters: MarketRules.checkJob)
        // SAFETY: the game refuses these at createGame; a job it would refuse could never be
        // disputed, so a cheating trainer would be paid. Refuse such jobs up front.
        if (s.arity < 2 || s.arity > 256 || (s.arity & (s.arity - 1)) != 0) revert InvalidJobTerms("arity", s.arity);
        if (s.numNodes == 0) revert InvalidJobTerms("numNodes", 0);
        if (s.initialCommitment == bytes32(0)) revert InvalidJobTerms("initialCommitment", 0);
        if (s.graphRoot == bytes32(0)) revert InvalidJobTerms("graphRoot", 0);
    }

    /// @notice Last second at which commitments can be revealed.
    function revealDeadline(JobTerms storage s) internal view returns (uint256) {
        return uint256(s.submissionDeadline) + s.revealWindow;
    }

    /// @notice Last second at which disputes can be opened.
    function challengeDeadline(JobTerms storage s) internal view returns (uint256) {
        return uint256(s.submissionDeadline) + s.revealWindow + s.challengeWindow;
    }

    /// @notice What a trainer commits to: its result, checkpoint root and a secret salt, bound to
    ///         its own address so a copied commitment can never be revealed by anyone else.
    function commitment(bytes32 result, bytes32 checkpointRoot, bytes32 salt, address trainer)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(result, checkpointRoot, salt, trainer));
    }

    /// @notice Share of `reward` for the `rank`-th of `n` accepted trainers; the first gets the
    ///         remainder so the shares sum exactly to `reward` (no dust is left in the contract).
    function share(uint256 reward, uint256 n, uint256 rank) internal pure returns (uint256) {
        uint256 base = reward / n;
        return rank == 0 ? base + (reward - base * n) : base;
    }
}

/// @notice The one entry point of DisputeGame the market uses. The caller of createGame becomes
///         the game's resolver (IDisputeResolver), so the market needs no registration.
interface IMarketGame {
    function createGame(GameParams calldata p) external returns (uint256 gameId);
}

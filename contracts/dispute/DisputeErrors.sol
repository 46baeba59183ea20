// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice Errors of the dispute game (DisputeGame, Bisection, Clock, NodeCheck).
/// @dev verde_chain.chain.revert decodes them into ContractRevert (name + fields); the Python twins
///      (verde_chain/dispute/: bisection, clock, nodecheck) raise CustomError with the same ones.
///      `side` parameters are GameTypes.Side (0 = defender, 1 = challenger); `phase` is GameTypes.Phase.

// -- creation -----------------------------------------------------------------------------------
/// Defender and challenger must be two distinct non-zero addresses.
error InvalidParties(address defender, address challenger);
/// The arity k must be a power of two in [2, 256].
error InvalidArity(uint256 arity);
/// T (training steps), the nodes per step, the clock budget and the checkpoint interval must all be non-zero.
error InvalidGameSize(uint256 numSteps, uint256 numNodes, uint256 clockSeconds, uint256 checkpointInterval);

// -- turn order -----------------------------------------------------------------------------------
/// No game with this id was created.
error UnknownGame(uint256 gameId);
/// The game is over: no move, no second resolution.
error GameAlreadyResolved(uint256 gameId, address winner);
/// This move does not exist in the game's current phase (also what a replayed move hits).
error WrongPhase(uint256 gameId, uint8 phase);
/// The caller is not the party whose turn it is.
error NotYourTurn(uint256 gameId, address caller, address expected);
/// The party's clock ran out (it can no longer move; the other side claims the timeout).
error ClockExpired(uint8 side, uint256 elapsed, uint256 left);
/// A timeout was claimed while the party to move still has time.
error ClockNotExpired(uint8 side, uint256 elapsed, uint256 left);

// -- bisection and descent --------------------------------------------------------------------
/// The defender posted the wrong number of claims (or of subtree nodes).
error WrongClaimCount(uint256 actual, uint256 expected);
/// The challenger's choice is not one of the `count` sub-intervals or children.
error ChoiceOutOfRange(uint256 choice, uint256 count);
/// The claims the challenger resubmitted are not the ones the defender posted this round.
error ClaimsMismatch(bytes32 computed, bytes32 expected);
/// The revealed subtree layer does not fold back to the node under the cursor.
error SubtreeMismatch(bytes32 computed, bytes32 expected);

// -- L2 node reveal -------------------------------------------------------------------------------
/// keccak256 of the revealed descriptor differs from the descriptor hash it must match.
error DescriptorMismatch(bytes32 computed, bytes32 expected);
/// The revealed node preimage does not hash to the leaf the descent ended on.
error NodeMismatch(bytes32 computed, bytes32 expected);
/// A primitive node has exactly one output; an opened node had `count`.
error BadOutputCount(uint256 count);
/// The node reveal gives `given` input roots but `expected` sources (or input proofs).
/// (Same name and fields as VMErrors.InputCountMismatch: one selector must decode one way.)
error InputCountMismatch(uint256 given, uint256 expected);
/// A same-step input must come from an earlier node: source `source` is not below node `node`.
error SourceNotEarlier(uint256 input, uint256 source, uint256 node);
/// Input `input`'s claimed root differs from the root its source justifies.
error InputNotJustified(uint256 input, bytes32 claimed, bytes32 justified);
/// A batch input names tensor `index` of a step batch holding `count` tensors.
error BatchIndexOutOfRange(uint256 index, uint256 count);
/// The stepper reports an output tensor without elements.
error EmptyOutput(bytes32 descHash);

// -- L3 element -----------------------------------------------------------------------------------
/// The revealed (or resubmitted) chunk does not hash to the leaf under the cursor.
error ChunkMismatch(bytes32 computed, bytes32 expected);
/// The named element is not one of the 128 elements of leaf `leafIndex`.
error ElementNotInChunk(uint256 element, uint256 leafIndex);

// -- L4 and the step --------------------------------------------------------------------------
/// The revealed final state yields `opened`, not the element value `claimed` opened at L3.
error FinalValueMismatch(uint32 claimed, uint32 opened);
/// A revealed state preimage hashes to `computed` where the game holds `expected`.
error StateMismatch(bytes32 computed, bytes32 expected);
/// The creator of a game is its resolver and must be a contract (it is called back on resolution).
error ResolverNotContract(address resolver);

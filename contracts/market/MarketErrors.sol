// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice Errors of the JobMarket (jobs, stakes, submissions, disputes, payouts).
/// @dev Decoded into ContractRevert (name + fields) by verde_chain/chain/market_client.py. Every error here is used.

// -- deployment ------------------------------------------------------------------------------
/// A market parameter is unusable (`field` names it, see MarketRules.check; for `bondFloors`
/// `value` is the index of the offending entry).
error InvalidMarketParams(string field, uint256 value);

// -- job posting -----------------------------------------------------------------------------
/// A job field is malformed (`field` names it, see JobTypes.validate).
error InvalidJobTerms(string field, uint256 value);
/// A job field is outside the market's bounds [min, max] (see MarketRules.checkJob).
error TermsOutOfBounds(string field, uint256 value, uint256 min, uint256 max);
/// The market has no bond floor for this token, so jobs cannot pay in it.
error TokenNotAllowed(address token);
/// ETH sent with a call does not match what the call must pay (`expected` is 0 for ERC-20 jobs).
error WrongPayment(uint256 sent, uint256 expected);
/// An ERC-20 transfer delivered a different amount than requested (fee-on-transfer tokens are refused).
error TokenTransferShort(address token, uint256 received, uint256 expected);

// -- lookups --------------------------------------------------------------------------------
/// No job with this id exists.
error UnknownJob(uint256 jobId);
/// The slot index is not below the number of slots taken in this job.
error UnknownSlot(uint256 jobId, uint256 slot, uint256 slotsTaken);

// -- trainers -------------------------------------------------------------------------------
/// Every trainer slot of the job is taken.
error JobFull(uint256 jobId, uint256 slots);
/// This address already holds slot `slot` of the job.
error AlreadyJoined(uint256 jobId, address trainer, uint256 slot);
/// The caller holds no slot in this job.
error NotATrainer(uint256 jobId, address caller);
/// The submission deadline (joins and commits) has passed (`deadline` < `nowTs`).
error SubmissionClosed(uint256 jobId, uint256 deadline, uint256 nowTs);
/// The slot already committed; commitments cannot be replaced.
error AlreadyCommitted(uint256 jobId, uint256 slot);
/// A commitment of zero is reserved for "nothing committed".
error EmptyCommitment(uint256 jobId);
/// Reveals open after the submission deadline (`opensAfter` >= `nowTs`).
error RevealNotOpen(uint256 jobId, uint256 opensAfter, uint256 nowTs);
/// The reveal window has closed (`deadline` < `nowTs`).
error RevealClosed(uint256 jobId, uint256 deadline, uint256 nowTs);
/// The slot has no commitment waiting to be revealed (status as JobTypes.SlotStatus).
error NotCommitted(uint256 jobId, uint256 slot, uint8 status);
/// keccak256(abi.encode(result, checkpointRoot, salt, caller)) is not the slot's commitment.
error CommitmentMismatch(uint256 jobId, uint256 slot, bytes32 computed, bytes32 committed);
/// A result of zero is reserved for "nothing revealed".
error EmptyResult(uint256 jobId);

// -- disputes -------------------------------------------------------------------------------
/// The challenge window has closed (`deadline` < `nowTs`).
error ChallengeClosed(uint256 jobId, uint256 deadline, uint256 nowTs);
/// The disputed slot has no submitted, still-standing result (status as JobTypes.SlotStatus).
error NotDisputable(uint256 jobId, uint256 slot, uint8 status);
/// The bond is below what a dispute against this result costs now (see JobMarket.requiredBond).
error BondTooSmall(uint256 bond, uint256 minimum);
/// This challenger already disputed this result (one game per challenger and result).
error DuplicateDispute(uint256 jobId, uint256 slot, address challenger);
/// A party cannot dispute its own result.
error SelfDispute(uint256 jobId, uint256 slot);
/// Two rival trainers submitted the same result: there is nothing to dispute.
error SameResult(uint256 jobId, bytes32 result);
/// Only the dispute game may report a game's outcome.
error NotDisputeGame(address caller, address game);
/// The game id does not belong to an open dispute of this market.
error UnknownDispute(uint256 gameId);
/// The game returned an id that already belongs to a dispute of this market.
error GameIdReused(uint256 gameId);
/// The reported winner/loser are not the two parties of the dispute.
error WrongParties(uint256 gameId, address winner, address loser);

// -- finalisation and payouts ---------------------------------------------------------------
/// The challenge window is still open (`deadline` >= `nowTs`).
error ChallengeWindowOpen(uint256 jobId, uint256 deadline, uint256 nowTs);
/// Disputes of the job are still being played.
error DisputesPending(uint256 jobId, uint256 active);
/// The job is already finalised.
error JobAlreadyFinalized(uint256 jobId);
/// Nothing to withdraw for this account and token.
error NothingToWithdraw(address account, address token);
/// The ETH transfer to the account failed.
error EthTransferFailed(address to, uint256 amount);

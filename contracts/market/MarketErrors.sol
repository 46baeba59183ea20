// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice Errors of the JobMarket (jobs, stakes, submissions, disputes, payouts).
/// @dev Decoded into ContractRevert (name + fields) by verde_chain/chain/market_client.py. Every error here is used.

// -- job posting -----------------------------------------------------------------------------
/// A job field is out of its allowed range (`field` names it, see JobTypes.validate).
error InvalidJobTerms(string field, uint256 value);
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
/// The submission deadline has passed (`deadline` < `nowTs`).
error SubmissionClosed(uint256 jobId, uint256 deadline, uint256 nowTs);
/// The slot already submitted its result; results cannot be replaced.
error AlreadySubmitted(uint256 jobId, uint256 slot);
/// A result commitment of zero is reserved for "nothing submitted".
error EmptyResult(uint256 jobId);

// -- disputes -------------------------------------------------------------------------------
/// The challenge window has closed (`deadline` < `nowTs`).
error ChallengeClosed(uint256 jobId, uint256 deadline, uint256 nowTs);
/// The disputed slot has no submitted, still-standing result (status as JobTypes.SlotStatus).
error NotDisputable(uint256 jobId, uint256 slot, uint8 status);
/// The challenger's bond is below the job's minimum.
error BondTooSmall(uint256 bond, uint256 minimum);
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

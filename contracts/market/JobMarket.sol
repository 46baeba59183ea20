// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";

import {JobTerms, JobStatus, SlotStatus, Job, Slot, DisputeKind, Dispute, JobTypes, IMarketGame} from "./JobTypes.sol";
import {GameParams} from "../dispute/GameTypes.sol";
import {IDisputeResolver} from "../dispute/IDisputeResolver.sol";
import "./MarketErrors.sol";

/// @title JobMarket — jobs, trainer stakes, result submissions, disputes and pull payments
/// @notice Flow (see docs/protocol-market.md):
///
///   client: postJob(terms) + reward ──► trainers: join() + stake ──► submit(C_T, ckptRoot)
///        ──► anyone: openDispute(slot, bond)      ─┐  each opens one game in DisputeGame,
///        ──► rival trainer: disputeRival(slot, own)┘  defender = the disputed slot's trainer
///   DisputeGame ──onDisputeResolved(gameId, winner, loser)──► loser's bond/stake credited to winner
///   after the challenge window and once no game is running: finalize() splits the reward among the
///   surviving trainers (if they agree on C_T) and returns their stakes; everyone withdraw()s.
///
/// Money never leaves the contract except through withdraw(): every settlement is a credit to an
/// internal balance (pull payments). INVARIANT (solvency): for every token,
///   balance(this) == totalOwed[token] == Σ rewardHeld + Σ stakeHeld + Σ active bonds + Σ balances.
contract JobMarket is IDisputeResolver, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using JobTypes for JobTerms;

    /// @notice Upper bound on slots per job, so finalize()'s loop has bounded gas.
    uint32 public constant MAX_SLOTS = 32;

    /// @notice The dispute game that referees every dispute and reports back through onDisputeResolved.
    IMarketGame public immutable game;

    uint256 public jobCount;
    mapping(uint256 jobId => Job) internal _jobs;
    mapping(uint256 jobId => mapping(uint256 slot => Slot)) internal _slots;
    /// @dev slot index + 1, so zero means "no slot".
    mapping(uint256 jobId => mapping(address trainer => uint256)) internal _slotPlusOne;
    mapping(uint256 gameId => Dispute) internal _disputes;
    mapping(address account => mapping(address token => uint256)) public balanceOf;
    /// @notice Everything the market owes in `token` (escrowed or withdrawable).
    mapping(address token => uint256) public totalOwed;

    event JobPosted(uint256 indexed jobId, address indexed client, address token, uint256 reward, bytes32 specHash);
    event TrainerJoined(uint256 indexed jobId, uint256 slot, address indexed trainer, uint256 stake);
    event ResultSubmitted(
        uint256 indexed jobId, uint256 slot, address indexed trainer, bytes32 result, bytes32 checkpointRoot
    );
    event DisputeOpened(
        uint256 indexed jobId,
        uint256 indexed gameId,
        uint256 defenderSlot,
        address defender,
        address challenger,
        DisputeKind kind,
        uint256 bond
    );
    event DisputeSettled(
        uint256 indexed jobId, uint256 indexed gameId, address winner, address loser, bool defenderWon, uint256 paid
    );
    event Credited(address indexed account, address indexed token, uint256 amount, uint256 indexed jobId);
    event JobFinalized(uint256 indexed jobId, bytes32 acceptedResult, uint256 accepted);
    event Withdrawn(address indexed account, address indexed token, uint256 amount);

    constructor(IMarketGame game_) {
        game = game_;
    }

    // -- client ---------------------------------------------------------------------------------

    /// @notice Post a job and escrow its reward (msg.value for ETH, transferFrom for a token).
    function postJob(JobTerms calldata terms) external payable nonReentrant returns (uint256 jobId) {
        terms.validate(block.timestamp);
        if (terms.slots > MAX_SLOTS) revert InvalidJobTerms("slots", terms.slots);
        if (terms.reward == 0) revert InvalidJobTerms("reward", 0);
        jobId = ++jobCount;
        Job storage job = _jobs[jobId];
        job.terms = terms;
        job.client = msg.sender;
        job.status = JobStatus.Open;
        job.rewardHeld = terms.reward;
        _pull(terms.token, terms.reward);
        emit JobPosted(jobId, msg.sender, terms.token, terms.reward, terms.specHash);
    }

    // -- trainers -------------------------------------------------------------------------------

    /// @notice Take a trainer slot by locking the job's stake.
    function join(uint256 jobId) external payable nonReentrant returns (uint256 slot) {
        Job storage job = _openJob(jobId);
        _beforeSubmissionDeadline(jobId, job);
        if (job.slotsTaken >= job.terms.slots) revert JobFull(jobId, job.terms.slots);
        uint256 existing = _slotPlusOne[jobId][msg.sender];
        if (existing != 0) revert AlreadyJoined(jobId, msg.sender, existing - 1);
        slot = job.slotsTaken++;
        _slotPlusOne[jobId][msg.sender] = slot + 1;
        Slot storage s = _slots[jobId][slot];
        s.trainer = msg.sender;
        s.status = SlotStatus.Joined;
        s.stakeHeld = job.terms.trainerStake;
        _pull(job.terms.token, job.terms.trainerStake);
        emit TrainerJoined(jobId, slot, msg.sender, job.terms.trainerStake);
    }

    /// @notice Submit the final step commitment C_T (and optionally the checkpoint list root). Once.
    function submit(uint256 jobId, bytes32 result, bytes32 checkpointRoot) external nonReentrant {
        Job storage job = _openJob(jobId);
        _beforeSubmissionDeadline(jobId, job);
        uint256 slot = _slotOf(jobId, msg.sender);
        Slot storage s = _slots[jobId][slot];
        if (s.status != SlotStatus.Joined) revert AlreadySubmitted(jobId, slot);
        if (result == bytes32(0)) revert EmptyResult(jobId);
        s.result = result;
        s.checkpointRoot = checkpointRoot;
        s.status = SlotStatus.Submitted;
        emit ResultSubmitted(jobId, slot, msg.sender, result, checkpointRoot);
    }

    // -- disputes -------------------------------------------------------------------------------

    /// @notice Anyone disputes slot `slot`'s result with a bond (>= the job's minimum); opens a game
    ///         in which the slot's trainer defends its C_T.
    function openDispute(uint256 jobId, uint256 slot, uint256 bond)
        external
        payable
        nonReentrant
        returns (uint256 gameId)
    {
        Job storage job = _openJob(jobId);
        Slot storage def = _disputableSlot(jobId, job, slot);
        // SAFETY: the game refuses defender == challenger (InvalidParties); refuse it here first
        // with the market's own error, before any bond is taken.
        if (def.trainer == msg.sender) revert SelfDispute(jobId, slot);
        if (bond < job.terms.minChallengeBond) revert BondTooSmall(bond, job.terms.minChallengeBond);
        _pull(job.terms.token, bond);
        gameId = _createGame(job, def, msg.sender);
        _record(gameId, Dispute(jobId, DisputeKind.Outside, true, uint32(slot), 0, msg.sender, bond));
        emit DisputeOpened(jobId, gameId, slot, def.trainer, msg.sender, DisputeKind.Outside, bond);
    }

    /// @notice A trainer disputes a rival trainer's different result, putting its own stake at risk
    ///         instead of a bond: the loser's result is rejected and its stake goes to the winner.
    /// @dev Results are deterministic, so if the defender's C_T is proven right the rival's different
    ///      C_T is wrong, and if it is proven wrong it is rejected; either way one result falls.
    function disputeRival(uint256 jobId, uint256 defenderSlot, uint256 ownSlot)
        external
        nonReentrant
        returns (uint256 gameId)
    {
        Job storage job = _openJob(jobId);
        Slot storage def = _disputableSlot(jobId, job, defenderSlot);
        uint256 mine = _slotOf(jobId, msg.sender);
        if (mine != ownSlot) revert NotATrainer(jobId, msg.sender);
        if (mine == defenderSlot) revert SelfDispute(jobId, defenderSlot);
        Slot storage own = _slots[jobId][mine];
        if (own.status != SlotStatus.Submitted) revert NotDisputable(jobId, mine, uint8(own.status));
        if (own.result == def.result) revert SameResult(jobId, def.result);
        gameId = _createGame(job, def, msg.sender);
        _record(gameId, Dispute(jobId, DisputeKind.Rival, true, uint32(defenderSlot), uint32(mine), msg.sender, 0));
        emit DisputeOpened(jobId, gameId, defenderSlot, def.trainer, msg.sender, DisputeKind.Rival, 0);
    }

    /// @inheritdoc IDisputeResolver
    /// @dev Moves money only between internal balances (no external call), so a resolution can
    ///      never be blocked by a payee.
    function onDisputeResolved(uint256 gameId, address winner, address loser) external nonReentrant {
        // INVARIANT: only the referee decides outcomes; anyone else could steal stakes.
        if (msg.sender != address(game)) revert NotDisputeGame(msg.sender, address(game));
        Dispute storage d = _disputes[gameId];
        // INVARIANT: each game settles once (replayed callbacks would pay twice).
        if (!d.active) revert UnknownDispute(gameId);
        Job storage job = _jobs[d.jobId];
        Slot storage def = _slots[d.jobId][d.defenderSlot];
        bool defenderWon;
        if (winner == def.trainer && loser == d.challenger) {
            defenderWon = true;
        } else if (winner == d.challenger && loser == def.trainer) {
            defenderWon = false;
        } else {
            revert WrongParties(gameId, winner, loser);
        }
        d.active = false;
        job.activeDisputes -= 1;
        uint256 bond = d.bond;
        d.bond = 0;
        uint256 paid;
        if (d.kind == DisputeKind.Outside) {
            // The challenger's bond goes to whoever won; a losing defender also forfeits its stake.
            paid = defenderWon ? bond : bond + _forfeit(def);
        } else {
            Slot storage rival = _slots[d.jobId][d.challengerSlot];
            paid = defenderWon ? _forfeit(rival) : _forfeit(def);
        }
        _credit(winner, job.terms.token, paid, d.jobId);
        emit DisputeSettled(d.jobId, gameId, winner, loser, defenderWon, paid);
    }

    // -- settlement -----------------------------------------------------------------------------

    /// @notice After the challenge window, once every game is resolved: pay the reward to the
    ///         surviving trainers if they agree on one C_T (else refund the client), return the
    ///         survivors' stakes, and give the stakes of trainers who never submitted to the client.
    function finalize(uint256 jobId) external nonReentrant {
        Job storage job = _jobs[jobId];
        if (job.status == JobStatus.None) revert UnknownJob(jobId);
        if (job.status == JobStatus.Finalized) revert JobAlreadyFinalized(jobId);
        uint256 deadline = job.terms.challengeDeadline();
        if (block.timestamp <= deadline) revert ChallengeWindowOpen(jobId, deadline, block.timestamp);
        if (job.activeDisputes != 0) revert DisputesPending(jobId, job.activeDisputes);
        job.status = JobStatus.Finalized;

        (bytes32 accepted, uint256 survivors) = _survivingResult(jobId, job.slotsTaken);
        address token = job.terms.token;
        uint256 reward = job.rewardHeld;
        job.rewardHeld = 0;
        job.acceptedResult = accepted;
        uint256 rank;
        for (uint256 i; i < job.slotsTaken; ++i) {
            Slot storage s = _slots[jobId][i];
            uint256 stake = s.stakeHeld;
            if (s.status == SlotStatus.Submitted) {
                s.stakeHeld = 0;
                s.status = SlotStatus.Settled;
                uint256 pay = stake;
                if (accepted != bytes32(0)) pay += JobTypes.share(reward, survivors, rank++);
                _credit(s.trainer, token, pay, jobId);
            } else if (s.status == SlotStatus.Joined) {
                // A trainer that took a slot and delivered nothing compensates the client.
                s.stakeHeld = 0;
                s.status = SlotStatus.Settled;
                _credit(job.client, token, stake, jobId);
            }
            // Rejected slots already forfeited their stake to a game winner.
        }
        if (accepted == bytes32(0)) _credit(job.client, token, reward, jobId);
        emit JobFinalized(jobId, accepted, accepted == bytes32(0) ? 0 : survivors);
    }

    /// @notice Pull everything credited to the caller in `token` (address(0) = ETH).
    function withdraw(address token) external nonReentrant returns (uint256 amount) {
        amount = balanceOf[msg.sender][token];
        if (amount == 0) revert NothingToWithdraw(msg.sender, token);
        // SAFETY: effects before the transfer (checks-effects-interactions) on top of the guard.
        balanceOf[msg.sender][token] = 0;
        totalOwed[token] -= amount;
        emit Withdrawn(msg.sender, token, amount);
        if (token == address(0)) {
            (bool ok,) = msg.sender.call{value: amount}("");
            if (!ok) revert EthTransferFailed(msg.sender, amount);
        } else {
            IERC20(token).safeTransfer(msg.sender, amount);
        }
    }

    // -- views ----------------------------------------------------------------------------------

    function getJob(uint256 jobId) external view returns (Job memory) {
        return _jobs[jobId];
    }

    function getSlot(uint256 jobId, uint256 slot) external view returns (Slot memory) {
        return _slots[jobId][slot];
    }

    function getDispute(uint256 gameId) external view returns (Dispute memory) {
        return _disputes[gameId];
    }

    /// @notice Slot index of `trainer` in `jobId` (reverts NotATrainer if it holds none).
    function slotOf(uint256 jobId, address trainer) external view returns (uint256) {
        return _slotOf(jobId, trainer);
    }

    /// @notice Last second at which disputes can be opened for `jobId`.
    function challengeDeadline(uint256 jobId) external view returns (uint256) {
        return _jobs[jobId].terms.challengeDeadline();
    }

    // -- internals ------------------------------------------------------------------------------

    function _openJob(uint256 jobId) internal view returns (Job storage job) {
        job = _jobs[jobId];
        if (job.status == JobStatus.None) revert UnknownJob(jobId);
        if (job.status != JobStatus.Open) revert JobAlreadyFinalized(jobId);
    }

    function _beforeSubmissionDeadline(uint256 jobId, Job storage job) internal view {
        if (block.timestamp > job.terms.submissionDeadline) {
            revert SubmissionClosed(jobId, job.terms.submissionDeadline, block.timestamp);
        }
    }

    function _slotOf(uint256 jobId, address trainer) internal view returns (uint256) {
        uint256 plusOne = _slotPlusOne[jobId][trainer];
        if (plusOne == 0) revert NotATrainer(jobId, trainer);
        return plusOne - 1;
    }

    /// @dev A slot can be disputed while the window is open and its result still stands.
    function _disputableSlot(uint256 jobId, Job storage job, uint256 slot) internal view returns (Slot storage s) {
        uint256 deadline = job.terms.challengeDeadline();
        if (block.timestamp > deadline) revert ChallengeClosed(jobId, deadline, block.timestamp);
        if (slot >= job.slotsTaken) revert UnknownSlot(jobId, slot, job.slotsTaken);
        s = _slots[jobId][slot];
        if (s.status != SlotStatus.Submitted) revert NotDisputable(jobId, slot, uint8(s.status));
    }

    function _createGame(Job storage job, Slot storage def, address challenger) internal returns (uint256) {
        job.activeDisputes += 1;
        // INVARIANT (binding to the job): the game starts from the job's C_0 and ends at the
        // defender's submitted C_T, over the job's graph and batches; nothing is caller-chosen.
        GameParams memory p = GameParams({
            defender: def.trainer,
            challenger: challenger,
            initialCommitment: job.terms.initialCommitment,
            finalCommitment: def.result,
            numSteps: job.terms.numSteps,
            graphRoot: job.terms.graphRoot,
            batchRoot: job.terms.batchRoot,
            arity: job.terms.arity,
            clockSeconds: job.terms.clockSeconds,
            numNodes: job.terms.numNodes
        });
        return game.createGame(p);
    }

    function _record(uint256 gameId, Dispute memory d) internal {
        // SAFETY: a game id reused by the game would overwrite a live dispute's escrow.
        if (_disputes[gameId].kind != DisputeKind.None) revert GameIdReused(gameId);
        _disputes[gameId] = d;
    }

    /// @dev Reject a slot's result and hand back its stake (zero if it was already forfeited).
    function _forfeit(Slot storage s) internal returns (uint256 stake) {
        stake = s.stakeHeld;
        s.stakeHeld = 0;
        s.status = SlotStatus.Rejected;
    }

    /// @dev The common C_T of all slots still Submitted; zero if there are none or they disagree.
    function _survivingResult(uint256 jobId, uint256 taken) internal view returns (bytes32 result, uint256 n) {
        for (uint256 i; i < taken; ++i) {
            Slot storage s = _slots[jobId][i];
            if (s.status != SlotStatus.Submitted) continue;
            if (n == 0) {
                result = s.result;
            } else if (s.result != result) {
                return (bytes32(0), 0);
            }
            ++n;
        }
    }

    function _credit(address account, address token, uint256 amount, uint256 jobId) internal {
        if (amount == 0) return;
        balanceOf[account][token] += amount;
        emit Credited(account, token, amount, jobId);
    }

    /// @dev Take `amount` from msg.sender into escrow: exact msg.value for ETH, transferFrom for a
    ///      token (with msg.value == 0), and count it as owed.
    function _pull(address token, uint256 amount) internal {
        if (token == address(0)) {
            if (msg.value != amount) revert WrongPayment(msg.value, amount);
        } else {
            if (msg.value != 0) revert WrongPayment(msg.value, 0);
            uint256 before = IERC20(token).balanceOf(address(this));
            IERC20(token).safeTransferFrom(msg.sender, address(this), amount);
            uint256 received = IERC20(token).balanceOf(address(this)) - before;
            // SAFETY: a fee-on-transfer token would leave the market owing more than it holds.
            if (received != amount) revert TokenTransferShort(token, received, amount);
        }
        totalOwed[token] += amount;
    }
}

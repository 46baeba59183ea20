// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";

import {JobTerms, JobStatus, SlotStatus, Job, Slot, DisputeKind, Dispute, JobTypes, IMarketGame} from "./JobTypes.sol";
import {MarketParams, BondFloor, MarketRules} from "./MarketParams.sol";
import {GameParams} from "../dispute/GameTypes.sol";
import {IDisputeResolver} from "../dispute/IDisputeResolver.sol";
import "./MarketErrors.sol";

/// @title JobMarket — jobs, trainer stakes, committed results, disputes and pull payments
/// @notice Flow (docs/protocol.md, "Job market"):
///
///   client: postJob(terms) + reward ──► trainers: join() + stake ──► commit(keccak(C_T, ckpt, salt, me))
///        (after submissionDeadline) ──► reveal(C_T, ckpt, salt) ──► anyone: openDispute(slot, bond)
///        ──► rival trainer: disputeRival(slot, own, bond)   each opens one game, defender = the slot
///   DisputeGame ──onDisputeResolved(gameId, winner, loser)──► bonds settled; a beaten result's stake
///        goes (less the burn) to the winner of the EARLIEST-OPENED game that beat it, once none runs
///   after the challenge window and once no game runs: finalize() pays the surviving trainers (if
///   they agree on C_T), forfeits unrevealed stakes; everyone withdraw()s.
///
/// Money never leaves the contract except through withdraw(): every settlement is a credit to an
/// internal balance (pull payments); the burned share is credited to `burned[token]`, which no
/// account can withdraw. INVARIANT (solvency): for every token,
///   balance(this) == totalOwed[token]
///                 == Σ rewardHeld + Σ stakeHeld + Σ active bonds + Σ balances + burned[token].
contract JobMarket is IDisputeResolver, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using JobTypes for JobTerms;

    /// @notice Upper bound on slots per job, so finalize()'s loop has bounded gas.
    uint32 public constant MAX_SLOTS = 32;
    /// @notice Upper bound on a job's bundleUri, so reading a job stays cheap.
    uint256 public constant MAX_BUNDLE_URI = 2048;

    /// @notice The dispute game that referees every dispute and reports back through onDisputeResolved.
    IMarketGame public immutable game;

    // -- market parameters, fixed at deployment (MarketParams; read them with marketParams()) ----
    uint64 internal immutable _minClock;
    uint64 internal immutable _maxClock;
    uint64 internal immutable _minReveal;
    uint64 internal immutable _maxReveal;
    uint64 internal immutable _minChallenge;
    uint64 internal immutable _maxChallenge;
    uint64 internal immutable _maxHorizon;
    uint16 internal immutable _burnBps;
    uint32 internal immutable _bondStep;
    /// @notice Bond floor per token (0: jobs cannot pay in that token). Written only by the constructor.
    mapping(address token => uint256) public bondFloor;
    address[] internal _floorTokens;

    uint256 public jobCount;
    mapping(uint256 jobId => Job) internal _jobs;
    mapping(uint256 jobId => mapping(uint256 slot => Slot)) internal _slots;
    /// @dev slot index + 1, so zero means "no slot".
    mapping(uint256 jobId => mapping(address trainer => uint256)) internal _slotPlusOne;
    mapping(uint256 gameId => Dispute) internal _disputes;
    /// @notice Whether `challenger` has disputed slot `slot` of `jobId` (one game each, ever).
    mapping(uint256 jobId => mapping(uint256 slot => mapping(address challenger => bool))) public hasDisputed;
    mapping(address account => mapping(address token => uint256)) public balanceOf;
    /// @notice Forfeits burned in `token`: owed to nobody, held forever (part of totalOwed).
    mapping(address token => uint256) public burned;
    /// @notice Everything the market owes in `token` (escrowed, withdrawable or burned).
    mapping(address token => uint256) public totalOwed;

    event JobPosted(
        uint256 indexed jobId, address indexed client, address token, uint256 reward, bytes32 specHash, string bundleUri
    );
    event TrainerJoined(uint256 indexed jobId, uint256 slot, address indexed trainer, uint256 stake);
    event ResultCommitted(uint256 indexed jobId, uint256 slot, address indexed trainer, bytes32 commitment);
    event ResultRevealed(
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
    /// @notice A game ended. `paid`: what the winner was credited from the bond (its own bond back,
    ///         or the loser's less `burnt`). Stakes follow in StakeForfeited.
    event DisputeSettled(
        uint256 indexed jobId,
        uint256 indexed gameId,
        address winner,
        address loser,
        bool defenderWon,
        uint256 paid,
        uint256 burnt
    );
    /// @notice Slot `slot`'s stake was forfeited: `paid` to `beneficiary` (the earliest-opened game's
    ///         winner for a beaten result, the client for a result never revealed), `burnt` burned.
    event StakeForfeited(
        uint256 indexed jobId, uint256 slot, address indexed trainer, address beneficiary, uint256 paid, uint256 burnt
    );
    event Burned(uint256 indexed jobId, address indexed token, uint256 amount);
    event Credited(address indexed account, address indexed token, uint256 amount, uint256 indexed jobId);
    event JobFinalized(uint256 indexed jobId, bytes32 acceptedResult, uint256 accepted);
    event Withdrawn(address indexed account, address indexed token, uint256 amount);

    constructor(IMarketGame game_, MarketParams memory p) {
        MarketRules.check(p);
        game = game_;
        _minClock = p.minClockSeconds;
        _maxClock = p.maxClockSeconds;
        _minReveal = p.minRevealWindow;
        _maxReveal = p.maxRevealWindow;
        _minChallenge = p.minChallengeWindow;
        _maxChallenge = p.maxChallengeWindow;
        _maxHorizon = p.maxDeadlineHorizon;
        _burnBps = p.burnBps;
        _bondStep = p.disputesPerBondStep;
        for (uint256 i; i < p.bondFloors.length; ++i) {
            bondFloor[p.bondFloors[i].token] = p.bondFloors[i].minBond;
            _floorTokens.push(p.bondFloors[i].token);
        }
    }

    // -- client ---------------------------------------------------------------------------------

    /// @notice Post a job and escrow its reward (msg.value for ETH, transferFrom for a token).
    function postJob(JobTerms calldata terms) external payable nonReentrant returns (uint256 jobId) {
        terms.validate();
        if (terms.slots > MAX_SLOTS) revert InvalidJobTerms("slots", terms.slots);
        if (terms.reward == 0) revert InvalidJobTerms("reward", 0);
        uint256 uriLength = bytes(terms.bundleUri).length;
        if (uriLength > MAX_BUNDLE_URI) revert InvalidJobTerms("bundleUri", uriLength);
        MarketRules.checkJob(terms, marketParams(), bondFloor[terms.token], block.timestamp);
        jobId = ++jobCount;
        Job storage job = _jobs[jobId];
        job.terms = terms;
        job.client = msg.sender;
        job.status = JobStatus.Open;
        job.rewardHeld = terms.reward;
        _pull(terms.token, terms.reward);
        emit JobPosted(jobId, msg.sender, terms.token, terms.reward, terms.specHash, terms.bundleUri);
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

    /// @notice Commit to a result until the submission deadline: `commitment` =
    ///         commitmentOf(C_T, checkpointRoot, salt, msg.sender). Once.
    function commit(uint256 jobId, bytes32 commitment) external nonReentrant {
        Job storage job = _openJob(jobId);
        _beforeSubmissionDeadline(jobId, job);
        uint256 slot = _slotOf(jobId, msg.sender);
        Slot storage s = _slots[jobId][slot];
        if (s.status != SlotStatus.Joined) revert AlreadyCommitted(jobId, slot);
        if (commitment == bytes32(0)) revert EmptyCommitment(jobId);
        s.commitment = commitment;
        s.status = SlotStatus.Committed;
        emit ResultCommitted(jobId, slot, msg.sender, commitment);
    }

    /// @notice Open the commitment in the reveal window (after the submission deadline, until
    ///         revealDeadline): the result becomes public and disputable.
    function reveal(uint256 jobId, bytes32 result, bytes32 checkpointRoot, bytes32 salt) external nonReentrant {
        Job storage job = _openJob(jobId);
        uint256 opensAfter = job.terms.submissionDeadline;
        // INVARIANT: no result is public before every commitment is final, so nobody can commit a
        // copy of someone else's result.
        if (block.timestamp <= opensAfter) revert RevealNotOpen(jobId, opensAfter, block.timestamp);
        uint256 deadline = job.terms.revealDeadline();
        if (block.timestamp > deadline) revert RevealClosed(jobId, deadline, block.timestamp);
        uint256 slot = _slotOf(jobId, msg.sender);
        Slot storage s = _slots[jobId][slot];
        if (s.status != SlotStatus.Committed) revert NotCommitted(jobId, slot, uint8(s.status));
        if (result == bytes32(0)) revert EmptyResult(jobId);
        bytes32 h = JobTypes.commitment(result, checkpointRoot, salt, msg.sender);
        // INVARIANT (bound to the submitter): the caller's own address is in the preimage, so a
        // commitment copied from another trainer can never be opened.
        if (h != s.commitment) revert CommitmentMismatch(jobId, slot, h, s.commitment);
        s.result = result;
        s.checkpointRoot = checkpointRoot;
        s.status = SlotStatus.Revealed;
        emit ResultRevealed(jobId, slot, msg.sender, result, checkpointRoot);
    }

    // -- disputes -------------------------------------------------------------------------------

    /// @notice Anyone disputes slot `slot`'s revealed result, locking `bond` (at least
    ///         requiredBond(jobId, slot)); opens a game in which the slot's trainer defends its C_T.
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
        gameId = _open(jobId, job, slot, def, DisputeKind.Outside, 0, bond);
    }

    /// @notice A trainer disputes a rival trainer's different result, locking a bond like anyone
    ///         and also staking its own result: whichever side loses, its result is rejected.
    /// @dev Results are deterministic, so if the defender's C_T is proven right the rival's different
    ///      C_T is wrong, and if it is proven wrong it is rejected; either way one result falls.
    function disputeRival(uint256 jobId, uint256 defenderSlot, uint256 ownSlot, uint256 bond)
        external
        payable
        nonReentrant
        returns (uint256 gameId)
    {
        Job storage job = _openJob(jobId);
        Slot storage def = _disputableSlot(jobId, job, defenderSlot);
        uint256 mine = _slotOf(jobId, msg.sender);
        if (mine != ownSlot) revert NotATrainer(jobId, msg.sender);
        if (mine == defenderSlot) revert SelfDispute(jobId, defenderSlot);
        Slot storage own = _slots[jobId][mine];
        if (own.status != SlotStatus.Revealed) revert NotDisputable(jobId, mine, uint8(own.status));
        if (own.result == def.result) revert SameResult(jobId, def.result);
        own.openAsRival += 1;
        gameId = _open(jobId, job, defenderSlot, def, DisputeKind.Rival, mine, bond);
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
        uint256 jobId = d.jobId;
        Job storage job = _jobs[jobId];
        Slot storage def = _slots[jobId][d.defenderSlot];
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
        def.openAgainst -= 1;
        uint256 bond = d.bond;
        d.bond = 0;
        address token = job.terms.token;
        uint256 paid = bond;
        uint256 burnt;
        if (defenderWon) {
            // The challenger's bond is forfeited; a losing rival's different result is wrong too.
            (burnt, paid) = _forfeit(jobId, token, bond, winner);
            if (d.kind == DisputeKind.Rival) _beaten(_slots[jobId][d.challengerSlot], gameId, winner);
        } else {
            _credit(winner, token, bond, jobId);
            _beaten(def, gameId, winner);
        }
        emit DisputeSettled(jobId, gameId, winner, loser, defenderWon, paid, burnt);
        if (d.kind == DisputeKind.Rival) {
            Slot storage rival = _slots[jobId][d.challengerSlot];
            rival.openAsRival -= 1;
            _settleStake(jobId, d.challengerSlot, rival, token);
        }
        _settleStake(jobId, d.defenderSlot, def, token);
    }

    // -- settlement -----------------------------------------------------------------------------

    /// @notice After the challenge window, once every game is resolved: pay the reward to the
    ///         surviving trainers if they agree on one C_T (else refund the client), return the
    ///         survivors' stakes, and forfeit the stakes of trainers who never revealed (the client
    ///         gets what is not burned).
    function finalize(uint256 jobId) external nonReentrant {
        Job storage job = _jobs[jobId];
        if (job.status == JobStatus.None) revert UnknownJob(jobId);
        if (job.status == JobStatus.Finalized) revert JobAlreadyFinalized(jobId);
        uint256 deadline = job.terms.challengeDeadline();
        if (block.timestamp <= deadline) revert ChallengeWindowOpen(jobId, deadline, block.timestamp);
        if (job.activeDisputes != 0) revert DisputesPending(jobId, job.activeDisputes);
        job.status = JobStatus.Finalized;

        (bytes32 accepted, uint256 survivors) = _survivingResult(jobId, job.slotsTaken);
        uint256 reward = job.rewardHeld;
        job.rewardHeld = 0;
        job.acceptedResult = accepted;
        uint256 rank;
        for (uint256 i; i < job.slotsTaken; ++i) {
            uint256 share;
            if (accepted != bytes32(0) && _slots[jobId][i].status == SlotStatus.Revealed) {
                share = JobTypes.share(reward, survivors, rank++);
            }
            _finalizeSlot(jobId, job, i, share);
        }
        if (accepted == bytes32(0)) _credit(job.client, job.terms.token, reward, jobId);
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

    /// @notice The parameters the market was deployed with.
    function marketParams() public view returns (MarketParams memory p) {
        p.minClockSeconds = _minClock;
        p.maxClockSeconds = _maxClock;
        p.minRevealWindow = _minReveal;
        p.maxRevealWindow = _maxReveal;
        p.minChallengeWindow = _minChallenge;
        p.maxChallengeWindow = _maxChallenge;
        p.maxDeadlineHorizon = _maxHorizon;
        p.burnBps = _burnBps;
        p.disputesPerBondStep = _bondStep;
        p.bondFloors = new BondFloor[](_floorTokens.length);
        for (uint256 i; i < _floorTokens.length; ++i) {
            p.bondFloors[i] = BondFloor(_floorTokens[i], bondFloor[_floorTokens[i]]);
        }
    }

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

    /// @notice Last second at which commitments of `jobId` can be revealed.
    function revealDeadline(uint256 jobId) external view returns (uint256) {
        return _jobs[jobId].terms.revealDeadline();
    }

    /// @notice Last second at which disputes can be opened for `jobId`.
    function challengeDeadline(uint256 jobId) external view returns (uint256) {
        return _jobs[jobId].terms.challengeDeadline();
    }

    /// @notice The bond a new dispute against slot `slot` of `jobId` must lock now: the job's
    ///         minimum, doubled for every `disputesPerBondStep` games running against that result.
    function requiredBond(uint256 jobId, uint256 slot) external view returns (uint256) {
        return MarketRules.requiredBond(_jobs[jobId].terms.minChallengeBond, _slots[jobId][slot].openAgainst, _bondStep);
    }

    /// @notice The commitment a trainer sends to commit(): keccak256(abi.encode(result,
    ///         checkpointRoot, salt, trainer)).
    function commitmentOf(bytes32 result, bytes32 checkpointRoot, bytes32 salt, address trainer)
        external
        pure
        returns (bytes32)
    {
        return JobTypes.commitment(result, checkpointRoot, salt, trainer);
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

    /// @dev A slot can be disputed from its reveal until the challenge deadline, while it stands.
    function _disputableSlot(uint256 jobId, Job storage job, uint256 slot) internal view returns (Slot storage s) {
        uint256 deadline = job.terms.challengeDeadline();
        if (block.timestamp > deadline) revert ChallengeClosed(jobId, deadline, block.timestamp);
        if (slot >= job.slotsTaken) revert UnknownSlot(jobId, slot, job.slotsTaken);
        s = _slots[jobId][slot];
        if (s.status != SlotStatus.Revealed) revert NotDisputable(jobId, slot, uint8(s.status));
    }

    /// @dev Lock the caller's bond against slot `slot` and open its game.
    function _open(
        uint256 jobId,
        Job storage job,
        uint256 slot,
        Slot storage def,
        DisputeKind kind,
        uint256 ownSlot,
        uint256 bond
    ) internal returns (uint256 gameId) {
        // INVARIANT (no duplicates): one game per challenger and result, so a flood needs one
        // address and one bond per game.
        if (hasDisputed[jobId][slot][msg.sender]) revert DuplicateDispute(jobId, slot, msg.sender);
        hasDisputed[jobId][slot][msg.sender] = true;
        // INVARIANT (priced bound): each game locks its own bond, doubling every `_bondStep` games
        // running against the result, so a flood's cost grows exponentially while nobody is ever
        // locked out (an honest challenger gets its bond back when it wins).
        uint256 need = MarketRules.requiredBond(job.terms.minChallengeBond, def.openAgainst, _bondStep);
        if (bond < need) revert BondTooSmall(bond, need);
        _pull(job.terms.token, bond);
        job.activeDisputes += 1;
        def.openAgainst += 1;
        // INVARIANT (binding to the job): the game starts from the job's C_0 and ends at the
        // defender's revealed C_T, over the job's graph, batches and checkpoints; nothing is
        // caller-chosen. Each game gets the job's full clock for each party.
        gameId = game.createGame(
            GameParams({
                defender: def.trainer,
                challenger: msg.sender,
                initialCommitment: job.terms.initialCommitment,
                finalCommitment: def.result,
                numSteps: job.terms.numSteps,
                graphRoot: job.terms.graphRoot,
                batchRoot: job.terms.batchRoot,
                arity: job.terms.arity,
                clockSeconds: job.terms.clockSeconds,
                numNodes: job.terms.numNodes,
                checkpointInterval: job.terms.checkpointInterval
            })
        );
        // SAFETY: a game id reused by the game would overwrite a live dispute's escrow.
        if (_disputes[gameId].kind != DisputeKind.None) revert GameIdReused(gameId);
        _disputes[gameId] = Dispute(jobId, kind, true, uint32(slot), uint32(ownSlot), msg.sender, bond);
        emit DisputeOpened(jobId, gameId, slot, def.trainer, msg.sender, kind, bond);
    }

    /// @dev Settle one slot at finalisation: a surviving result gets its stake back plus `share` of
    ///      the reward; a slot that never revealed forfeits its stake to the client.
    function _finalizeSlot(uint256 jobId, Job storage job, uint256 slot, uint256 share) internal {
        Slot storage s = _slots[jobId][slot];
        SlotStatus st = s.status;
        address token = job.terms.token;
        uint256 stake = s.stakeHeld;
        if (st == SlotStatus.Revealed) {
            s.stakeHeld = 0;
            s.status = SlotStatus.Settled;
            _credit(s.trainer, token, stake + share, jobId);
        } else if (st == SlotStatus.Joined || st == SlotStatus.Committed) {
            // A slot that never revealed delivered nothing (a copied commitment can never be
            // opened): its stake is forfeited, the client gets what is not burned.
            s.stakeHeld = 0;
            s.status = SlotStatus.Settled;
            (uint256 burnt, uint256 paid) = _forfeit(jobId, token, stake, job.client);
            emit StakeForfeited(jobId, slot, s.trainer, job.client, paid, burnt);
        } else {
            // Rejected: assigned when its last game ended (a no-op here unless still held).
            _settleStake(jobId, slot, s, token);
        }
    }

    /// @dev Game `gameId`, won by `winner`, beat the slot's result: reject it and remember the
    ///      earliest-opened such game (game ids grow with opening order).
    function _beaten(Slot storage s, uint256 gameId, address winner) internal {
        s.status = SlotStatus.Rejected;
        // INVARIANT (earliest-opened winner): the stake goes to whoever disputed first and won,
        // never to whoever's game happened to end first, so a sybil losing on purpose quickly
        // cannot take it from an honest challenger that opened earlier.
        if (s.beatenBy == 0 || gameId < s.beatenBy) {
            s.beatenBy = gameId;
            s.beatenWinner = winner;
        }
    }

    /// @dev Assign a rejected slot's stake once no game in which its result is at stake runs.
    function _settleStake(uint256 jobId, uint256 slot, Slot storage s, address token) internal {
        if (s.status != SlotStatus.Rejected || s.openAgainst != 0 || s.openAsRival != 0) return;
        uint256 stake = s.stakeHeld;
        if (stake == 0) return;
        s.stakeHeld = 0;
        (uint256 burnt, uint256 paid) = _forfeit(jobId, token, stake, s.beatenWinner);
        emit StakeForfeited(jobId, slot, s.trainer, s.beatenWinner, paid, burnt);
    }

    /// @dev Burn the market's share of a forfeited `amount` and credit the rest to `to`.
    function _forfeit(uint256 jobId, address token, uint256 amount, address to)
        internal
        returns (uint256 burnt, uint256 paid)
    {
        (burnt, paid) = MarketRules.split(amount, _burnBps);
        if (burnt != 0) {
            // SAFETY: burned funds stay in the contract, credited to no account, so the solvency
            // invariant stays exact and no transfer can fail inside a resolution.
            burned[token] += burnt;
            emit Burned(jobId, token, burnt);
        }
        _credit(to, token, paid, jobId);
    }

    /// @dev The common C_T of all slots still Revealed; zero if there are none or they disagree.
    function _survivingResult(uint256 jobId, uint256 taken) internal view returns (bytes32 result, uint256 n) {
        for (uint256 i; i < taken; ++i) {
            Slot storage s = _slots[jobId][i];
            if (s.status != SlotStatus.Revealed) continue;
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

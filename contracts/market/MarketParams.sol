// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {InvalidMarketParams, TermsOutOfBounds, TokenNotAllowed} from "./MarketErrors.sol";
import {JobTerms} from "./JobTypes.sol";

/// @notice The bond floor of one token a job may pay in (address(0) = ETH), in its smallest unit.
struct BondFloor {
    address token;
    uint256 minBond;
}

/// @notice The market's rules, fixed once at deployment (constructor argument; no setter exists).
/// @dev Twin: verde_chain.market.params.MarketParams (same field order; defaults and profiles live there).
///
///   job clock        clockSeconds     in [minClockSeconds, maxClockSeconds]
///   reveal window    revealWindow     in [minRevealWindow, maxRevealWindow]
///   challenge window challengeWindow  in [minChallengeWindow, maxChallengeWindow]
///   deadline         submissionDeadline - now  in [1, maxDeadlineHorizon]
///   bond             minChallengeBond >= bondFloors[token]   (tokens without a floor are refused)
///   burn             burnBps / 10,000 of every forfeited stake and bond is burned
///   dispute price    the bond to open a dispute doubles for every disputesPerBondStep games
///                    already running against the same result
struct MarketParams {
    uint64 minClockSeconds;
    uint64 maxClockSeconds;
    uint64 minRevealWindow;
    uint64 maxRevealWindow;
    uint64 minChallengeWindow;
    uint64 maxChallengeWindow;
    uint64 maxDeadlineHorizon;
    uint16 burnBps;
    uint32 disputesPerBondStep;
    BondFloor[] bondFloors;
}

/// @notice Pure rules over the market parameters, kept out of the contract to be read and tested alone.
library MarketRules {
    uint256 internal constant BPS = 10_000;

    /// @notice Refuse parameters that would make the market unusable or unsafe.
    function check(MarketParams memory p) internal pure {
        // SAFETY: a zero lower bound would admit the 1-second clocks and windows of trap jobs.
        if (p.minClockSeconds == 0) revert InvalidMarketParams("minClockSeconds", 0);
        if (p.maxClockSeconds < p.minClockSeconds) revert InvalidMarketParams("maxClockSeconds", p.maxClockSeconds);
        if (p.minRevealWindow == 0) revert InvalidMarketParams("minRevealWindow", 0);
        if (p.maxRevealWindow < p.minRevealWindow) revert InvalidMarketParams("maxRevealWindow", p.maxRevealWindow);
        if (p.minChallengeWindow == 0) revert InvalidMarketParams("minChallengeWindow", 0);
        if (p.maxChallengeWindow < p.minChallengeWindow) {
            revert InvalidMarketParams("maxChallengeWindow", p.maxChallengeWindow);
        }
        if (p.maxDeadlineHorizon == 0) revert InvalidMarketParams("maxDeadlineHorizon", 0);
        // SAFETY: burning everything would leave an honest winner nothing to cover its gas.
        if (p.burnBps >= BPS) revert InvalidMarketParams("burnBps", p.burnBps);
        if (p.disputesPerBondStep == 0) revert InvalidMarketParams("disputesPerBondStep", 0);
        if (p.bondFloors.length == 0) revert InvalidMarketParams("bondFloors", 0);
        for (uint256 i; i < p.bondFloors.length; ++i) {
            if (p.bondFloors[i].minBond == 0) revert InvalidMarketParams("bondFloors", i);
            for (uint256 j; j < i; ++j) {
                if (p.bondFloors[j].token == p.bondFloors[i].token) revert InvalidMarketParams("bondFloors", i);
            }
        }
    }

    /// @notice Refuse a job whose clock, windows, deadline or bond leave the market's bounds.
    /// @param floor the bond floor of the job's token (0: the token is not allowed).
    function checkJob(JobTerms calldata s, MarketParams memory p, uint256 floor, uint256 nowTs) internal pure {
        if (floor == 0) revert TokenNotAllowed(s.token);
        // SAFETY: a clock below a few block times lets a sybil win on time against an honest party;
        // one of years locks every stake and the reward.
        _within("clockSeconds", s.clockSeconds, p.minClockSeconds, p.maxClockSeconds);
        _within("revealWindow", s.revealWindow, p.minRevealWindow, p.maxRevealWindow);
        // SAFETY: a challenge window of seconds pays a wrong result revealed at its end.
        _within("challengeWindow", s.challengeWindow, p.minChallengeWindow, p.maxChallengeWindow);
        _within("submissionDeadline", s.submissionDeadline, nowTs + 1, nowTs + p.maxDeadlineHorizon);
        // SAFETY: a bond below the defence's gas lets a flood of disputes drain an honest defender.
        _within("minChallengeBond", s.minChallengeBond, floor, type(uint256).max);
    }

    /// @notice Bond needed to open one more dispute against a result with `open` games running:
    ///         the job's minimum, doubled for every `step` running games (saturating).
    function requiredBond(uint256 minBond, uint256 open, uint256 step) internal pure returns (uint256) {
        uint256 doublings = open / step;
        if (doublings >= 256 || (minBond >> (256 - doublings)) != 0) return type(uint256).max;
        return minBond << doublings;
    }

    /// @notice Split a forfeited amount into the burned share and what the winner receives.
    function split(uint256 amount, uint256 burnBps) internal pure returns (uint256 burned, uint256 rest) {
        burned = (amount * burnBps) / BPS;
        rest = amount - burned;
    }

    function _within(string memory field, uint256 value, uint256 lo, uint256 hi) private pure {
        if (value < lo || value > hi) revert TermsOutOfBounds(field, value, lo, hi);
    }
}

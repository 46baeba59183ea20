// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {JobMarket} from "../market/JobMarket.sol";
import {JobTerms} from "../market/JobTypes.sol";

/// @notice A client contract whose ETH receive hook re-enters the market during withdraw(): the
///         re-entry must fail (ReentrancyGuard) and the payout with it, leaving the books intact.
contract ReentrantClient {
    JobMarket public immutable market;
    bool public reenter;

    constructor(JobMarket market_) {
        market = market_;
    }

    function post(JobTerms calldata terms) external payable returns (uint256) {
        return market.postJob{value: msg.value}(terms);
    }

    function setReenter(bool on) external {
        reenter = on;
    }

    function pull() external returns (uint256) {
        return market.withdraw(address(0));
    }

    receive() external payable {
        if (reenter) market.withdraw(address(0));
    }
}

/// @notice An ERC-20 that burns 1% of every transfer: the market must refuse it, since it would
///         otherwise owe more than it holds.
contract FeeOnTransferToken is ERC20 {
    constructor() ERC20("Fee Token", "FEE") {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    function _update(address from, address to, uint256 value) internal override {
        if (from != address(0) && to != address(0)) {
            uint256 fee = value / 100;
            super._update(from, address(0), fee);
            value -= fee;
        }
        super._update(from, to, value);
    }
}

// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @notice Plain OpenZeppelin ERC-20 with an open faucet, for stakes, bonds and rewards in tests.
contract TestToken is ERC20 {
    constructor() ERC20("Verde Test Token", "VTT") {}

    /// @notice Anyone may mint to anyone: test-only.
    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}

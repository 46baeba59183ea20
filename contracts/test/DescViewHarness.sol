// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {DescView} from "../vm/DescView.sol";

/// @notice Test harness: DescView's reads as external calls, for its twin test
///         (tests/vm/test_scalarvm_twin.py: against verde_chain/repops/program.py).
contract DescViewHarness {
    function meta(bytes calldata desc)
        external
        pure
        returns (uint256[] memory shape, uint256 K, uint256 nInputs, uint256[3] memory codeLen, uint256[] memory kdims)
    {
        DescView.Meta memory m = DescView.meta(desc);
        return (m.shape, m.K, m.nInputs, m.codeLen, m.kdims);
    }

    function input(bytes calldata desc, uint256 t) external pure returns (DescView.Input memory) {
        return DescView.input(desc, DescView.meta(desc), t);
    }
}

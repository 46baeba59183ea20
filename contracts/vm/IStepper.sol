// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice What the game knows about the one element whose scalar program is disputed.
/// @dev Every field is fixed by the levels above: descHash and inputRoots by the L2 node reveal
///      (checked against the graph commitment and the input justifications), `element` by L3 and
///      `microStep` by the L4 bisection. `desc` is supplied by the caller and checked by the game:
///      keccak256(desc) == descHash.
struct StepContext {
    bytes32 descHash;
    bytes desc;
    bytes32[] inputRoots;
    uint256 element;
    uint256 microStep; // j: the step executed goes from state j to state j + 1
}

/// @title IStepper — the machine that runs one output element's scalar program
/// @notice The dispute game knows nothing of floating point: it bisects over the hashes of the
///         machine's states and asks the stepper to execute exactly one step.
///
///   s_0 = initialStateHash(ctx)    (fixed: element e, no step executed)
///   s_{j+1} = step(ctx with microStep j, preimage of s_j, proof)
///   s_N: finalValue(preimage of s_N) returns the element's value
///
/// State hashes are keccak256 of the state preimage; the game checks that itself before
/// calling `step` or trusting `finalValue`. Implementations must be deterministic and must
/// not depend on anything but their arguments (they are called as `view`, i.e. staticcall).
/// A malformed input (bad descriptor, bad preimage, bad proof) reverts.
interface IStepper {
    /// @notice Shape of a node's work: the number of output elements and the number N of
    ///         micro-steps of each element's program. Reverts if `desc` is malformed.
    function describe(bytes calldata desc) external view returns (uint256 outputNumel, uint256 numSteps);

    /// @notice Hash of the state before the first micro-step of element `ctx.element`.
    function initialStateHash(StepContext calldata ctx) external view returns (bytes32);

    /// @notice Execute micro-step `ctx.microStep` from `preState` and return the post-state hash.
    /// @param preState preimage of s_j (the game has checked keccak256(preState) == s_j)
    /// @param proof whatever else the step needs (e.g. an input element and its Merkle proof
    ///        against ctx.inputRoots); a wrong proof must revert, never yield a post state
    function step(StepContext calldata ctx, bytes calldata preState, bytes calldata proof)
        external
        view
        returns (bytes32 postStateHash);

    /// @notice Decode a final state: its hash (keccak256(statePreimage)) and the element's
    ///         binary32 result bits.
    function finalValue(bytes calldata statePreimage) external view returns (bytes32 stateHash, uint32 value);
}

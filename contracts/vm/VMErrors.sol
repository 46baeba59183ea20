// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice Errors of the one-step prover (ScalarVM). Twin: verde_chain/vm/scalarvm.py raises CustomError
///         with the same names and fields.

/// keccak256(desc) is not the descriptor hash the game fixed at L2.
error DescriptorHashMismatch(bytes32 computed, bytes32 expected);
/// The game asked for a micro-step at or past the program's end.
error StepOutOfRange(uint256 step, uint256 numSteps);
/// The element is not an output element of the node.
error ElementOutOfRange(uint256 element, uint256 numel);
/// A state preimage must be exactly STATE_BYTES long.
error BadStateLength(uint256 actual, uint256 expected);
/// The pre-state belongs to another node, element or step than the one being proved.
error StateContextMismatch(bytes32 descHash, uint256 element, uint256 step);
/// The node has a different number of input tensors than roots were given.
error InputCountMismatch(uint256 given, uint256 expected);
/// A LOAD address computed from the descriptor falls outside the input tensor.
error AddressOutOfRange(uint256 input, int256 addr, uint256 numel);
/// An opcode the RepOps instruction set does not define.
error UnknownOpcode(uint256 opcode);
/// The descriptor is neither abi form (six values: head 0xC0; seven with the window extension: 0xE0),
/// or one of its top-level offsets points outside it.
error UnknownDescriptorForm(uint256 head);
/// A LOAD's proof is not one abi-encoded (bytes chunk, bytes32[] siblings) tuple.
error BadProof(uint256 length);

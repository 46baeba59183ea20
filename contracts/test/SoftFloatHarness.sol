// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {F32, SoftFloat32} from "../lib/SoftFloat32.sol";

/// @notice Exposes SoftFloat32 to differential tests (batched, so thousands of TestFloat cases
///         go through one eth_call) and to the gas benchmark.
/// @dev Op codes: the RepOps opcode where one exists (verde_chain/repops/isa.py), plus conversions.
///      Results are uint32 words: float bits, 1/0 for comparisons, int32 two's complement for
///      TO_I32. LDEXP is the RepOps instruction (exponent b is a float); LDEXP_INT reads its
///      exponent n from operand b as an int32 (two's complement).
///
///      Gas method (`measure`): each op runs between two `gasleft()` reads inside its own branch;
///      op NOP (a plain copy) measures the same window with no work, and the benchmark subtracts
///      it, so the figure is the op's internal call plus its body.
contract SoftFloatHarness {
    uint8 internal constant ADD = 0;
    uint8 internal constant SUB = 1;
    uint8 internal constant MUL = 2;
    uint8 internal constant DIV = 3;
    uint8 internal constant FMA = 4;
    uint8 internal constant SQRT = 5;
    uint8 internal constant MAX = 6;
    uint8 internal constant MIN = 7;
    uint8 internal constant LT = 8;
    uint8 internal constant EQ = 9;
    uint8 internal constant SELECT = 10;
    uint8 internal constant RINT = 11;
    uint8 internal constant LDEXP = 12;
    uint8 internal constant GETEXP = 13;
    uint8 internal constant GETMANT = 14;
    uint8 internal constant NEG = 15;
    uint8 internal constant ABS = 16;
    uint8 internal constant MOV = 21;
    uint8 internal constant FLOOR = 22;
    uint8 internal constant LE = 100;
    uint8 internal constant FROM_I32 = 101;
    uint8 internal constant FROM_U32 = 102;
    uint8 internal constant TO_I32 = 103;
    uint8 internal constant LDEXP_INT = 104;
    uint8 internal constant NOP = 255;

    error UnknownOp(uint8 op);
    error OperandLengthMismatch(uint8 op, uint256 aLength, uint256 otherLength);
    error PackedLengthNotMultiple(uint8 op, uint256 length, uint256 caseBytes);

    /// @notice Number of operands an op reads (0 if the op is unknown).
    function arity(uint8 op) public pure returns (uint256) {
        if (op == FMA || op == SELECT) return 3;
        if (op == SQRT) return 1;
        if (op <= EQ || op == LDEXP || op == LE || op == LDEXP_INT) return 2;
        if (op == RINT || (op >= GETEXP && op <= ABS) || op == MOV || op == FLOOR) return 1;
        if (op >= FROM_I32 && op <= TO_I32) return 1;
        return 0;
    }

    function _apply(uint8 op, uint32 a, uint32 b, uint32 c) internal pure returns (uint32) {
        F32 x = F32.wrap(a);
        F32 y = F32.wrap(b);
        if (op == ADD) return x.add(y).bits();
        if (op == SUB) return x.sub(y).bits();
        if (op == MUL) return x.mul(y).bits();
        if (op == DIV) return x.div(y).bits();
        if (op == FMA) return x.fma(y, F32.wrap(c)).bits();
        if (op == SQRT) return x.sqrt().bits();
        if (op == MAX) return x.max(y).bits();
        if (op == MIN) return x.min(y).bits();
        if (op == LT) return x.lt(y) ? 1 : 0;
        if (op == EQ) return x.eq(y) ? 1 : 0;
        if (op == LE) return x.le(y) ? 1 : 0;
        if (op == RINT) return x.rint().bits();
        if (op == FLOOR) return x.floor().bits();
        if (op == LDEXP) return x.ldexpF(y).bits();
        if (op == LDEXP_INT) return x.ldexp(int32(b)).bits();
        if (op == SELECT) return x.select(y, F32.wrap(c)).bits();
        if (op == MOV) return x.mov().bits();
        if (op == GETEXP) return x.getexp().bits();
        if (op == GETMANT) return x.getmant().bits();
        if (op == NEG) return x.neg().bits();
        if (op == ABS) return x.abs().bits();
        if (op == FROM_I32) return SoftFloat32.fromInt32(int32(a)).bits();
        if (op == FROM_U32) return SoftFloat32.fromUint32(a).bits();
        if (op == TO_I32) return uint32(x.toInt32());
        revert UnknownOp(op);
    }

    /// @notice out[i] = op(a[i], b[i], c[i]); operands an op does not read may be empty arrays.
    function run(uint8 op, uint32[] calldata a, uint32[] calldata b, uint32[] calldata c)
        external
        pure
        returns (uint32[] memory out)
    {
        uint256 k = arity(op);
        if (k == 0) revert UnknownOp(op);
        if (k >= 2 && b.length != a.length) revert OperandLengthMismatch(op, a.length, b.length);
        if (k == 3 && c.length != a.length) revert OperandLengthMismatch(op, a.length, c.length);
        out = new uint32[](a.length);
        for (uint256 i = 0; i < a.length; ++i) {
            out[i] = _apply(op, a[i], k >= 2 ? b[i] : 0, k == 3 ? c[i] : 0);
        }
    }

    /// @notice Packed variant for bulk vectors: each case is arity(op) big-endian uint32s in a row;
    ///         the result is one big-endian uint32 per case (4 bytes each, so no ABI word per value).
    function runPacked(uint8 op, bytes calldata data) external pure returns (bytes memory out) {
        uint256 k = arity(op);
        if (k == 0) revert UnknownOp(op);
        uint256 stride = 4 * k;
        if (data.length % stride != 0) revert PackedLengthNotMultiple(op, data.length, stride);
        uint256 n = data.length / stride;
        out = new bytes(4 * n);
        for (uint256 i = 0; i < n; ++i) {
            uint256 p = i * stride;
            uint32 a = uint32(bytes4(data[p:p + 4]));
            uint32 b = k >= 2 ? uint32(bytes4(data[p + 4:p + 8])) : 0;
            uint32 c = k == 3 ? uint32(bytes4(data[p + 8:p + 12])) : 0;
            uint32 r = _apply(op, a, b, c);
            assembly {
                // SAFETY: out has 4*n bytes after its length word; mstore writes 32 bytes, so write
                // the 4 result bytes at their slot with a read-modify-write of the following bytes.
                let ptr := add(add(out, 32), mul(i, 4))
                mstore(ptr, or(shl(224, r), and(mload(ptr), 0x00000000ffffffffffffffffffffffffffffffffffffffffffffffffffffffff)))
            }
        }
    }

    /// @notice One op with the gas its window used (see the contract comment for the method).
    function measure(uint8 op, uint32 a, uint32 b, uint32 c) public view returns (uint32 r, uint256 gasUsed) {
        F32 x = F32.wrap(a);
        F32 y = F32.wrap(b);
        F32 z = F32.wrap(c);
        uint256 g;
        if (op == NOP) {
            g = gasleft();
            r = a;
        } else if (op == ADD) {
            g = gasleft();
            r = x.add(y).bits();
        } else if (op == SUB) {
            g = gasleft();
            r = x.sub(y).bits();
        } else if (op == MUL) {
            g = gasleft();
            r = x.mul(y).bits();
        } else if (op == DIV) {
            g = gasleft();
            r = x.div(y).bits();
        } else if (op == FMA) {
            g = gasleft();
            r = x.fma(y, z).bits();
        } else if (op == SQRT) {
            g = gasleft();
            r = x.sqrt().bits();
        } else if (op == MAX) {
            g = gasleft();
            r = x.max(y).bits();
        } else if (op == MIN) {
            g = gasleft();
            r = x.min(y).bits();
        } else if (op == LT) {
            g = gasleft();
            r = x.lt(y) ? 1 : 0;
        } else if (op == EQ) {
            g = gasleft();
            r = x.eq(y) ? 1 : 0;
        } else if (op == RINT) {
            g = gasleft();
            r = x.rint().bits();
        } else if (op == FLOOR) {
            g = gasleft();
            r = x.floor().bits();
        } else if (op == LDEXP) {
            g = gasleft();
            r = x.ldexpF(y).bits();
        } else if (op == GETEXP) {
            g = gasleft();
            r = x.getexp().bits();
        } else if (op == GETMANT) {
            g = gasleft();
            r = x.getmant().bits();
        } else if (op == FROM_I32) {
            g = gasleft();
            r = SoftFloat32.fromInt32(int32(a)).bits();
        } else if (op == TO_I32) {
            g = gasleft();
            r = uint32(x.toInt32());
        } else {
            revert UnknownOp(op);
        }
        gasUsed = g - gasleft();
    }

    /// @notice Sum and maximum of `measure` over many operand triples, in one call.
    function measureBatch(uint8 op, uint32[] calldata a, uint32[] calldata b, uint32[] calldata c)
        external
        view
        returns (uint256 total, uint256 worst)
    {
        if (b.length != a.length) revert OperandLengthMismatch(op, a.length, b.length);
        if (c.length != a.length) revert OperandLengthMismatch(op, a.length, c.length);
        for (uint256 i = 0; i < a.length; ++i) {
            (, uint256 g) = measure(op, a[i], b[i], c[i]);
            total += g;
            if (g > worst) worst = g;
        }
    }
}

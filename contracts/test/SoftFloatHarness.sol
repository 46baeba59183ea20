// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {F32, SoftFloat32} from "../vm/SoftFloat32.sol";
import {Instructions} from "../vm/Instructions.sol";

/// @notice Exposes SoftFloat32 to differential tests (batched, so thousands of TestFloat cases
///         go through one eth_call) and to the gas benchmark.
/// @dev Op codes: the RepOps opcode where one exists (verde_chain/repops/isa.py), plus conversions.
///      Results are uint32 words: float bits, 1/0 for comparisons, int32 two's complement for
///      TO_I32. LDEXP is the RepOps instruction (exponent b is a float); LDEXP_INT reads its
///      exponent n from operand b as an int32 (two's complement).
///
///      Every op is one small adapter (`_add`, `_mul`, ...) with the same signature, looked up once
///      by `_fn`, so `run`, `runPacked` and `measure` share one dispatch.
///
///      Gas method (`measure`): the adapter is looked up first, then called between two
///      `gasleft()` reads; op NOP (an adapter that copies a) measures the same window with no work,
///      and the benchmark subtracts it, so the figure is the op's internal call plus its body.
contract SoftFloatHarness {
    // RepOps opcodes: Instructions.<OP>; the harness's own codes (conversions, NOP) below.
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
        if (op == Instructions.FMA || op == Instructions.SELECT) return 3;
        if (op == Instructions.SQRT) return 1;
        if (op <= Instructions.EQ || op == Instructions.LDEXP || op == LE || op == LDEXP_INT) return 2;
        bool rounding = op == Instructions.RINT || op == Instructions.FLOOR;
        if (rounding || (op >= Instructions.GETEXP && op <= Instructions.ABS) || op == Instructions.MOV) return 1;
        if (op >= FROM_I32 && op <= TO_I32) return 1;
        return 0;
    }

    /// @dev The adapter for `op`; reverts UnknownOp for a code it does not know.
    function _fn(uint8 op) internal pure returns (function(uint32, uint32, uint32) pure returns (uint32)) {
        if (op == Instructions.ADD) return _add;
        if (op == Instructions.SUB) return _sub;
        if (op == Instructions.MUL) return _mul;
        if (op == Instructions.DIV) return _div;
        if (op == Instructions.FMA) return _fma;
        if (op == Instructions.SQRT) return _sqrt;
        if (op == Instructions.MAX) return _max;
        if (op == Instructions.MIN) return _min;
        if (op == Instructions.LT) return _lt;
        if (op == Instructions.EQ) return _eq;
        if (op == LE) return _le;
        if (op == Instructions.RINT) return _rint;
        if (op == Instructions.FLOOR) return _floor;
        if (op == Instructions.LDEXP) return _ldexpF;
        if (op == LDEXP_INT) return _ldexpInt;
        if (op == Instructions.SELECT) return _select;
        if (op == Instructions.MOV) return _mov;
        if (op == Instructions.GETEXP) return _getexp;
        if (op == Instructions.GETMANT) return _getmant;
        if (op == Instructions.NEG) return _neg;
        if (op == Instructions.ABS) return _abs;
        if (op == FROM_I32) return _fromInt32;
        if (op == FROM_U32) return _fromUint32;
        if (op == TO_I32) return _toInt32;
        if (op == NOP) return _nop;
        revert UnknownOp(op);
    }

    function _apply(uint8 op, uint32 a, uint32 b, uint32 c) internal pure returns (uint32) {
        return _fn(op)(a, b, c);
    }

    // ------------------------------------------------------------------ adapters, one per op

    function _add(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).add(F32.wrap(b)).bits();
    }

    function _sub(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).sub(F32.wrap(b)).bits();
    }

    function _mul(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).mul(F32.wrap(b)).bits();
    }

    function _div(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).div(F32.wrap(b)).bits();
    }

    function _fma(uint32 a, uint32 b, uint32 c) private pure returns (uint32) {
        return F32.wrap(a).fma(F32.wrap(b), F32.wrap(c)).bits();
    }

    function _sqrt(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).sqrt().bits();
    }

    function _max(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).max(F32.wrap(b)).bits();
    }

    function _min(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).min(F32.wrap(b)).bits();
    }

    function _lt(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).lt(F32.wrap(b)) ? 1 : 0;
    }

    function _eq(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).eq(F32.wrap(b)) ? 1 : 0;
    }

    function _le(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).le(F32.wrap(b)) ? 1 : 0;
    }

    function _rint(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).rint().bits();
    }

    function _floor(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).floor().bits();
    }

    function _ldexpF(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).ldexpF(F32.wrap(b)).bits();
    }

    function _ldexpInt(uint32 a, uint32 b, uint32) private pure returns (uint32) {
        return F32.wrap(a).ldexp(int32(b)).bits(); // b read as an int32 (two's complement)
    }

    function _select(uint32 a, uint32 b, uint32 c) private pure returns (uint32) {
        return F32.wrap(a).select(F32.wrap(b), F32.wrap(c)).bits();
    }

    function _mov(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).mov().bits();
    }

    function _getexp(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).getexp().bits();
    }

    function _getmant(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).getmant().bits();
    }

    function _neg(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).neg().bits();
    }

    function _abs(uint32 a, uint32, uint32) private pure returns (uint32) {
        return F32.wrap(a).abs().bits();
    }

    function _fromInt32(uint32 a, uint32, uint32) private pure returns (uint32) {
        return SoftFloat32.fromInt32(int32(a)).bits();
    }

    function _fromUint32(uint32 a, uint32, uint32) private pure returns (uint32) {
        return SoftFloat32.fromUint32(a).bits();
    }

    function _toInt32(uint32 a, uint32, uint32) private pure returns (uint32) {
        return uint32(F32.wrap(a).toInt32());
    }

    /// @dev The empty window `measure` subtracts: an adapter that does no work.
    function _nop(uint32 a, uint32, uint32) private pure returns (uint32) {
        return a;
    }

    // ------------------------------------------------------------------ entry points

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
        function(uint32, uint32, uint32) pure returns (uint32) f = _fn(op);
        uint256 g = gasleft();
        r = f(a, b, c);
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

// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IStepper, StepContext} from "./IStepper.sol";
import {Instructions} from "./Instructions.sol";
import {F32, SoftFloat32} from "./SoftFloat32.sol";
import {TensorCommit} from "../commit/TensorCommit.sol";
import {
    DescriptorHashMismatch,
    StepOutOfRange,
    ElementOutOfRange,
    BadStateLength,
    StateContextMismatch,
    InputCountMismatch,
    AddressOutOfRange,
    UnknownOpcode
} from "./VMErrors.sol";

/// @title ScalarVM — the one-step prover: executes ONE instruction of a RepOps scalar program
/// @notice Twin: verde_chain/vm/scalarvm.py. Opcode numbers: Instructions.sol, generated from
///         verde_chain/repops/isa.py. Program model and descriptor encoding are defined by
///         verde_chain/repops/program.py and docs/repops-spec.md:
///
///   desc = abi.encode(uint32[] outShape, uint32 K, InputMap[] inputs, bytes prologue,
///                     bytes body, bytes epilogue)         instructions: 8 bytes each
///   step j:   0 .. P-1 | P .. P+(K-1)*B-1      | P+(K-1)*B .. N-1
///   instr:    prologue | body[(j-P) % B]       | epilogue
///   k:        0        | 1 + (j-P) / B         | K-1
///
/// State preimage (STATE_BYTES = 160), hashed with keccak256:
///
///   | descHash (32) | element (32) | step j (32) | r0 r1 ... r15 (16 x 4 bytes, big-endian) |
///
/// Binding the node and element into every state means a state of one element can never be
/// replayed as a state of another. s_0 has j = 0 and all registers +0.0.
contract ScalarVM is IStepper {
    uint256 internal constant REGS_AT = 96;
    uint256 internal constant STATE_BYTES = REGS_AT + 4 * Instructions.NUM_REGS; // 160
    uint256 internal constant ONE = 0x3F800000;

    struct InputMap {
        uint64 numel;
        int64[] strides;
        int64 kstride;
        uint64 offset;
        int64 idxStride;
    }

    struct Desc {
        uint32[] outShape;
        uint32 K;
        InputMap[] inputs;
        bytes prologue;
        bytes body;
        bytes epilogue;
    }

    struct Instr {
        uint256 op;
        uint256 dst;
        uint256 a;
        uint256 b;
        uint256 imm;
        uint256 k;
    }

    /// @notice Proof for a LOAD / LOADIDX step: the leaf chunk holding the element and its siblings.
    struct LoadProof {
        bytes chunk;
        bytes32[] siblings;
    }

    // ------------------------------------------------------------------ IStepper

    /// @inheritdoc IStepper
    function describe(bytes calldata desc) external pure returns (uint256 outputNumel, uint256 numSteps) {
        Desc memory d = _decode(desc);
        return (_numel(d), _numSteps(d));
    }

    /// @inheritdoc IStepper
    function initialStateHash(StepContext calldata ctx) external pure returns (bytes32) {
        Desc memory d = _checkedDesc(ctx);
        if (ctx.element >= _numel(d)) revert ElementOutOfRange(ctx.element, _numel(d));
        return keccak256(abi.encodePacked(ctx.descHash, ctx.element, uint256(0), new bytes(Instructions.NUM_REGS * 4)));
    }

    /// @inheritdoc IStepper
    function step(StepContext calldata ctx, bytes calldata preState, bytes calldata proof)
        external
        pure
        returns (bytes32)
    {
        Desc memory d = _checkedDesc(ctx);
        uint256 numel = _numel(d);
        // INVARIANT: the element and step are those the game narrowed to; a pre-state from any
        // other node, element or step must not be accepted as s_j.
        if (ctx.element >= numel) revert ElementOutOfRange(ctx.element, numel);
        uint256 n = _numSteps(d);
        if (ctx.microStep >= n) revert StepOutOfRange(ctx.microStep, n);
        if (preState.length != STATE_BYTES) revert BadStateLength(preState.length, STATE_BYTES);
        if (
            bytes32(preState[0:32]) != ctx.descHash || uint256(bytes32(preState[32:64])) != ctx.element
                || uint256(bytes32(preState[64:96])) != ctx.microStep
        ) {
            revert StateContextMismatch(
                bytes32(preState[0:32]), uint256(bytes32(preState[32:64])), uint256(bytes32(preState[64:96]))
            );
        }
        if (ctx.inputRoots.length != d.inputs.length) revert InputCountMismatch(ctx.inputRoots.length, d.inputs.length);

        Instr memory ins = _fetch(d, ctx.microStep);
        uint256 value = _execute(d, ctx, preState, ins, proof);

        bytes memory post = preState;
        assembly ("memory-safe") {
            let data := add(post, 32)
            mstore(add(data, 64), add(mload(add(data, 64)), 1))
            // registers are 4-byte big-endian slots; rewrite slot `dst` in its 32-byte word
            let p := add(data, add(96, mul(mload(add(ins, 32)), 4)))
            let w := mload(p)
            w := or(and(w, not(shl(224, 0xffffffff))), shl(224, value))
            mstore(p, w)
        }
        return keccak256(post);
    }

    /// @inheritdoc IStepper
    function finalValue(bytes calldata statePreimage) external pure returns (bytes32 stateHash, uint32 value) {
        if (statePreimage.length != STATE_BYTES) revert BadStateLength(statePreimage.length, STATE_BYTES);
        return (keccak256(statePreimage), uint32(bytes4(statePreimage[REGS_AT:REGS_AT + 4])));
    }

    // ------------------------------------------------------------------ program model

    function _decode(bytes calldata desc) internal pure returns (Desc memory d) {
        (d.outShape, d.K, d.inputs, d.prologue, d.body, d.epilogue) =
            abi.decode(desc, (uint32[], uint32, InputMap[], bytes, bytes, bytes));
    }

    function _checkedDesc(StepContext calldata ctx) internal pure returns (Desc memory) {
        bytes32 h = keccak256(ctx.desc);
        // SAFETY: the descriptor is the node's committed op; any other program must be refused.
        if (h != ctx.descHash) revert DescriptorHashMismatch(h, ctx.descHash);
        return _decode(ctx.desc);
    }

    function _numel(Desc memory d) internal pure returns (uint256 n) {
        n = 1;
        for (uint256 i = 0; i < d.outShape.length; ++i) {
            n *= d.outShape[i];
        }
    }

    function _numSteps(Desc memory d) internal pure returns (uint256) {
        uint256 k = d.K == 0 ? 0 : uint256(d.K) - 1;
        uint256 w = Instructions.INSTR_BYTES;
        return d.prologue.length / w + k * (d.body.length / w) + d.epilogue.length / w;
    }

    /// @dev The instruction at micro-step j and its loop index k, in O(1).
    function _fetch(Desc memory d, uint256 j) internal pure returns (Instr memory ins) {
        uint256 p = d.prologue.length / Instructions.INSTR_BYTES;
        uint256 b = d.body.length / Instructions.INSTR_BYTES;
        bytes memory code;
        uint256 at;
        if (j < p) {
            (code, at, ins.k) = (d.prologue, j, 0);
        } else if (j < p + (uint256(d.K) - 1) * b) {
            (code, at, ins.k) = (d.body, (j - p) % b, 1 + (j - p) / b);
        } else {
            (code, at, ins.k) = (d.epilogue, j - p - (uint256(d.K) - 1) * b, uint256(d.K) - 1);
        }
        uint256 word;
        assembly ("memory-safe") {
            word := shr(192, mload(add(add(code, 32), mul(at, 8))))
        }
        ins.op = word >> 56;
        ins.dst = (word >> 48) & 0xff;
        ins.a = (word >> 40) & 0xff;
        ins.b = (word >> 32) & 0xff;
        ins.imm = word & 0xffffffff;
    }

    function _reg(bytes calldata state, uint256 r) internal pure returns (uint256) {
        uint256 at = REGS_AT + 4 * (r & 15);
        return uint32(bytes4(state[at:at + 4]));
    }

    function _coords(Desc memory d, uint256 e) internal pure returns (uint256[] memory c) {
        c = new uint256[](d.outShape.length);
        for (uint256 i = d.outShape.length; i > 0; --i) {
            c[i - 1] = e % d.outShape[i - 1];
            e /= d.outShape[i - 1];
        }
    }

    function _address(Desc memory d, uint256 t, uint256[] memory c, uint256 k) internal pure returns (int256 addr) {
        InputMap memory m = d.inputs[t];
        addr = int256(uint256(m.offset)) + int256(k) * m.kstride;
        for (uint256 i = 0; i < c.length; ++i) {
            addr += int256(c[i]) * m.strides[i];
        }
    }

    function _load(Desc memory d, StepContext calldata ctx, uint256 t, int256 addr, bytes calldata proof)
        internal
        pure
        returns (uint256)
    {
        uint256 numel = d.inputs[t].numel;
        if (addr < 0 || uint256(addr) >= numel) revert AddressOutOfRange(t, addr, numel);
        LoadProof memory lp = abi.decode(proof, (LoadProof));
        return TensorCommit.openElement(ctx.inputRoots[t], numel, uint256(addr), lp.chunk, lp.siblings);
    }

    /// @dev Integral value of a LOADIDX index register, or ok = false (finite integral only).
    function _index(uint256 x) internal pure returns (bool ok, int256 v) {
        F32 f = F32.wrap(uint32(x));
        if (SoftFloat32.isNaN(f) || SoftFloat32.isInf(f)) return (false, 0);
        if (F32.unwrap(SoftFloat32.floor(f)) != uint32(x)) return (false, 0);
        // |x| < 2^63 here is not guaranteed; values beyond int32 are out of range of any tensor
        int32 i = SoftFloat32.toInt32(f);
        if (i == type(int32).min && uint32(x) != 0xCF000000) return (false, 0);
        return (true, int256(i));
    }

    function _execute(Desc memory d, StepContext calldata ctx, bytes calldata pre, Instr memory ins, bytes calldata proof)
        internal
        pure
        returns (uint256)
    {
        uint256 op = ins.op;
        if (op == Instructions.CONST) return ins.imm;
        if (op == Instructions.LOAD || op == Instructions.COORD || op == Instructions.LOADIDX) {
            uint256[] memory c = _coords(d, ctx.element);
            if (op == Instructions.COORD) {
                return F32.unwrap(SoftFloat32.fromUint32(uint32(c[ins.imm])));
            }
            int256 addr = _address(d, ins.imm, c, ins.k);
            if (op == Instructions.LOADIDX) {
                (bool ok, int256 idx) = _index(_reg(pre, ins.a));
                if (!ok) return Instructions.CANONICAL_NAN;
                addr += idx * d.inputs[ins.imm].idxStride;
                if (addr < 0 || uint256(addr) >= d.inputs[ins.imm].numel) return Instructions.CANONICAL_NAN;
            }
            return _load(d, ctx, ins.imm, addr, proof);
        }
        return _alu(op, _reg(pre, ins.a), _reg(pre, ins.b), _reg(pre, ins.imm));
    }

    /// @dev The arithmetic family: one SoftFloat32 operation per opcode.
    function _alu(uint256 op, uint256 ra, uint256 rb, uint256 rc) internal pure returns (uint256) {
        F32 a = F32.wrap(uint32(ra));
        F32 b = F32.wrap(uint32(rb));
        if (op == Instructions.ADD) return F32.unwrap(SoftFloat32.add(a, b));
        if (op == Instructions.SUB) return F32.unwrap(SoftFloat32.sub(a, b));
        if (op == Instructions.MUL) return F32.unwrap(SoftFloat32.mul(a, b));
        if (op == Instructions.DIV) return F32.unwrap(SoftFloat32.div(a, b));
        if (op == Instructions.FMA) return F32.unwrap(SoftFloat32.fma(a, b, F32.wrap(uint32(rc))));
        if (op == Instructions.SQRT) return F32.unwrap(SoftFloat32.sqrt(a));
        if (op == Instructions.MAX) return F32.unwrap(SoftFloat32.max(a, b));
        if (op == Instructions.MIN) return F32.unwrap(SoftFloat32.min(a, b));
        if (op == Instructions.LT) return SoftFloat32.lt(a, b) ? ONE : 0;
        if (op == Instructions.EQ) return SoftFloat32.eq(a, b) ? ONE : 0;
        if (op == Instructions.SELECT) return F32.unwrap(SoftFloat32.select(a, b, F32.wrap(uint32(rc))));
        if (op == Instructions.RINT) return F32.unwrap(SoftFloat32.rint(a));
        if (op == Instructions.LDEXP) return F32.unwrap(SoftFloat32.ldexpF(a, b));
        if (op == Instructions.GETEXP) return F32.unwrap(SoftFloat32.getexp(a));
        if (op == Instructions.GETMANT) return F32.unwrap(SoftFloat32.getmant(a));
        if (op == Instructions.NEG) return F32.unwrap(SoftFloat32.neg(a));
        if (op == Instructions.ABS) return F32.unwrap(SoftFloat32.abs(a));
        if (op == Instructions.MOV) return F32.unwrap(SoftFloat32.mov(a));
        if (op == Instructions.FLOOR) return F32.unwrap(SoftFloat32.floor(a));
        revert UnknownOpcode(op);
    }
}

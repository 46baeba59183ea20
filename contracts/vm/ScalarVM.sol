// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IStepper, StepContext} from "./IStepper.sol";
import {Instructions} from "./Instructions.sol";
import {F32, SoftFloat32} from "./SoftFloat32.sol";
import {TensorCommit} from "../commit/TensorCommit.sol";
import {DescView} from "./DescView.sol";
import {
    DescriptorHashMismatch,
    StepOutOfRange,
    ElementOutOfRange,
    BadStateLength,
    StateContextMismatch,
    InputCountMismatch,
    AddressOutOfRange,
    UnknownOpcode,
    BadProof
} from "./VMErrors.sol";

/// @title ScalarVM — the one-step prover: executes ONE instruction of a RepOps scalar program
/// @notice Twin: verde_chain/vm/scalarvm.py. Opcode numbers: Instructions.sol, generated from
///         verde_chain/repops/isa.py. Program model and descriptor encoding are defined by
///         verde_chain/repops/program.py and docs/repops-spec.md:
///
///   desc = abi.encode(uint32[] outShape, uint32 K, InputMap[] inputs, bytes prologue,
///                     bytes body, bytes epilogue)         instructions: 8 bytes each
///        | the packed form of a descriptor with the window extension (conv, pooling; first
///          byte 0xE0): DescView.sol reads both where they lie in calldata
///   LOAD t: addr = offset + sum c[d]*strides[d] + k*kstride + sum_w (v_w/div_w)*stride_w,
///           v_w = outMul*c[axis] + kMul*kdigit[digit] + offset; a window with v_w < 0,
///           v_w % div != 0 or v_w/div >= size reads nothing: the result is the input's fill
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
        DescView.Meta memory m = DescView.meta(desc);
        return (_numel(m), _numSteps(m));
    }

    /// @inheritdoc IStepper
    function initialStateHash(StepContext calldata ctx) external pure returns (bytes32) {
        DescView.Meta memory m = _checkedMeta(ctx);
        if (ctx.element >= _numel(m)) revert ElementOutOfRange(ctx.element, _numel(m));
        return keccak256(abi.encodePacked(ctx.descHash, ctx.element, uint256(0), new bytes(Instructions.NUM_REGS * 4)));
    }

    /// @inheritdoc IStepper
    function step(StepContext calldata ctx, bytes calldata preState, bytes calldata proof)
        external
        pure
        returns (bytes32)
    {
        DescView.Meta memory m = _checkedMeta(ctx);
        uint256 numel = _numel(m);
        // INVARIANT: the element and step are those the game narrowed to; a pre-state from any
        // other node, element or step must not be accepted as s_j.
        if (ctx.element >= numel) revert ElementOutOfRange(ctx.element, numel);
        uint256 n = _numSteps(m);
        if (ctx.microStep >= n) revert StepOutOfRange(ctx.microStep, n);
        _checkPreState(ctx, preState);
        if (ctx.inputRoots.length != m.nInputs) revert InputCountMismatch(ctx.inputRoots.length, m.nInputs);

        Instr memory ins = _fetch(ctx.desc, m, ctx.microStep);
        uint256 value = _isMemory(ins.op)
            ? _memory(m, ctx, ins, _reg(preState, ins.a), proof)
            : _alu(ins.op, _reg(preState, ins.a), _reg(preState, ins.b), _reg(preState, ins.imm));

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

    function _checkedMeta(StepContext calldata ctx) internal pure returns (DescView.Meta memory) {
        bytes32 h = keccak256(ctx.desc);
        // SAFETY: the descriptor is the node's committed op; any other program must be refused.
        if (h != ctx.descHash) revert DescriptorHashMismatch(h, ctx.descHash);
        return DescView.meta(ctx.desc);
    }

    function _numel(DescView.Meta memory m) internal pure returns (uint256 n) {
        n = 1;
        for (uint256 i = 0; i < m.shape.length; ++i) {
            n *= m.shape[i];
        }
    }

    function _numSteps(DescView.Meta memory m) internal pure returns (uint256) {
        uint256 k = m.K == 0 ? 0 : m.K - 1;
        return m.codeLen[0] + k * m.codeLen[1] + m.codeLen[2];
    }

    /// @dev The instruction at micro-step j and its loop index k, in O(1).
    function _fetch(bytes calldata desc, DescView.Meta memory m, uint256 j) internal pure returns (Instr memory ins) {
        uint256 p = m.codeLen[0];
        uint256 b = m.codeLen[1];
        uint256 word;
        if (j < p) {
            (word, ins.k) = (DescView.word(desc, m, 0, j), 0);
        } else if (j < p + (m.K - 1) * b) {
            (word, ins.k) = (DescView.word(desc, m, 1, (j - p) % b), 1 + (j - p) / b);
        } else {
            (word, ins.k) = (DescView.word(desc, m, 2, j - p - (m.K - 1) * b), m.K - 1);
        }
        ins.op = word >> 56;
        ins.dst = (word >> 48) & 0xff;
        ins.a = (word >> 40) & 0xff;
        ins.b = (word >> 32) & 0xff;
        ins.imm = word & 0xffffffff;
    }

    /// @dev The pre-state is a state of this node, element and micro-step.
    function _checkPreState(StepContext calldata ctx, bytes calldata preState) internal pure {
        if (preState.length != STATE_BYTES) revert BadStateLength(preState.length, STATE_BYTES);
        (bytes32 dh, uint256 el, uint256 j) = (bytes32(_word(preState, 0)), _word(preState, 32), _word(preState, 64));
        if (dh != ctx.descHash || el != ctx.element || j != ctx.microStep) revert StateContextMismatch(dh, el, j);
    }

    /// @dev Register r of a pre-state (its length checked: STATE_BYTES).
    function _reg(bytes calldata state, uint256 r) internal pure returns (uint256) {
        return _word(state, REGS_AT + 4 * (r & 15)) >> 224;
    }

    /// @dev The 32 bytes at `at` of a calldata buffer whose length was checked to cover them (one
    ///      calldataload; a calldata slice converted to bytes32 costs some 400 gas in the legacy
    ///      code generator).
    function _word(bytes calldata b, uint256 at) internal pure returns (uint256 v) {
        assembly {
            v := calldataload(add(b.offset, at))
        }
    }

    function _coords(DescView.Meta memory m, uint256 e) internal pure returns (uint256[] memory c) {
        c = new uint256[](m.shape.length);
        for (uint256 i = m.shape.length; i > 0; --i) {
            c[i - 1] = e % m.shape[i - 1];
            e /= m.shape[i - 1];
        }
    }

    function _isMemory(uint256 op) internal pure returns (bool) {
        return op == Instructions.CONST || op == Instructions.LOAD || op == Instructions.COORD
            || op == Instructions.LOADIDX;
    }

    /// @dev CONST, COORD, LOAD, LOADIDX (`regA`: the index register's value).
    function _memory(
        DescView.Meta memory m,
        StepContext calldata ctx,
        Instr memory ins,
        uint256 regA,
        bytes calldata proof
    ) internal pure returns (uint256) {
        if (ins.op == Instructions.CONST) return ins.imm;
        uint256[] memory c = _coords(m, ctx.element);
        if (ins.op == Instructions.COORD) {
            return F32.unwrap(SoftFloat32.fromUint32(uint32(c[ins.imm])));
        }
        DescView.Loc memory at = DescView.locate(ctx.desc, m, ins.imm, c, ins.k);
        if (!at.inside) return at.fill;
        if (ins.op == Instructions.LOADIDX) {
            (bool ok, int256 idx) = _index(regA);
            if (!ok) return Instructions.CANONICAL_NAN;
            at.addr += idx * at.idxStride;
            if (at.addr < 0 || uint256(at.addr) >= at.numel) return Instructions.CANONICAL_NAN;
        }
        return _open(ctx.inputRoots[ins.imm], ins.imm, at.numel, at.addr, proof);
    }

    /// @dev Element `addr` of input t from its proof (abi.encode((bytes chunk, bytes32[] siblings)),
    ///      read in place) against the input's root.
    function _open(bytes32 root, uint256 t, uint256 numel, int256 addr, bytes calldata proof)
        internal
        pure
        returns (uint256)
    {
        if (addr < 0 || uint256(addr) >= numel) revert AddressOutOfRange(t, addr, numel);
        LoadProof calldata lp;
        // SAFETY: the proof is one dynamic tuple: its first word is its offset, inside the proof.
        if (proof.length < 32 || _word(proof, 0) >= proof.length) revert BadProof(proof.length);
        assembly {
            lp := add(proof.offset, calldataload(proof.offset))
        }
        return TensorCommit.openElement(root, numel, uint256(addr), lp.chunk, lp.siblings);
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

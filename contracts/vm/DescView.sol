// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Instructions} from "./Instructions.sol";
import {UnknownDescriptorForm} from "./VMErrors.sol";

/// @title DescView — a kernel descriptor read where it lies in calldata, in either of its forms
/// @notice Twin: verde_chain/repops/program.py (KernelDesc.encode / decode). Nothing is copied but
///         the geometry every step needs and the map of the one input a load reads.
///
///   abi form (no window extension; first word 0xC0, the head size):
///     abi.encode(uint32[] outShape, uint32 K,
///                (uint64 numel, int64[] strides, int64 kstride, uint64 offset, int64 idxStride)[] inputs,
///                bytes prologue, bytes body, bytes epilogue)
///   packed form (the window extension; first byte 0xE0; big-endian, no padding):
///     u8 0xE0 | u8 rank, u32 outShape[rank] | u32 K | u8 n, u32 kdims[n] | u8 inputs, per input:
///       u64 numel, i64 strides[rank], i64 kstride, u64 offset, i64 idxStride, u32 fill, u8 windows,
///       per window (46 bytes): u8 axis, i64 outMul, u8 digit, i64 kMul, i64 offset, u32 div,
///                              u64 size, i64 stride
///     | u32 P, prologue | u32 B, body | u32 E, epilogue          (8-byte instruction words)
library DescView {
    uint256 internal constant HEAD_PLAIN = 0xC0;
    uint256 internal constant PACKED_TAG = 0xE0;
    uint256 internal constant WINDOW_BYTES = 46;

    struct AbiInput {
        uint64 numel;
        int64[] strides;
        int64 kstride;
        uint64 offset;
        int64 idxStride;
    }

    struct AbiDesc {
        uint32[] outShape;
        uint32 K;
        AbiInput[] inputs;
        bytes prologue;
        bytes body;
        bytes epilogue;
    }

    /// @notice What every step needs: the output shape, K, the programs (offset in the descriptor
    ///         and instruction count per phase), the digits of k, and where the inputs are.
    struct Meta {
        uint256[] shape;
        uint256 K;
        uint256 nInputs;
        uint256[3] codeAt;
        uint256[3] codeLen;
        uint256[] kdims; // empty: one digit, k itself
        bool packed;
        uint256 inputsAt; // packed: the first input record
    }

    struct Window {
        uint256 axis;
        int256 outMul;
        uint256 digit;
        int256 kMul;
        int256 offset;
        uint256 div;
        uint256 size;
        int256 stride;
    }

    /// @notice Where a load reads (see locate).
    struct Loc {
        int256 addr;
        bool inside;
        uint256 numel;
        int256 idxStride;
        uint256 fill;
    }

    /// @notice One input's map (abi form: no windows, fill +0).
    struct Input {
        uint256 numel;
        int256[] strides;
        int256 kstride;
        uint256 offset;
        int256 idxStride;
        uint256 fill;
        Window[] windows;
    }

    function meta(bytes calldata desc) internal pure returns (Meta memory m) {
        if (desc.length > 0 && _u(desc, 0, 1) == PACKED_TAG) return _packedMeta(desc);
        AbiDesc calldata d = _abi(desc);
        uint32[] calldata shape = d.outShape;
        m.shape = new uint256[](shape.length);
        for (uint256 i = 0; i < shape.length; ++i) {
            m.shape[i] = shape[i];
        }
        m.K = d.K;
        m.nInputs = d.inputs.length;
        (m.codeAt[0], m.codeLen[0]) = _code(desc, d.prologue);
        (m.codeAt[1], m.codeLen[1]) = _code(desc, d.body);
        (m.codeAt[2], m.codeLen[2]) = _code(desc, d.epilogue);
    }

    /// @notice The 8-byte word of instruction `at` of phase `phase` (0 prologue, 1 body, 2 epilogue).
    function word(bytes calldata desc, Meta memory m, uint256 phase, uint256 at) internal pure returns (uint256) {
        return _u(desc, m.codeAt[phase] + at * Instructions.INSTR_BYTES, Instructions.INSTR_BYTES);
    }

    function input(bytes calldata desc, Meta memory m, uint256 t) internal pure returns (Input memory p) {
        uint256 rank = m.shape.length;
        p.strides = new int256[](rank);
        if (!m.packed) {
            AbiInput calldata a = _abi(desc).inputs[t];
            (p.numel, p.kstride, p.offset, p.idxStride) = (a.numel, a.kstride, a.offset, a.idxStride);
            for (uint256 i = 0; i < rank; ++i) {
                p.strides[i] = a.strides[i];
            }
            return p;
        }
        // Packed: every record boundary was checked by meta (the records and programs add up to
        // the descriptor's length), so these reads stay inside it. Assembly: a Solidity-level read
        // costs some 200 gas in the legacy code generator, this one a few.
        uint256 at = m.inputsAt;
        uint256 nw;
        int256[] memory strides = p.strides;
        assembly ("memory-safe") {
            let base := desc.offset
            for { let i := 0 } lt(i, t) { i := add(i, 1) } {
                let w := shr(248, calldataload(add(base, add(at, add(36, mul(8, rank))))))
                at := add(at, add(add(37, mul(8, rank)), mul(WINDOW_BYTES, w)))
            }
            mstore(p, shr(192, calldataload(add(base, at)))) // numel
            for { let i := 0 } lt(i, rank) { i := add(i, 1) } {
                let v := signextend(7, shr(192, calldataload(add(base, add(at, add(8, mul(8, i)))))))
                mstore(add(add(strides, 32), mul(32, i)), v)
            }
            at := add(at, add(8, mul(8, rank)))
            mstore(add(p, 64), signextend(7, shr(192, calldataload(add(base, at))))) // kstride
            mstore(add(p, 96), shr(192, calldataload(add(base, add(at, 8))))) // offset
            mstore(add(p, 128), signextend(7, shr(192, calldataload(add(base, add(at, 16)))))) // idxStride
            mstore(add(p, 160), shr(224, calldataload(add(base, add(at, 24))))) // fill
            nw := shr(248, calldataload(add(base, add(at, 28))))
            at := add(at, 29)
        }
        p.windows = new Window[](nw);
        Window[] memory ws = p.windows;
        assembly ("memory-safe") {
            let base := desc.offset
            for { let i := 0 } lt(i, nw) { i := add(i, 1) } {
                let w := mload(add(add(ws, 32), mul(32, i)))
                let src := add(base, add(at, mul(WINDOW_BYTES, i)))
                mstore(w, shr(248, calldataload(src))) // axis
                mstore(add(w, 32), signextend(7, shr(192, calldataload(add(src, 1))))) // outMul
                mstore(add(w, 64), shr(248, calldataload(add(src, 9)))) // digit
                mstore(add(w, 96), signextend(7, shr(192, calldataload(add(src, 10))))) // kMul
                mstore(add(w, 128), signextend(7, shr(192, calldataload(add(src, 18))))) // offset
                mstore(add(w, 160), shr(224, calldataload(add(src, 26)))) // div
                mstore(add(w, 192), shr(192, calldataload(add(src, 30)))) // size
                mstore(add(w, 224), signextend(7, shr(192, calldataload(add(src, 38))))) // stride
            }
        }
    }

    /// @notice The address a LOAD of input `p` reads at (c, k); inside = false when a window is
    ///         out of range (nothing is read: the result is the input's fill).
    function addressOf(Meta memory m, Input memory p, uint256[] memory c, uint256 k)
        internal
        pure
        returns (int256 addr, bool inside)
    {
        addr = int256(p.offset) + int256(k) * p.kstride;
        for (uint256 i = 0; i < c.length; ++i) {
            addr += int256(c[i]) * p.strides[i];
        }
        if (p.windows.length == 0) return (addr, true);
        uint256[] memory kd = _digits(m, k);
        for (uint256 i = 0; i < p.windows.length; ++i) {
            Window memory w = p.windows[i];
            int256 v = w.offset;
            if (w.outMul != 0) v += int256(c[w.axis]) * w.outMul;
            if (w.kMul != 0) v += int256(kd[w.digit]) * w.kMul;
            if (v < 0 || uint256(v) % w.div != 0 || uint256(v) / w.div >= w.size) return (addr, false);
            addr += int256(uint256(v) / w.div) * w.stride;
        }
        return (addr, true);
    }

    /// @notice Where a LOAD of input t reads at (c, k): the address, whether every window is in
    ///         range (else the result is `fill` and nothing is read), and the input's size and
    ///         index stride. The packed form is read in one assembly pass: no map is copied.
    function locate(bytes calldata desc, Meta memory m, uint256 t, uint256[] memory c, uint256 k)
        internal
        pure
        returns (Loc memory loc)
    {
        if (!m.packed) {
            Input memory p = input(desc, m, t);
            (loc.addr, loc.inside) = addressOf(m, p, c, k);
            (loc.numel, loc.idxStride) = (p.numel, p.idxStride);
            return loc;
        }
        uint256 ws;
        (loc.addr, loc.numel, loc.idxStride, loc.fill, ws) = _linearPacked(desc, m, t, c, k);
        int256 delta;
        (delta, loc.inside) = _windows(ws, c, _digits(m, k));
        loc.addr += delta;
    }

    /// @dev Input t's linear address terms, size, index stride and fill, and the calldata position
    ///      of its window count.
    function _linearPacked(bytes calldata desc, Meta memory m, uint256 t, uint256[] memory c, uint256 k)
        private
        pure
        returns (int256 addr, uint256 numel, int256 idxStride, uint256 fill, uint256 ws)
    {
        uint256 rank = m.shape.length;
        uint256 at = m.inputsAt;
        // Every record boundary was checked by meta; the reads below stay inside the descriptor.
        assembly ("memory-safe") {
            let base := desc.offset
            for { let i := 0 } lt(i, t) { i := add(i, 1) } {
                let w := shr(248, calldataload(add(base, add(at, add(36, mul(8, rank))))))
                at := add(at, add(add(37, mul(8, rank)), mul(WINDOW_BYTES, w)))
            }
            numel := shr(192, calldataload(add(base, at)))
            let s := add(base, add(at, 8))
            for { let i := 0 } lt(i, rank) { i := add(i, 1) } {
                let st := signextend(7, shr(192, calldataload(add(s, mul(8, i)))))
                addr := add(addr, mul(mload(add(add(c, 32), mul(32, i))), st))
            }
            let r := add(s, mul(8, rank))
            addr := add(addr, mul(k, signextend(7, shr(192, calldataload(r))))) // k * kstride
            addr := add(addr, shr(192, calldataload(add(r, 8)))) // offset
            idxStride := signextend(7, shr(192, calldataload(add(r, 16))))
            fill := shr(224, calldataload(add(r, 24)))
            ws := add(r, 28)
        }
    }

    /// @dev The windows' address terms from calldata position `ws` (their count, then 46-byte
    ///      records), or inside = false at the first one out of range.
    function _windows(uint256 ws, uint256[] memory c, uint256[] memory kd)
        private
        pure
        returns (int256 delta, bool inside)
    {
        bool bad;
        assembly ("memory-safe") {
            let nw := shr(248, calldataload(ws))
            inside := 1
            for { let i := 0 } lt(i, nw) { i := add(i, 1) } {
                let src := add(add(ws, 1), mul(WINDOW_BYTES, i))
                let v := signextend(7, shr(192, calldataload(add(src, 18)))) // offset
                let om := signextend(7, shr(192, calldataload(add(src, 1))))
                if om {
                    let axis := shr(248, calldataload(src))
                    if iszero(lt(axis, mload(c))) { bad := 1 }
                    v := add(v, mul(mload(add(add(c, 32), mul(32, axis))), om))
                }
                let km := signextend(7, shr(192, calldataload(add(src, 10))))
                if km {
                    let digit := shr(248, calldataload(add(src, 9)))
                    if iszero(lt(digit, mload(kd))) { bad := 1 }
                    v := add(v, mul(mload(add(add(kd, 32), mul(32, digit))), km))
                }
                let dv := shr(224, calldataload(add(src, 26)))
                if iszero(dv) { bad := 1 }
                if or(bad, or(slt(v, 0), or(smod(v, dv), iszero(lt(sdiv(v, dv), shr(192, calldataload(add(src, 30)))))))) {
                    inside := 0
                    break
                }
                delta := add(delta, mul(sdiv(v, dv), signextend(7, shr(192, calldataload(add(src, 38))))))
            }
        }
        // SAFETY: a window naming an axis or digit that does not exist, or dividing by 0, would
        // read a coordinate from outside its array: refuse it (program.py never builds one).
        if (bad) revert UnknownDescriptorForm(PACKED_TAG);
    }

    // ------------------------------------------------------------------ internals

    function _packedMeta(bytes calldata desc) private pure returns (Meta memory m) {
        m.packed = true;
        uint256 rank = _u(desc, 1, 1);
        uint256 at = 2 + 4 * rank;
        uint256 nd = _u(desc, at + 4, 1);
        m.shape = new uint256[](rank);
        m.kdims = new uint256[](nd);
        uint256[] memory shape = m.shape;
        uint256[] memory kdims = m.kdims;
        uint256 nIn;
        uint256 end = desc.length;
        // Assembly reads (see input); every one lies before `at`, which must come out at the end.
        assembly ("memory-safe") {
            let base := desc.offset
            for { let i := 0 } lt(i, rank) { i := add(i, 1) } {
                mstore(add(add(shape, 32), mul(32, i)), shr(224, calldataload(add(base, add(2, mul(4, i))))))
            }
            mstore(add(m, 32), shr(224, calldataload(add(base, at)))) // K
            at := add(at, 5)
            for { let i := 0 } lt(i, nd) { i := add(i, 1) } {
                mstore(add(add(kdims, 32), mul(32, i)), shr(224, calldataload(add(base, add(at, mul(4, i))))))
            }
            at := add(at, mul(4, nd))
            nIn := shr(248, calldataload(add(base, at)))
            at := add(at, 1)
        }
        m.nInputs = nIn;
        m.inputsAt = at;
        uint256[3] memory codeAt;
        uint256[3] memory codeLen;
        uint256 instrBytes = Instructions.INSTR_BYTES;
        assembly ("memory-safe") {
            let base := desc.offset
            for { let t := 0 } lt(t, nIn) { t := add(t, 1) } {
                let w := shr(248, calldataload(add(base, add(at, add(36, mul(8, rank))))))
                at := add(at, add(add(37, mul(8, rank)), mul(WINDOW_BYTES, w)))
                if gt(at, end) { break }
            }
            for { let ph := 0 } lt(ph, 3) { ph := add(ph, 1) } {
                let n := shr(224, calldataload(add(base, at)))
                if gt(n, end) { n := end } // a bogus count: the length check below fails
                mstore(add(codeLen, mul(32, ph)), n)
                mstore(add(codeAt, mul(32, ph)), add(at, 4))
                at := add(at, add(4, mul(instrBytes, n)))
            }
        }
        (m.codeAt, m.codeLen) = (codeAt, codeLen);
        // SAFETY: the records and programs add up to exactly the descriptor (one encoding per
        // descriptor, and no read above lies past its end).
        if (at != end) revert UnknownDescriptorForm(PACKED_TAG);
    }

    function _abi(bytes calldata desc) private pure returns (AbiDesc calldata d) {
        // SAFETY: the head words hold offsets relative to the encoding's start; each must stay
        // inside the descriptor, or a field would be read from the calldata that follows it (the
        // pre-state or the proof, which the caller chooses). Deeper offsets are those abi.encode
        // wrote: the descriptor's hash is the node's committed descHash (NodeCheck at L2), and an
        // honest party re-derives every committed descriptor from the model (load_job) before it
        // takes a job.
        if (desc.length < HEAD_PLAIN || _u(desc, 0, 32) != HEAD_PLAIN) {
            revert UnknownDescriptorForm(desc.length < 32 ? 0 : _u(desc, 0, 32));
        }
        for (uint256 i = 2; i < 6; ++i) {
            if (_u(desc, i * 32, 32) >= desc.length) revert UnknownDescriptorForm(HEAD_PLAIN);
        }
        assembly {
            d := desc.offset
        }
    }

    /// @dev A program's offset inside the descriptor and its instruction count.
    function _code(bytes calldata desc, bytes calldata code) private pure returns (uint256, uint256) {
        uint256 at;
        assembly {
            at := sub(code.offset, desc.offset)
        }
        // SAFETY: the program lies inside the descriptor (see _abi).
        if (at + code.length > desc.length) revert UnknownDescriptorForm(HEAD_PLAIN);
        return (at, code.length / Instructions.INSTR_BYTES);
    }

    function _digits(Meta memory m, uint256 k) private pure returns (uint256[] memory kd) {
        if (m.kdims.length == 0) {
            kd = new uint256[](1);
            kd[0] = k;
            return kd;
        }
        kd = new uint256[](m.kdims.length);
        for (uint256 i = m.kdims.length; i > 0; --i) {
            kd[i - 1] = k % m.kdims[i - 1];
            k /= m.kdims[i - 1];
        }
    }

    /// @dev n (1..32) bytes at `at`, big-endian. (One calldataload: converting a calldata slice
    ///      to bytes32 costs some 400 gas per read in the legacy code generator.)
    function _u(bytes calldata b, uint256 at, uint256 n) private pure returns (uint256 v) {
        // SAFETY: never read past the descriptor into the calldata after it.
        if (at + n > b.length) revert UnknownDescriptorForm(b.length);
        assembly {
            v := shr(sub(256, mul(8, n)), calldataload(add(b.offset, at)))
        }
    }

    function _i64(bytes calldata b, uint256 at) private pure returns (int256) {
        return int256(int64(uint64(_u(b, at, 8))));
    }
}

"""KernelDesc encoding, O(1) instruction lookup vs the trace, LOADIDX rules, and the RNG."""

from __future__ import annotations

import numpy as np
import pytest
from eth_abi import decode as abi_decode
from hypothesis import given, settings
from hypothesis import strategies as st

from verde_chain.errors import RepOpsError
from verde_chain.repops import library, program, reference, rng
from verde_chain.repops.isa import CANONICAL_NAN, Instr, Op, f32_bits
from verde_chain.repops.program import DescriptorError, InputMap, KernelDesc, instruction_at, trace

F32 = np.float32


def _descs() -> list[KernelDesc]:
    return [
        library.matmul((2, 3, 4), (4, 5)),
        library.matmul((4, 3), (5, 4), trans_a=True, trans_b=True),
        library.gemm((3, 4), (4, 2), (2,), alpha=0.5, beta=2.0),
        library.binary("sub", (3, 1), (1, 4)),
        library.reduce("mean", (2, 3, 4), (1, 2)),
        library.reduce("max", (5,), None, keepdims=False),
        library.gather((6, 3), (2, 2), 0),
        library.scatter_add(4, (3,), 5),
        library.transpose((2, 3, 4), (2, 0, 1)),
        library.map_unary("relu", ()),
    ]


@pytest.mark.parametrize("desc", _descs(), ids=lambda d: d.label)
def test_encode_decode_round_trip(desc: KernelDesc) -> None:
    data = desc.encode()
    back = KernelDesc.decode(data)
    assert back == desc
    assert back.hash() == desc.hash()
    assert len(desc.hash()) == 32
    # The layout is the documented Solidity abi.encode tuple.
    shape, K, ins, pro, body, epi = abi_decode(list(program.ABI_TYPES), data)
    assert list(shape) == list(desc.out_shape) and K == desc.K
    assert [(n, list(s), ks, off, ids) for n, s, ks, off, ids in ins] == [
        (m.numel, list(m.strides), m.kstride, m.offset, m.idx_stride) for m in desc.inputs
    ]
    assert len(pro) == 8 * len(desc.prologue) and len(body) == 8 * len(desc.body) and len(epi) == 8 * len(desc.epilogue)


def test_hash_changes_with_every_field_and_ignores_label() -> None:
    d = library.matmul((2, 3), (3, 4))
    variants = [
        KernelDesc((2, 4), 3, d.inputs, d.prologue, d.body, d.epilogue, label="other"),
    ]
    assert variants[0].hash() == d.hash()
    changed = [
        KernelDesc((2, 4), 2, (InputMap(6, (3, 0), 1), d.inputs[1]), d.prologue, d.body, d.epilogue),
        KernelDesc((2, 4), 3, (InputMap(6, (3, 0), 1, 0, 1), d.inputs[1]), d.prologue, d.body, d.epilogue),
        KernelDesc((2, 4), 3, d.inputs, d.prologue, d.body, d.epilogue + (Instr(Op.NEG, 0, 0),)),
        KernelDesc((2, 4), 3, d.inputs, d.prologue[:2] + (Instr(Op.MUL, 0, 2, 1),), d.body, d.epilogue),
    ]
    hashes = {d.hash()} | {c.hash() for c in changed}
    assert len(hashes) == 1 + len(changed)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    K=st.integers(1, 5),
    strides_seed=st.integers(0, 2**32 - 1),
)
def test_random_descriptor_round_trip(shape: list[int], K: int, strides_seed: int) -> None:
    r = np.random.default_rng(strides_seed)
    strides = tuple(int(x) for x in r.integers(-3, 4, size=len(shape)))
    kstride = int(r.integers(-2, 3))
    lo_hi = InputMap(1, strides, kstride).base_range(tuple(shape), K)
    offset = -lo_hi[0]
    numel = lo_hi[1] - lo_hi[0] + 1
    m = InputMap(numel, strides, kstride, offset, int(r.integers(-5, 6)))
    body = (Instr(Op.LOAD, 1, imm=0), Instr(Op.FMA, 0, 1, 1, 0)) if K > 1 else ()
    d = KernelDesc(tuple(shape), K, (m,), (Instr(Op.LOAD, 0, imm=0),), body, (Instr(Op.CONST, 3, imm=0xDEADBEEF),))
    assert KernelDesc.decode(d.encode()) == d


@pytest.mark.parametrize("desc", _descs()[:8], ids=lambda d: d.label)
def test_instruction_at_matches_trace(desc: KernelDesc) -> None:
    r = np.random.default_rng(1)
    ins = [r.standard_normal(m.numel).astype(F32) for m in desc.inputs]
    if desc.label == "gather":
        ins[1] = np.array([0, 5, -1, 2], F32)
    if desc.label == "scatter_add":
        ins[1] = np.array([1, 4, 1, 0], F32)
    out = program.run_spec(desc, ins).reshape(-1).view(np.uint32)
    for e in (0, desc.numel - 1):
        tr = trace(desc, ins, e)
        assert len(tr) == desc.num_steps
        assert tr[0].pre == program.VMState(0, (0,) * 16)
        for j, s in enumerate(tr):
            assert s.j == j and s.pre.step == j and s.post.step == j + 1
            assert (s.instr, s.k) == instruction_at(desc, j)
            if j:
                assert tr[j - 1].post == s.pre
            # only the destination register changes
            diff = [i for i in range(16) if s.pre.regs[i] != s.post.regs[i]]
            assert diff in ([], [s.instr.dst])
            if s.instr.op in (Op.LOAD, Op.LOADIDX):
                assert s.access is not None and s.access.value == s.post.regs[s.instr.dst]
        assert tr[-1].post.regs[0] == out[e]


def test_instruction_at_phases_and_bounds() -> None:
    d = library.matmul((2, 5), (5, 3))  # P = 3, B = 3, K = 5, E = 0
    assert d.num_steps == 3 + 4 * 3
    assert instruction_at(d, 0) == (d.prologue[0], 0)
    assert instruction_at(d, 3) == (d.body[0], 1)
    assert instruction_at(d, 14) == (d.body[2], 4)
    g = library.gemm((2, 5), (5, 3), (3,), alpha=2.0)
    n = g.num_steps
    assert instruction_at(g, n - 1) == (g.epilogue[-1], 4)
    with pytest.raises(DescriptorError):
        instruction_at(d, d.num_steps)
    with pytest.raises(DescriptorError):
        instruction_at(d, -1)


def _loadidx_desc(numel: int, idx_stride: int = 1) -> KernelDesc:
    dm = InputMap(numel, (0,), 0, 0, idx_stride)
    im = InputMap(4, (1,))
    return KernelDesc((4,), 1, (dm, im), (Instr(Op.LOAD, 1, imm=1), Instr(Op.LOADIDX, 0, 1, 0, 0)))


@pytest.mark.parametrize(
    "index, expect_nan",
    [(0.0, False), (-0.0, False), (2.0, False), (3.0, True), (-1.0, True), (0.5, True),
     (float("nan"), True), (float("inf"), True), (float("-inf"), True), (1e30, True), (2.0**-149, True)],
)
def test_loadidx_rule(index: float, expect_nan: bool) -> None:
    d = _loadidx_desc(3)
    data = np.array([10.0, 11.0, 12.0], F32)
    idx = np.full(4, index, F32)
    for out in (program.run_spec(d, [data, idx]), reference.run(d, [data, idx])):
        bits = out.view(np.uint32)
        if expect_nan:
            assert (bits == CANONICAL_NAN).all()
        else:
            assert (out == data[int(index)]).all()
    acc = trace(d, [data, idx], 0)[1].access
    assert acc is not None and (acc.address is None) == expect_nan


def test_descriptor_validation() -> None:
    with pytest.raises(DescriptorError, match="addresses"):
        KernelDesc((4,), 1, (InputMap(3, (1,)),), (Instr(Op.LOAD, 0, imm=0),))
    with pytest.raises(DescriptorError, match="COORD"):
        KernelDesc((4,), 1, (), (Instr(Op.COORD, 0, imm=1),))
    with pytest.raises(DescriptorError, match="body"):
        KernelDesc((4,), 2, (), (Instr(Op.CONST, 0, imm=0),))
    with pytest.raises(DescriptorError, match="reads input"):
        KernelDesc((4,), 1, (), (Instr(Op.LOAD, 0, imm=0),))
    with pytest.raises(DescriptorError, match="rank"):
        KernelDesc((1,) * 7, 1, (), (Instr(Op.CONST, 0, imm=0),))
    with pytest.raises(RepOpsError, match="float32"):
        program.run_spec(library.map_unary("neg", (2,)), [np.zeros(2, np.float64)])
    with pytest.raises(DescriptorError, match="elements"):
        reference.run(library.map_unary("neg", (2,)), [np.zeros(3, F32)])


def test_coord_and_const() -> None:
    d = KernelDesc((3, 5), 1, (), (Instr(Op.COORD, 0, imm=1), Instr(Op.COORD, 1, imm=0),
                                   Instr(Op.CONST, 2, imm=f32_bits(10.0)), Instr(Op.FMA, 0, 1, 2, 0)))
    want = (np.arange(3)[:, None] * 10 + np.arange(5)[None, :]).astype(F32)
    assert (reference.run(d, []) == want).all()
    assert (program.run_spec(d, []) == want).all()


def test_exact_constants() -> None:
    from fractions import Fraction

    for x in [Fraction(1, 3), Fraction(2, 3), Fraction(1, 10), Fraction(10**12 + 1, 7), Fraction(-5, 11)]:
        assert library.f32_of_fraction(x) == float(np.float32(float(x)))  # double rounding is safe here
    # halfway case: 1 + 2**-24 rounds to even (1.0); 1 + 3*2**-24 rounds up
    assert library.f32_of_fraction(Fraction(1) + Fraction(1, 2**24)) == 1.0
    assert library.f32_of_fraction(Fraction(1) + Fraction(3, 2**24)) == 1.0 + 2**-22
    for x in [Fraction(2), Fraction(1, 10), Fraction(999, 1000), Fraction(1) - Fraction(999, 1000) ** 3, Fraction(9, 4)]:
        got = library.f32_of_sqrt_fraction(x)
        ref = float(np.float32(np.sqrt(np.float64(float(x)))))
        assert got == ref
    assert library.f32_of_sqrt_fraction(Fraction(9, 4)) == 1.5


def _adam_constants_exactly(lr: float, b1: float, b2: float, t: int) -> tuple[float, float]:
    """Adam's two step constants from the exact powers (the definition)."""
    from verde_chain.repops.library.exact import f32q

    L, B1, B2 = f32q(lr), f32q(b1), f32q(b2)
    return library.f32_of_fraction(L / (1 - B1**t)), library.f32_of_sqrt_fraction(1 - B2**t)


BETAS = [0.9, 0.999, 0.95, 0.5, 0.0, 1 - 2**-24, 2**-20]


@pytest.mark.parametrize("b1,b2", list(zip(BETAS, BETAS[1:] + BETAS[:1], strict=True)))
def test_adam_constants_from_power_enclosures_equal_the_exact_powers(b1: float, b2: float) -> None:
    """The step size and the square root of Adam's bias correction, decided at the corners of an
    enclosure of b**t, are the bits of the exact rational: every step to 300, around powers of
    two, and far steps."""
    for t in [*range(1, 301), 511, 512, 513, 1000, 4095, 4096, 9999, 12345]:
        k = library.adam_constants(3e-4, b1, b2, 0.0, t)
        assert (k.step_size, k.bc2_sqrt) == _adam_constants_exactly(3e-4, b1, b2, t), t


def test_far_steps_never_compute_the_exact_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """At step 10**6 the exact b**t has ~24 million bits (Adam's constants took 0.2 s at step
    10**5 that way): the enclosure decides, the exact path is never taken; it still is where
    the corners disagree."""
    from fractions import Fraction

    from verde_chain.repops.library import exact

    def refuse(powers):  # type: ignore[no-untyped-def]
        raise AssertionError(f"exact powers computed: {powers}")

    with monkeypatch.context() as m:
        m.setattr(exact, "exact_powers", refuse)
        k = library.adam_constants(3e-4, 0.9, 0.999, 0.0, 10**6)
        assert (k.step_size, k.bc2_sqrt) == (library.f32_of_fraction(exact.f32q(3e-4)), 1.0)
        library.onnx_adam((2,), 0.1, 10**6, 0.9, 0.999, 1e-8, 0.0, 0.0)
        with pytest.raises(AssertionError, match="exact powers computed"):  # an fn that does not round
            exact.rounded_at_powers(lambda p: p, [(Fraction(999, 1024), 1000)])
    b = Fraction(999, 1024)
    assert exact.rounded_at_powers(lambda p: p, [(b, 1000)]) == b**1000  # the corners disagree: exact
    for t in (1, 2, 1000, 10**6):
        lo, hi = exact.power_enclosure(b, t)
        assert lo <= b**t <= hi and hi - lo < Fraction(1, 2**240)
    with pytest.raises(RepOpsError, match="binary32 value in"):
        exact.power_enclosure(Fraction(1, 3), 5)


# ---------------------------------------------------------------------------------- rng


def test_philox_known_answers() -> None:
    # Random123 known-answer vectors for philox4x32_10
    def run(ctr: list[int], key: tuple[int, int]) -> list[int]:
        return [int(w) for w in rng.philox4x32_10([np.uint32(c) for c in ctr], key)]

    assert run([0, 0, 0, 0], (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert run([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF)) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert run([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0)) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1,
    ]


def test_uniform_counter_based() -> None:
    u = rng.uniform(7, 3, (1000,))
    assert u.dtype == F32 and (u >= 0).all() and (u < 1).all()
    assert 0.45 < u.mean() < 0.55
    # any slice is reproducible alone from its offset; streams and seeds differ
    assert (rng.uniform(7, 3, (10,), offset=500) == u[500:510]).all()
    assert not (rng.uniform(7, 4, (1000,)) == u).all()
    assert not (rng.uniform(8, 3, (1000,)) == u).all()
    # exactly 24-bit grid
    assert ((u * F32(2**24)) == np.floor(u * F32(2**24))).all()


def test_normal_and_dropout() -> None:
    z = rng.normal(11, 0, (4000,))
    assert z.dtype == F32 and np.isfinite(z).all()
    assert abs(float(z.mean())) < 0.06 and 0.94 < float(z.std()) < 1.06
    assert (rng.normal(11, 0, (5,), offset=100) == z[100:105]).all()
    x = rng.normal(11, 0, (2, 3), mean=1.0, std=0.02)
    assert (x == (z[:6].reshape(2, 3) * F32(0.02) + F32(1.0))).all()
    keep = rng.dropout_keep(5, 1, (10000,), 0.25)
    assert set(np.unique(keep)) <= {0.0, 1.0} and 0.72 < keep.mean() < 0.78
    assert (rng.dropout_keep(5, 1, (10000,), 0.0) == 1).all()


def test_loadidx_index_must_be_int32_everywhere() -> None:
    """Huge integral indices are invalid (NaN) in every executor, as the on-chain prover decides."""
    from verde_chain.repops.backends.cpu import backend as cpu_backend
    from verde_chain.vm import scalarvm as vm

    desc = library.gather((4, 2), (5,))
    data = np.arange(8, dtype=np.float32)
    idx = np.array([2.0**31, -(2.0**31) - 256, 1e30, 2.0**62, 3.0], dtype=np.float32)
    want = np.array([np.nan] * 8 + [6.0, 7.0], dtype=np.float32).reshape(5, 2)
    for name, out in (
        ("spec", program.run_spec(desc, [data, idx])),
        ("reference", reference.run(desc, [data, idx])),
        ("cpu", cpu_backend.backend(desc, [data, idx])),
    ):
        if out is None:  # the C++ kernels could not be built here
            continue
        np.testing.assert_array_equal(np.asarray(out).reshape(5, 2), want, err_msg=name)
    for e in range(10):
        assert vm.run_states(desc, [data, idx], e)[-1].regs[0] == int(want.reshape(-1).view(np.uint32)[e])


# ----------------------------------------------------------------------------- window extension
def _pad_desc(fill: int = 0, div: int = 1) -> KernelDesc:
    """out[i] = x[(i - 1) / div] over a 3-element x (out of range / inexact -> fill), then + y[i]."""
    xm = InputMap(3, (0,), windows=(program.Window(0, 1, 0, 0, -1, div, 3, 1),), fill=fill)
    ym = InputMap(6, (1,))
    pro = (Instr(Op.LOAD, 1, imm=0), Instr(Op.LOAD, 2, imm=1), Instr(Op.ADD, 0, 1, 2))
    return KernelDesc((6,), 1, (xm, ym), pro)


def test_window_reads_fill_outside_and_only_exact_divisions() -> None:
    x, y = np.array([1, 2, 3], F32), np.zeros(6, F32)
    for run in (program.run_spec, reference.run):
        assert run(_pad_desc(), [x, y]).tolist() == [0, 1, 2, 3, 0, 0]
        assert run(_pad_desc(fill=f32_bits(-7.0)), [x, y]).tolist() == [-7, 1, 2, 3, -7, -7]
        # v = i - 1 must be even: i = 1 -> x[0], i = 3 -> x[1], i = 5 -> x[2]
        assert run(_pad_desc(div=2), [x, y]).tolist() == [0, 1, 0, 2, 0, 3]
    tr = trace(_pad_desc(fill=f32_bits(-7.0)), [x, y], 0)
    assert tr[0].access == program.MemAccess(0, None, f32_bits(-7.0))


def test_window_encoding_is_the_packed_form_and_plain_stays_abi() -> None:
    plain = library.matmul((2, 3), (3, 4))
    assert int.from_bytes(plain.encode()[:32], "big") == program.HEAD_PLAIN == 0xC0
    d = _pad_desc(fill=5, div=2)
    data = d.encode()
    assert data[0] == program.PACKED_TAG == 0xE0
    assert KernelDesc.decode(data) == d
    # the documented layout, field by field
    rank_shape_k = bytes([0xE0, 1]) + (6).to_bytes(4, "big") + (1).to_bytes(4, "big")
    assert data.startswith(rank_shape_k + bytes([0, 2]))  # no kdims, two inputs
    x_map = ((3).to_bytes(8, "big") + (0).to_bytes(8, "big", signed=True) + bytes(8 * 3) + (5).to_bytes(4, "big")
             + bytes([1]) + bytes([0]) + (1).to_bytes(8, "big") + bytes([0]) + bytes(8)
             + (-1).to_bytes(8, "big", signed=True) + (2).to_bytes(4, "big") + (3).to_bytes(8, "big")
             + (1).to_bytes(8, "big"))
    assert data[len(rank_shape_k) + 2:].startswith(x_map)
    assert data.endswith((3).to_bytes(4, "big") + isa_words(d.prologue) + bytes(8))  # P = 3, then B = E = 0
    for bad in (data[:-1], data + b"\0", b"\xe1" + data[1:]):
        with pytest.raises((DescriptorError, ValueError)):
            KernelDesc.decode(bad)
    # every window field is committed
    w = d.inputs[0].windows[0]
    import dataclasses

    variants = [dataclasses.replace(w, **{f: v}) for f, v in
                (("out_mul", 2), ("offset", 0), ("div", 3), ("size", 2), ("stride", 0))]
    hashes = {d.hash()} | {
        dataclasses.replace(d, inputs=(dataclasses.replace(d.inputs[0], windows=(v,)), d.inputs[1])).hash()
        for v in variants
    }
    assert len(hashes) == 1 + len(variants)
    # one digit is k itself: kdims=(K,) is the plain descriptor
    assert library.matmul((2, 3), (3, 4)) == dataclasses.replace(plain, kdims=(3,))


def isa_words(prog: tuple[Instr, ...]) -> bytes:
    return b"".join(i.encode() for i in prog)


def test_kdigits_and_conv_descriptor_round_trip() -> None:
    from verde_chain.repops.library import conv as cv

    g = cv.ConvGeometry.make((2, 4, 5, 4), (3, 2), (2, 1), (1, 2), (1, 2, 2, 0))
    for d in (cv.convolution(g, (6, 2, 3, 2), 2, True), cv.conv_grad_input(g, (6, 2, 3, 2), 2),
              cv.conv_grad_weight(g, (6, 2, 3, 2), 2)):
        assert d.extended and KernelDesc.decode(d.encode()) == d
        assert [d.kdigits(k) for k in range(d.K)] == [tuple(t) for t in np.ndindex(*d.kdims)]


def test_window_validation() -> None:
    d = _pad_desc()
    import dataclasses

    bad_windows = [
        program.Window(1, 1, 0, 0, 0, 1, 3, 1),  # axis past the rank
        program.Window(0, 0, 1, 1, 0, 1, 3, 1),  # digit past the digits
        program.Window(0, 1, 0, 0, 0, 0, 3, 1),  # div 0
        program.Window(0, 1, 0, 0, 0, 1, 9, 1),  # size lets the load leave the tensor
        program.Window(3, 0, 0, 0, 0, 1, 3, 1),  # unused axis must be 0 (one encoding)
    ]
    for w in bad_windows:
        with pytest.raises(DescriptorError):
            dataclasses.replace(d, inputs=(dataclasses.replace(d.inputs[0], windows=(w,)), d.inputs[1]))
    with pytest.raises(DescriptorError, match="fill"):
        dataclasses.replace(d, inputs=(d.inputs[0], dataclasses.replace(d.inputs[1], fill=1)))
    with pytest.raises(DescriptorError, match="kdims"):
        dataclasses.replace(library.matmul((2, 6), (6, 1)), kdims=(4, 2))


def test_loadidx_checks_windows_before_its_index() -> None:
    xm = InputMap(3, (0,), idx_stride=1, windows=(program.Window(0, 1, 0, 0, -1, 1, 1, 0),), fill=f32_bits(2.5))
    pro = (Instr(Op.CONST, 1, imm=f32_bits(float("nan"))), Instr(Op.LOADIDX, 0, 1, 0, 0))
    d = KernelDesc((3,), 1, (xm,), pro)
    x = np.array([4, 5, 6], F32)
    got = program.run_spec(d, [x]).view(np.uint32).tolist()
    assert got == [f32_bits(2.5), CANONICAL_NAN, f32_bits(2.5)]
    assert reference.run(d, [x]).view(np.uint32).tolist() == got

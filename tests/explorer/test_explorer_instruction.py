"""The explorer's decoding of a dispute's last move, against the spec interpreter (no chain).

``explain_step`` replays ``step(desc, preState, proof)`` through the ScalarVM twin; here every
micro-step of a few kernels is decoded from the bytes a bot would send and compared with
``program.trace``, the slow scalar interpreter that defines RepOps (a separate implementation).
"""

from __future__ import annotations

import numpy as np
import pytest

from verde_chain.explorer.instruction import explain_step, f32
from verde_chain.repops import library, program
from verde_chain.repops.isa import REG_READS, Op
from verde_chain.vm import scalarvm as vm


@pytest.mark.parametrize("bits,text", [
    (0x3F800000, "1.0"), (0x80000000, "-0.0"), (0x00000001, "1e-45"), (0x7F800000, "inf"),
    (0x7FC00000, "nan"), (0x3DCCCCCD, "0.1"), (0x7F7FFFFF, "3.4028235e+38"),
])
def test_f32_three_ways(bits: int, text: str) -> None:
    v = f32(bits)
    assert v["float"] == text and v["bits"] == f"0x{bits:08x}"
    assert v["binary"].replace(" ", "") == f"{bits:032b}" and [len(p) for p in v["binary"].split()] == [1, 8, 23]


def _cases() -> list[tuple[program.KernelDesc, list[np.ndarray]]]:
    rng = np.random.default_rng(3)
    idx = np.array([2, -1, 7, 0.5], np.float32)  # in range, negative (ONNX wrap), out of range, non-integral
    return [
        (library.matmul((3, 5), (5, 2)), [rng.standard_normal(15).astype(np.float32),
                                       rng.standard_normal(10).astype(np.float32)]),
        (library.gather((6, 3), (4,)), [rng.standard_normal(18).astype(np.float32), idx]),
        (library.scatter_add(5, (3,), 4), [rng.standard_normal(15).astype(np.float32),
                                        np.array([1, 3, 1, 0, 2], np.float32)]),
        (library.map_unary("sqrt", (4,)), [np.array([4.0, -1.0, 0.0, 2.0], np.float32)]),
        (library.max_pool(library.ConvGeometry.make((1, 1, 3, 3), (2, 2), pads=(1, 1, 0, 0))),
         [rng.standard_normal(9).astype(np.float32)]),  # padded taps read the fill -inf
    ]


def test_every_micro_step_decodes_as_the_spec_interpreter_runs_it() -> None:
    seen: set[str] = set()
    for desc, ins in _cases():
        for e in range(desc.numel):
            states = vm.run_states(desc, ins, e)
            for ref in program.trace(desc, ins, e):
                proof = vm.prove_step(desc, ins, states[ref.j]).proof
                got = explain_step(desc.encode(), states[ref.j].encode(), proof)
                seen.add(got["op"])
                assert (got["op"], got["micro_step"], got["k"], got["element"]) == (ref.instr.op.name, ref.j, ref.k, e)
                assert got["micro_steps"] == desc.num_steps and got["coords"] == list(desc.coords(e))
                assert [o["register"] for o in got["operands"]] == [getattr(ref.instr, r)
                                                                    for r in REG_READS[ref.instr.op]]
                for o in got["operands"]:
                    assert o["bits"] == f"0x{ref.pre.regs[o['register']]:08x}"
                assert got["result"]["register"] == ref.instr.dst
                assert got["result"]["bits"] == f"0x{ref.post.regs[ref.instr.dst]:08x}"
                assert got["post_state"] == "0x" + states[ref.j + 1].hash().hex()
                if ref.access is not None:
                    m = got["memory"]
                    assert (m["input"], m["address"]) == (ref.access.input, ref.access.address)
                    assert m.get("bits", f"0x{ref.access.value:08x}") == f"0x{ref.access.value:08x}"
                else:
                    assert got["memory"] is None
    assert {"FMA", "LOAD", "LOADIDX", "COORD", "CONST", "SELECT", "EQ", "SQRT"} <= seen


def test_assembly_names_the_read() -> None:
    desc, ins = _cases()[1]  # gather: element 2 reads index 7, out of range
    states = vm.run_states(desc, ins, 2 * 3)
    j = next(r.j for r in program.trace(desc, ins, 6) if r.instr.op == Op.LOADIDX)
    got = explain_step(desc.encode(), states[j].encode(), vm.prove_step(desc, ins, states[j]).proof)
    assert got["memory"]["address"] is None and got["result"]["float"] == "nan"
    assert "nothing (index out of range)" in got["assembly"]


def test_assembly_names_a_window_fill() -> None:
    desc, ins = _cases()[4]
    states = vm.run_states(desc, ins, 0)  # output (0, 0): its first taps lie in the padding
    got = explain_step(desc.encode(), states[0].encode(), vm.prove_step(desc, ins, states[0]).proof)
    assert got["memory"]["address"] is None and got["result"]["float"] == "-inf"
    assert "nothing (window out of range: fill 0xff800000)" in got["assembly"]

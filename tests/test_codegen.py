"""One source per protocol number, and a row for every opcode in every executor.

* The generated C/C++/CUDA header and Solidity files (scripts/codegen.py) are what their Python
  sources give now: regenerated into a temporary folder and compared byte for byte.
* Every ``Op`` has an entry in every executor's table (tinygrad-style: a missing op fails
  loudly): the Python tables, the generated numbers, the C++ and CUDA interpreters' switches,
  ScalarVM's dispatch; and the C++/CUDA builds turn a missing ``case`` into a compile error
  (-Werror=switch), which a mutated copy of each interpreter proves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.cxx import syntax_check, torch_includes
from verde_chain.graph.structure import SourceKind
from verde_chain.repops import fp32, isa, program
from verde_chain.repops.backends.cpu import jit
from verde_chain.repops.backends.cpu.codes import BinOp, ReduceOp
from verde_chain.repops.isa import Op
from verde_chain.vm import softfloat

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "kernels"
MEMORY_OPS = {Op.CONST, Op.LOAD, Op.COORD, Op.LOADIDX}  # executed by the interpreters, not fp32


@pytest.fixture(scope="module")
def codegen(script: Callable[[str], ModuleType]) -> ModuleType:
    return script("codegen")


def test_generated_files_are_current(codegen: ModuleType, tmp_path: Path) -> None:
    written = codegen.write(tmp_path)
    assert set(written) == set(codegen.OUTPUTS) and len(written) == 3
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), (
            f"{rel} is stale: run .venv/bin/python scripts/codegen.py"
        )
    assert codegen.stale() == []
    assert codegen.main(["--check"]) == 0


def test_a_stale_file_is_named(codegen: ModuleType, tmp_path: Path) -> None:
    codegen.write(tmp_path)
    assert codegen.stale(tmp_path) == []
    header = tmp_path / codegen.C_HEADER
    header.write_text(header.read_text().replace("RP_FLOOR = 22", "RP_FLOOR = 23"))
    (tmp_path / codegen.SOL_SOURCE_KIND).unlink()
    assert codegen.stale(tmp_path) == [codegen.C_HEADER, codegen.SOL_SOURCE_KIND]


def test_generated_numbers_are_the_python_ones() -> None:
    header = (KERNELS / "generated" / "repops_isa.h").read_text()
    for op in Op:
        assert f"RP_{op.name} = {int(op)}," in header
        flags = [f"RP_READS_{f.upper()}" for f in isa.REG_READS[op]] + (["RP_IMM"] if op in isa.IMM_OPS else [])
        assert f"case RP_{op.name}: return {' | '.join(flags) or '0u'};" in header
    assert f"RP_OP_COUNT = {len(Op)}" in header
    assert f"#define RP_NUM_REGS {isa.NUM_REGS}\n" in header and f"0x{isa.CANONICAL_NAN:08X}u" in header
    assert f"#define RP_MAX_RANK {program.MAX_RANK} " in header and f"#define RP_MAX_DIM {program.MAX_DIM} " in header
    for prefix, enum in (("RP_SOURCE_", SourceKind), ("RP_REDUCE_", ReduceOp), ("RP_BIN_", BinOp)):
        for m in enum:
            assert f"{prefix}{m.name} = {int(m)}," in header
    sol = (REPO / "contracts" / "vm" / "Instructions.sol").read_text()
    for op in Op:
        assert re.search(rf"uint8 internal constant {op.name} = {int(op)};", sol), op
    kinds = (REPO / "contracts" / "dispute" / "SourceKind.sol").read_text()
    body = kinds.split("enum SourceKind {", 1)[1].split("}", 1)[0]
    assert [w.strip(" ,") for w in body.split("\n") if w.strip()] == ["NodeOutput", "PrevStepNodeOutput", "Batch"]


def test_no_opcode_number_is_copied_by_hand() -> None:
    """The hand-copied tables are gone: the interpreters and ScalarVM read the generated ones."""
    for path in (KERNELS / "repops_program.cuh", KERNELS / "cpu" / "interpreter.cpp", REPO / "contracts" / "vm" / "ScalarVM.sol"):
        text = path.read_text()
        assert not re.search(r"\b(?:RP_|OP_)?FLOOR\s*=\s*22\b", text), path
        assert not re.search(r"constant\s+\w+\s*=\s*18\s*;", text), path


def test_every_op_has_a_row_in_every_table() -> None:
    every = set(Op)
    assert set(isa.REG_READS) == every
    assert set(fp32.ARITHMETIC_OPS) | MEMORY_OPS == every and not fp32.ARITHMETIC_OPS & MEMORY_OPS
    assert set(softfloat.ISA_ARITHMETIC_OPS) | {int(o) for o in MEMORY_OPS} == {int(o) for o in every}
    assert set(jit._JIT_OPS) == every
    for path in (KERNELS / "repops_program.cuh", KERNELS / "cpu" / "interpreter.cpp"):
        cases = set(re.findall(r"case RP_([A-Z]+):", path.read_text()))
        assert cases >= {op.name for op in Op}, (path, {op.name for op in Op} - cases)
    scalar_vm = (REPO / "contracts" / "vm" / "ScalarVM.sol").read_text()
    for op in Op:
        assert f"op == Instructions.{op.name})" in scalar_vm or f"op == Instructions.{op.name} " in scalar_vm, op


def _mutant(tmp_path: Path, rel: str, line: str) -> Path:
    """A copy of kernels/ with ``line`` deleted from ``rel`` (which must contain it once)."""
    root = tmp_path / "kernels"
    shutil.copytree(KERNELS, root)
    path = root / rel
    text = path.read_text()
    assert text.count(line) == 1, line
    path.write_text(text.replace(line, ""))
    return root


def _syntax_check(source: Path, kernels: Path, system: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """g++ -fsyntax-only -Werror=switch on ``source``, ``kernels`` on the include path (torch's
    headers, if needed, as system headers)."""
    return syntax_check(source, ["-std=c++17", "-Werror=switch"], [kernels], system)


def test_an_opcode_without_a_case_fails_the_cuda_interpreter_build(tmp_path: Path) -> None:
    """repops_program.cuh's switch has no default: a lost case is a build error (host builds use
    -Werror=switch; nvcc passes it to the host pass of the .cu)."""
    main = tmp_path / "main.cpp"
    main.write_text('#include "repops_program.cuh"\nint main() { return 0; }\n')
    assert _syntax_check(main, KERNELS).returncode == 0
    root = _mutant(tmp_path, "repops_program.cuh", "        case RP_FLOOR: v = rp_floor(a); break;\n")
    r = _syntax_check(main, root)
    assert r.returncode != 0 and "RP_FLOOR" in r.stderr and "not handled in switch" in r.stderr, r.stderr[-2000:]


def test_an_opcode_without_a_case_fails_the_cpu_extension_build(tmp_path: Path) -> None:
    """The CPU interpreter's switch, compiled with the extension's -Werror=switch."""
    torch_inc = torch_includes()
    src = "cpu/interpreter.cpp"
    assert _syntax_check(KERNELS / src, KERNELS, torch_inc).returncode == 0
    root = _mutant(tmp_path, src, "        case RP_GETMANT: RP_LANES1(rp_getmant); break;\n")
    r = _syntax_check(root / src, root, torch_inc)
    assert r.returncode != 0 and "RP_GETMANT" in r.stderr and "not handled in switch" in r.stderr, r.stderr[-2000:]

"""The Berkeley TestFloat binary32 vectors (`shared/testvectors/f32`, beside the repo): where they
live and how to read them (test support; the benchmark of SoftFloat32's gas reads them too).

The folder is $VERDE_TESTFLOAT_DIR if set, else ../shared/testvectors/f32 next to the checkout
(CI lays shared/ beside its clone of the repository). Where the vectors are absent, the tests that
need them skip, naming the path they looked at.

A file ``<name>.txt`` (``f32_add``, ``f32_mulAdd``, ``i32_to_f32``, ...) has one case per line:
the operands, the expected result and the exception flags, all in hex, separated by spaces::

    8683F7FF C07F3FFF C07F3FFF 01      (f32_add: a b result flags)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from verde_chain.errors import VerdeError
from verde_chain.repops.isa import CANONICAL_NAN

REPO = Path(__file__).resolve().parents[2]

# Files whose expected result is an integer (0/1 for comparisons, int32 bits for the conversion to
# int); every other file's result is a binary32 pattern.
INTEGER_RESULT = frozenset({"f32_eq", "f32_lt", "f32_to_i32_rminMag"})


class TestFloatMissing(VerdeError):
    """A TestFloat vector file is not where the vectors are looked up."""

    __test__ = False  # not a test class, whatever pytest's name pattern says

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"TestFloat vectors not found at {path} (set VERDE_TESTFLOAT_DIR)")


def vector_dir() -> Path:
    env = os.environ.get("VERDE_TESTFLOAT_DIR")
    return Path(env) if env else REPO.parent / "shared" / "testvectors" / "f32"


def load_vectors(name: str, missing: Callable[[str], NoReturn] | None = None) -> list[list[int]]:
    """Every case of ``<name>.txt`` as a list of ints (operands, result, flags), in file order.

    A missing file raises :class:`TestFloatMissing`, or, when ``missing`` is given, calls it with
    the reason instead (tests pass ``pytest.skip``, so they skip with that reason).
    """
    path = vector_dir() / f"{name}.txt"
    if not path.exists():
        err = TestFloatMissing(path)
        if missing is not None:
            missing(str(err))
        raise err
    return [[int(f, 16) for f in line.split()] for line in path.read_text().splitlines() if line.strip()]


def result_matches(name: str, got: int, expected: int) -> bool:
    """Whether ``got`` is right for a case of ``<name>.txt``: bit for bit, except that a NaN float
    result must be exactly the canonical NaN (TestFloat's default NaN is FFC00000)."""
    if name not in INTEGER_RESULT and (expected & 0x7FFFFFFF) > 0x7F800000:
        return got == CANONICAL_NAN
    return got == expected

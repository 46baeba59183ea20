"""Operation codes of the C++ CPU kernels' folds and binaries (``reduce_last``, ``binary`` and the
step plan's fold and binary nodes).

One enum each, written into ``kernels/generated/repops_isa.h`` by ``scripts/codegen.py``
(``RP_REDUCE_*``, ``RP_BIN_*``), so Python and C++ cannot disagree on a number. They are not part
of the protocol (nothing on chain sees them); the spec's programs are what these kernels must
reproduce.
"""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """A fold over k ascending: ``acc = x[0]; acc = acc (op) x[k]``; MEAN divides the sum by fl32(K)."""

    SUM = 0
    MAX = 1
    MEAN = 2
    MIN = 3


class BinOp(enum.IntEnum):
    """An elementwise binary instruction on equal-shaped operands (the spec's ADD .. MIN)."""

    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5

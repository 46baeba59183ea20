"""Where the Berkeley TestFloat binary32 vectors live (`shared/testvectors/f32`, beside the repo).

Looked up in order: $VERDE_TESTFLOAT_DIR, ../shared/testvectors/f32 next to the checkout (CI lays
shared/ beside its clone), /work/shared/testvectors/f32 (the development machines).
"""

from __future__ import annotations

import os
from pathlib import Path

from verde_chain.chain.paths import REPO


def vector_dir() -> Path:
    env = os.environ.get("VERDE_TESTFLOAT_DIR")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "testvectors" / "f32", Path("/work/shared/testvectors/f32")]
    for c in candidates:
        if (c / "f32_add.txt").exists():
            return c
    return candidates[0]

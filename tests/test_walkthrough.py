"""docs/own-model.md, run as written: its fenced ``sh`` and ``python`` blocks, in order, in one
bash session in an empty directory (a python block is fed to ``python`` as a here-document),
with the repository's virtual environment first on the PATH as the walkthrough asks.

One change is made to the text: the port 8545 becomes a free one, so the walkthrough can run
beside other tests (and a developer's own chain). Everything the bots and the market do is real:
a local Anvil, the deployed contracts, four bot processes, real time."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verde_chain.ports import free_port

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "own-model.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def walkthrough_script(text: str, port: int) -> str:
    """The doc's runnable blocks as one bash script (other fences, e.g. ``text``, are not commands)."""
    parts = []
    for lang, body in FENCE.findall(text):
        if lang == "sh":
            parts.append(body)
        elif lang == "python":
            parts.append(f"python - <<'PYTHON'\n{body}PYTHON\n")
    assert parts, "no runnable blocks in the walkthrough"
    return "set -e\n" + "\n".join(parts).replace("8545", str(port))


def test_the_script_is_every_block_in_order() -> None:
    script = walkthrough_script(DOC.read_text(), 1234)
    order = ["job_from_torch(", "verde-chain job create", "verde-chain train my-job", "verde-chain node --port 1234", "verde-chain deploy",
             "verde-chain trainer run", "verde-chain client --account 1 --bundle my-job", "verde-chain job results 1",
             "np.load(\"trained.npz\")", "kill $(jobs -p)"]
    at = [script.index(s) for s in order]
    assert at == sorted(at) and "8545" not in script


@pytest.mark.chain
@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    script = walkthrough_script(DOC.read_text(), free_port())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("VERDE_RPC_URL", None)
    # output to a file, not a pipe: a background process that outlived a failed script would hold
    # a pipe open for ever
    with open(tmp_path / "walkthrough.out", "w") as sink:
        proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=900)
        finally:  # the doc stops its background processes itself; this only cleans up after a failure
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait()
    out = (tmp_path / "walkthrough.out").read_text()
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, out[-4000:] + logs
    assert "Traceback" not in out + logs, out[-4000:] + logs
    # the two ways of making the job make the same job
    spec = re.search(r"spec hash (0x[0-9a-f]{64})", out)
    assert spec and f"spec_hash  {spec[1]}" in out, out[-4000:]
    # paid: both trainers settled on the accepted result, which the client read back checked
    accepted = re.search(r"accepted C_T (0x[0-9a-f]{64})", out)
    assert accepted, out[-4000:]
    assert f"final_commitment: {accepted[1]}" in out  # the local run said what the market would accept
    assert "finalized; my slot ended SETTLED" in (tmp_path / "trainer-2.log").read_text()
    assert "finalized; my slot ended SETTLED" in (tmp_path / "trainer-3.log").read_text()
    with np.load(tmp_path / "trained.npz") as z:
        assert sorted(z.files) == ["0.bias", "0.weight", "3.bias", "3.weight"]
        assert z["0.weight"].shape == (16, 8) and z["3.weight"].shape == (3, 16)

"""The benchmark scripts' arguments. scripts/bench_gemm.py --baseline: another build of the kernels
timed beside this one in the same process, refused with one line when the path is not a build,
and never compared when its bits differ from this build's; --stored-b shapes timed with B as
stored. scripts/bench_conv.py: a count out of range is one line, never a traceback; each side's
page faults are counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verde_chain.repops.backends.cpu import extension as cpu_ext

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SCRIPT = SCRIPTS / "bench_gemm.py"
TINY = ["--sizes", "16", "--threads", "1", "--repeat", "1", "--burst", "1"]


def bench(*args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], check=False, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("path", ["README.md", "build/native", "no/such/build"])
def test_a_baseline_that_is_not_a_build_is_one_line(path: str) -> None:
    out = bench(*TINY, "--baseline", path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "want a RepOps CPU build" in out.stderr.strip().splitlines()[-1]


def test_a_build_folder_whose_library_does_not_load_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "verde_repops_cpu_avx512_000000000000"
    folder.mkdir()
    (folder / f"{folder.name}.so").write_bytes(b"not a shared library")
    out = bench(*TINY, "--baseline", str(folder))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "does not load as a RepOps CPU build" in out.stderr.strip().splitlines()[-1]


def test_a_baseline_build_is_timed_beside_this_one() -> None:
    build = cpu_ext.build_dir(cpu_ext.best_isa())
    cpu_ext.extension(cpu_ext.best_isa())
    out = bench(*TINY, "--baseline", str(build))
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])["gemm"][0]
    lo, hi = row["vs_baseline_quartiles"]
    assert 0 < lo <= row["vs_baseline"] <= hi


def test_stored_b_shapes_are_timed_with_b_as_stored() -> None:
    """--stored-b MxKxN: a (M, K) @ B (K, N) with B's rows contiguous, labelled as such."""
    out = bench("--sizes", "--stored-b", "10x64x96", "--threads", "1", "--repeat", "1", "--burst", "1")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])["gemm"][0]
    assert row["n"] == "10x64x96 B stored" and row["repops_ms"] > 0


def test_a_transposed_shapes_are_timed_with_a_stored_as_k_by_m() -> None:
    """--a-transposed MxKxN: A^T @ B with A stored (K, M) (a weight gradient), labelled as such."""
    out = bench("--sizes", "--a-transposed", "96x64x10", "--threads", "1", "--repeat", "1", "--burst", "1")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])["gemm"][0]
    assert row["n"] == "96x64x10 A transposed" and row["repops_ms"] > 0


def test_a_baseline_whose_bits_differ_is_not_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_gemm
    finally:
        sys.path.remove(str(SCRIPT.parent))
    this = cpu_ext.extension(cpu_ext.best_isa())

    class OffByOneBit:  # a build whose kernel differs from this one's in one bit of C
        @staticmethod
        def matmul3(*args: object) -> torch.Tensor:
            c = this.matmul3(*args)
            c.view(torch.int32)[0, 0, 0] ^= 1
            return c

    monkeypatch.setattr(bench_gemm, "baseline_build", lambda text: OffByOneBit())
    monkeypatch.setattr(sys, "argv", ["bench_gemm.py", *TINY, "--baseline", "any"])
    with pytest.raises(SystemExit, match="the baseline build's bits differ"):
        bench_gemm.main()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--threads", "0"], "argument --threads: want a whole number of threads >= 1"),
        (["--repeat", "0"], "argument --repeat: want a whole number >= 1"),
        (["--batch", "-2"], "argument --batch: want a whole number >= 1"),
        (["--shape", "0", "64", "32", "32", "64", "3", "3", "1", "1"], "take counts of at least 1"),
        (["--shape", "1", "1", "4", "4", "1", "3", "3", "-1", "1"], "PAD at least 0"),
        (["--shape", "1", "1", "2", "2", "1", "5", "5", "1", "1"], "the padded input must hold the kernel"),
    ],
)
def test_bench_conv_refuses_a_count_out_of_range_in_one_line(args: list[str], says: str) -> None:
    out = bench(*args, script=SCRIPTS / "bench_conv.py")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert says in out.stderr.strip().splitlines()[-1]


def test_bench_adam_constants_times_both_ways_with_the_same_bits() -> None:
    """Both ways of computing the constants (powers enclosed past EXACT_POWER_MAX_T, and every
    power exact) are timed and give the same bits; a step out of range is one line."""
    out = bench("--steps", "1", "5000", "--repeat", "1", script=SCRIPTS / "bench_adam_constants.py")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.strip().splitlines()[-1])["adam_constants"]
    assert [r["step"] for r in rows] == [1, 5000] and all(r["same_bits"] for r in rows)
    out = bench("--steps", "0", script=SCRIPTS / "bench_adam_constants.py")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--steps are 1-based" in out.stderr.strip().splitlines()[-1]


def test_bench_threads_refuses_floating_ab_at_one_thread_in_one_line() -> None:
    """At one thread no node floats: comparing floating against levels there would print noise."""
    out = bench("--floating-ab", "--threads", "1", "--configs", "digits_cnn", script=SCRIPTS / "bench_threads.py")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "must be at least 2" in out.stderr.strip().splitlines()[-1]


def test_bench_conv_counts_each_side_s_page_faults_and_can_keep_the_heap() -> None:
    """The conv table gives each side's minor page faults a call beside its time, and
    --keep-heap (glibc keeps freed memory) runs the same comparison."""
    for extra in ([], ["--keep-heap"]):
        out = bench("--shape", "2", "4", "8", "8", "4", "3", "3", "1", "1", "--threads", "1", "--repeat", "1", *extra,
                    script=SCRIPTS / "bench_conv.py")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
        assert [r["kind"] for r in rows] == ["forward", "grad_input", "grad_weight"]
        assert all(isinstance(r[k], int) and r[k] >= 0 for r in rows for k in ("torch_faults", "repops_faults",
                                                                                 "kernel_faults"))
        assert "page faults a call: torch" in out.stdout

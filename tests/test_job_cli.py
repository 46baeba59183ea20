"""`verde-chain job create`: a bundle from a user's ONNX file and .npz data, the same job as
`make_job` builds in Python; every mistake refused on one line, before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from tests.support.cli import assert_refused, run_cli
from verde_chain.graph.data import Dataset
from verde_chain.graph.onnx_import import export_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import inference_outputs, load_job, make_job


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("user")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    (d / "m.onnx").write_bytes(export_torch(m, torch.zeros(8, 4), ["x"], training=True))
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((40, 4)).astype(np.float32), rng.integers(0, 3, 40)
    np.savez(d / "d.npz", X=X, Y=Y)
    for name, bad in (("minus1", -1), ("three", 3)):
        y = Y.copy()
        y[9] = bad
        np.savez(d / f"{name}.npz", X=X, Y=y)
    x = X.copy()
    x[3, 2] = np.nan
    np.savez(d / "nan.npz", X=x, Y=Y)
    np.savez(d / "noy.npz", X=X)
    nodes = [helper.make_node("Hardmax", ["x"], ["h"], name="hm"), helper.make_node("Det", ["h"], ["y"], name="det")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    (d / "bad.onnx").write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return d


def test_job_create_writes_the_bundle_make_job_builds(files: Path, tmp_path: Path) -> None:
    r = run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "d.npz"), "--steps", "6",
                "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01", "--seed", "3", "--out",
                str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert f"verde-chain client --bundle {tmp_path / 'b'}" in r.stdout
    job = load_job(tmp_path / "b")
    with np.load(files / "d.npz") as z:
        data = Dataset(z["X"], z["Y"].astype(np.float32))  # int64 labels were converted exactly
    want = make_job("m", (files / "m.onnx").read_bytes(), data, LossSpec(),
                    OptimizerSpec("adamw", lr=0.01, weight_decay=0.01), 6, 8, 3, 6)
    assert job.spec == want.spec


def test_inference_job_create_needs_no_labels(files: Path, tmp_path: Path) -> None:
    r = run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "noy.npz"), "--steps", "5",
                "--kind", "inference", "--out", str(tmp_path / "b"), "--json")
    assert r.returncode == 0, r.stderr
    job = load_job(tmp_path / "b")
    assert job.spec.kind == "inference" and job.spec.steps == 5
    run = job.make_run()
    run.run()
    state = {s.name: run.state.tensors[s.producer] for s in job.program.graph.states}
    assert inference_outputs(job, state)["output"].shape == (40, 3)  # 5 batches of 8: every sample once


@pytest.mark.parametrize(("data", "needles"), [
    ("minus1", ("label Y[9] = -1", "[0, 3)")),
    ("three", ("label Y[9] = 3", "[0, 3)")),
    ("nan", ("X holds nan", "sample 3")),
    ("noy", ("no array 'Y'", "np.savez")),
    ("missing", ("no data file",)),
])
def test_bad_data_is_refused_on_one_line(files: Path, tmp_path: Path, data: str, needles: tuple[str, ...]) -> None:
    r = run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / f"{data}.npz"), "--steps", "2",
                "--out", str(tmp_path / "b"))
    assert_refused(r, *needles)
    assert not (tmp_path / "b").exists()  # nothing was written


def test_every_unsupported_op_is_named_on_one_line(files: Path, tmp_path: Path) -> None:
    r = run_cli("job", "create", "--model", str(files / "bad.onnx"), "--data", str(files / "d.npz"), "--steps", "2",
                "--out", str(tmp_path / "b"))
    assert_refused(r, "2 unsupported nodes", "Hardmax node 'hm'", "Det node 'det'")


def test_invalid_job_json_is_refused_on_one_line(files: Path, tmp_path: Path) -> None:
    assert run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "d.npz"), "--steps", "2",
                   "--out", str(tmp_path / "b")).returncode == 0
    (tmp_path / "b" / "job.json").write_text("{ not json")
    assert_refused(run_cli("train", str(tmp_path / "b")), "not valid JSON", "job create")


def test_job_create_shards_reads_s_micro_batches_of_the_models_batch(files: Path, tmp_path: Path) -> None:
    r = run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "d.npz"), "--steps", "3",
                "--shards", "2", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    job = load_job(tmp_path / "b")
    assert (job.spec.shards, job.spec.batch_size) == (2, 16)  # the model's batch of 8 is one shard
    with np.load(files / "d.npz") as z:
        data = Dataset(z["X"], z["Y"].astype(np.float32))
    want = make_job("m", (files / "m.onnx").read_bytes(), data, LossSpec(), OptimizerSpec(), 3, 16, 0, 3, shards=2)
    assert job.spec == want.spec
    assert_refused(run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "d.npz"),
                           "--steps", "3", "--shards", "3", "--batch-size", "16", "--out", str(tmp_path / "c")),
                   "does not split into 3 equal shards")


def test_client_bundle_mistakes_are_refused_on_one_line(files: Path, tmp_path: Path) -> None:
    """Checked before the client connects anywhere (no chain needed to hear about them)."""
    assert_refused(run_cli("client", "--bundle", str(tmp_path / "nothing")), "no job.json there", "job create")
    assert run_cli("job", "create", "--model", str(files / "m.onnx"), "--data", str(files / "d.npz"), "--steps", "2",
                   "--out", str(tmp_path / "b")).returncode == 0
    assert_refused(run_cli("client", "--bundle", str(tmp_path / "b"), "--steps", "5"),
                   "--steps 5", "2-step job")
    np.savez(tmp_path / "b" / "data.npz", X=np.zeros((40, 4), np.float32), Y=np.zeros(40))  # not the committed data
    assert_refused(run_cli("client", "--bundle", str(tmp_path / "b")), "dataset_root is 0x")
    (tmp_path / "b" / "job.json").write_text("{ not json")
    assert_refused(run_cli("client", "--bundle", str(tmp_path / "b")), "not valid JSON")

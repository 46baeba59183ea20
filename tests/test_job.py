"""Job specs: canonical hashing, JSON round trip, bundles whose commitments are all re-checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from torch import nn

from verde_chain.commit import keccak256, list_commitment
from verde_chain.graph.data import Dataset, batch_indices
from verde_chain.graph.errors import JobSpecError
from verde_chain.graph.onnx_import import export_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import SPEC_TYPES, Job, JobSpec, load_job, make_job, save_job
from verde_chain.repops.isa import f32_bits


@pytest.fixture(scope="module")
def job() -> Job:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    rng = np.random.default_rng(0)
    data = Dataset(rng.standard_normal((10, 3)).astype(np.float32), rng.integers(0, 2, 10).astype(np.float32))
    return make_job("toy", export_torch(m, torch.zeros(4, 3), ["x"]), data, LossSpec("cross_entropy"),
                    OptimizerSpec("sgd", lr=0.05, momentum=0.9), steps=5, batch_size=4, seed=3, checkpoint_interval=2)


def test_spec_encoding_is_abi_and_hash_is_stable(job: Job) -> None:
    spec = job.spec
    fields = abi_decode(SPEC_TYPES, spec.encode())
    assert fields[0] == "toy" and fields[3] == spec.graph_root and fields[5] == spec.initial_commitment
    assert fields[12][1] == f32_bits(0.05) and fields[13] == 5
    assert spec.hash() == JobSpec.from_json(json.loads(json.dumps(spec.to_json()))).hash()
    assert dataclasses.replace(spec, steps=6).hash() != spec.hash()
    assert dataclasses.replace(spec, optimizer=OptimizerSpec("sgd", lr=0.05000001, momentum=0.9)).hash() != spec.hash()


def test_spec_json_with_wrong_hash_or_fields_is_refused(job: Job) -> None:
    d = job.spec.to_json()
    d["steps"] = 99
    with pytest.raises(JobSpecError, match="spec_hash"):
        JobSpec.from_json(d)
    del d["spec_hash"], d["graph_root"]
    with pytest.raises(JobSpecError, match="malformed"):
        JobSpec.from_json(d)


def test_batch_root_commits_every_step(job: Job) -> None:
    leaves = [keccak256(abi_encode(["bytes32[]"], [[r]])) for r in job.batch_roots()]
    assert job.spec.batch_root == list_commitment(leaves)
    assert job.spec.num_nodes == len(job.program.graph.nodes)
    assert job.spec.dataset_root == job.dataset.root()


def test_batch_schedule_is_a_fresh_permutation_each_epoch() -> None:
    n, bs = 10, 5
    seen = np.concatenate([batch_indices(3, s, bs, n) for s in (1, 2)])
    assert sorted(seen) == list(range(n))
    assert np.array_equal(batch_indices(3, 4, bs, n), batch_indices(3, 4, bs, n))
    assert not np.array_equal(batch_indices(3, 1, bs, n), batch_indices(4, 1, bs, n))


def test_bundle_round_trip_trains_to_the_same_commitment(job: Job, tmp_path: Path) -> None:
    save_job(job, tmp_path)
    loaded = load_job(tmp_path / "job.json")
    assert loaded.spec == job.spec
    assert loaded.make_run().run() == job.make_run().run()


@pytest.mark.parametrize("what", ["data", "init", "model", "spec"])
def test_tampered_bundle_is_refused(job: Job, tmp_path: Path, what: str) -> None:
    save_job(job, tmp_path)
    if what == "data":
        with np.load(tmp_path / "data.npz") as z:
            X, Y = z["X"].copy(), z["Y"].copy()
        X[0, 0] += 1
        np.savez(tmp_path / "data.npz", X=X, Y=Y)
        match = "dataset_root"
    elif what == "init":
        with np.load(tmp_path / "init.npz") as z:
            arrays = {k: z[k].copy() for k in z.files}
        arrays["0.bias"][0] += 1
        np.savez(tmp_path / "init.npz", **arrays)
        match = "initial_commitment"
    elif what == "model":
        torch.manual_seed(1)
        other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        (tmp_path / "model.onnx").write_bytes(export_torch(other, torch.zeros(4, 3), ["x"]))
        match = "model_hash"
    else:
        d = json.loads((tmp_path / "job.json").read_text())
        d["seed"] = 4
        del d["spec_hash"]
        (tmp_path / "job.json").write_text(json.dumps(d))
        match = "batch_root"
    with pytest.raises(JobSpecError, match=match):
        load_job(tmp_path)


def test_job_input_shape_must_match_the_dataset() -> None:
    m = nn.Linear(3, 2)
    data = Dataset(np.zeros((6, 5), dtype=np.float32), np.zeros(6, dtype=np.float32))
    with pytest.raises(JobSpecError, match="model input"):
        make_job("bad", export_torch(m, torch.zeros(2, 3), ["x"]), data, LossSpec(), OptimizerSpec(), 2, 2)


def test_inference_job_is_forward_only_and_round_trips(tmp_path: Path) -> None:
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    rng = np.random.default_rng(1)
    data = Dataset(rng.standard_normal((6, 3)).astype(np.float32), np.zeros(6, dtype=np.float32))
    job = make_job("infer", export_torch(m, torch.zeros(2, 3), ["x"]), data, LossSpec(), OptimizerSpec(),
                   steps=3, batch_size=2, kind="inference")
    assert job.spec.kind == "inference"
    assert not any("sgd" in n.label or "grad" in n.label for n in job.program.graph.nodes)
    run = job.make_run()
    run.run()
    save_job(job, tmp_path)
    assert load_job(tmp_path).make_run().run() == run.state.commitment
    for s in (1, 3):  # batch s = samples 2(s-1), 2(s-1)+1
        out = run.recompute_step(s).output(job.program.graph, "output")
        ref = m(torch.tensor(data.X[2 * (s - 1) : 2 * s])).detach().numpy()
        assert np.allclose(out, ref, atol=1e-5)

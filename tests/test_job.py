"""Job specs: canonical hashing, JSON round trip, bundles whose commitments are all re-checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from torch import nn

from verde_chain import job as job_module
from verde_chain.commit import keccak256, list_commitment
from verde_chain.graph.data import Dataset, batch_indices
from verde_chain.graph.errors import (
    IntegerRangeError,
    JobSpecError,
    LabelRangeError,
    ModelExportError,
    NonFiniteDataError,
)
from verde_chain.graph.onnx_import import export_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.graph.world import OutputFault, TrainingWorld
from verde_chain.job import (
    SPEC_TYPES,
    Job,
    JobSpec,
    default_checkpoint_interval,
    inference_outputs,
    job_from_torch,
    load_job,
    make_job,
    save_job,
)
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
    # C_T commits every batch's outputs: the final state's outputs buffer holds all of them
    final = {slot.name: run.state.tensors[slot.producer] for slot in job.program.graph.states}
    outs = inference_outputs(job, final)["output"]
    assert outs.shape == (6, 2)
    for s in (1, 2, 3):
        assert np.array_equal(outs[2 * (s - 1) : 2 * s], run.recompute_step(s).output(job.program.graph, "output"))
    assert np.allclose(outs, m(torch.tensor(data.X)).detach().numpy(), atol=1e-5)


def test_a_lie_about_an_early_batch_changes_an_inference_jobs_result() -> None:
    """Before the outputs buffer, C_T of an inference job covered its last batch only: a wrong
    logit of batch 1 of 3 left C_T as it was, so nobody could dispute it."""
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    X = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    job = job_from_torch(m, torch.zeros(2, 3), (X, None), steps=3, kind="inference")
    out_node = job.program.graph.named["output"]
    honest = TrainingWorld.from_job(job)
    liar = TrainingWorld.from_job(job, OutputFault(step=1, node=out_node, element=1, bit=5))
    assert honest.step_commitment(1) != liar.step_commitment(1)
    assert honest.step_commitment(3) != liar.step_commitment(3)


# -- a user's own model and data: job_from_torch, exact integers, refusals before anything is built -----

def _mlp(seed: int = 0, classes: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, classes))


def _xy(n: int = 12, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, classes, n)


def test_job_from_torch_exports_in_training_mode_and_takes_integer_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[bool] = []

    def spy(*a: object, training: bool = False, **kw: object) -> bytes:
        modes.append(training)
        return export_torch(*a, training=training, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(job_module, "export_torch", spy)
    m, (X, y) = _mlp(), _xy()
    job = job_from_torch(m, torch.zeros(4, 4), (X, y), steps=3, name="mine", seed=2,
                         optimizer=OptimizerSpec("sgd", lr=0.1, momentum=0.9))
    job_from_torch(m, torch.zeros(4, 4), (X, None), steps=3, kind="inference")
    assert modes == [True, False]  # a training job in train() mode, an inference job in eval()
    assert job.onnx_bytes == export_torch(m, torch.zeros(4, 4), ["x"], training=True)
    # int64 labels were converted exactly: the same job as from float32 labels
    same = make_job("mine", job.onnx_bytes, Dataset(X, y.astype(np.float32)), LossSpec(),
                    OptimizerSpec("sgd", lr=0.1, momentum=0.9), 3, 4, 2, default_checkpoint_interval(3))
    assert job.spec == same.spec and job.make_run().run() == same.make_run().run()


def test_training_export_keeps_dropout_and_batchnorm_training_semantics() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.25), nn.Linear(6, 3)).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    proto = onnx.load_from_string(export_torch(m, torch.zeros(4, 4), ["x"], training=True))
    ops = {n.op_type: n for n in proto.graph.node}
    bn = {a.name: a.i for a in ops["BatchNormalization"].attribute}
    assert bn.get("training_mode") == 1  # batch statistics, running statistics updated
    assert "Dropout" in ops  # active dropout (its training_mode input is true)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    # the traced copy moved its running statistics, not the module's; the module's mode is kept
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items()) and not m.training
    assert np.array_equal(inits["1.running_mean"], before["1.running_mean"].numpy())


def test_torch_export_failure_is_a_named_error() -> None:
    with pytest.raises(ModelExportError, match="Sequential.*example input"):
        job_from_torch(_mlp(), torch.zeros(4, 5), _xy(), steps=1)  # 5 features into Linear(4, .)


def test_integers_are_converted_exactly_and_refused_from_2_to_the_24() -> None:
    ids = np.array([[0, 1], [2**24 - 1, 7]], dtype=np.int64)
    d = Dataset.from_arrays(ids, np.array([1, 0], dtype=np.int32))
    assert d.X.dtype == np.float32 and d.X.astype(np.int64).tolist() == ids.tolist() and d.Y.tolist() == [1.0, 0.0]
    with pytest.raises(IntegerRangeError, match="2\\*\\*24"):
        Dataset.from_arrays(np.array([[2**24]], dtype=np.int64), np.zeros(1, dtype=np.int64))
    with pytest.raises(IntegerRangeError, match="Y"):
        Dataset.from_arrays(np.zeros((1, 1)), np.array([-(2**25)], dtype=np.int64))


@pytest.mark.parametrize("bad", [-1, 3])
def test_labels_outside_the_classes_are_refused(bad: int) -> None:
    """-1 and 3 (for 3 classes) read no score: the loss would go NaN silently, and both gave the
    same C_T. Refused, by name, before a graph is built."""
    X, y = _xy()
    y[5] = bad
    with pytest.raises(LabelRangeError, match=rf"Y\[5\] = {bad} is outside \[0, 3\)"):
        job_from_torch(_mlp(), torch.zeros(4, 4), (X, y), steps=2)


def test_fractional_labels_nonfinite_samples_and_targets_are_refused() -> None:
    X, y = _xy()
    with pytest.raises(LabelRangeError, match="not an integer"):
        job_from_torch(_mlp(), torch.zeros(4, 4), (X, y + 0.5), steps=2)
    for bad in (np.nan, np.inf):
        Xb = X.copy()
        Xb[2, 1] = bad
        with pytest.raises(NonFiniteDataError, match="sample 2"):
            job_from_torch(_mlp(), torch.zeros(4, 4), (Xb, y), steps=2)
    targets = np.zeros((12, 3), dtype=np.float32)
    targets[1, 1] = np.nan
    with pytest.raises(NonFiniteDataError, match="Y"):
        job_from_torch(_mlp(), torch.zeros(4, 4), (X, targets), steps=2, loss=LossSpec("mse"))
    # the ignore index is a label the loss accepts
    y[0] = -100
    job_from_torch(_mlp(), torch.zeros(4, 4), (X, y), steps=1, loss=LossSpec(ignore_index=-100))


def test_invalid_job_json_is_a_job_spec_error(job: Job, tmp_path: Path) -> None:
    save_job(job, tmp_path)
    (tmp_path / "job.json").write_text('{"name": "toy",')
    with pytest.raises(JobSpecError, match="not valid JSON.*job create"):
        load_job(tmp_path)
    (tmp_path / "job.json").write_text("[1, 2]")
    with pytest.raises(JobSpecError, match="not a job spec"):
        load_job(tmp_path)

"""A job's deliverable opened against C_T: an inference job's every output, a training job's
parameters; a published opening that does not open the accepted result is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from verde_chain.graph.world import OutputFault, TrainingWorld
from verde_chain.job import Job, inference_outputs, job_from_torch
from verde_chain.results import ResultError, load_result, open_result, save_result, verify_result


def _module() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


@pytest.fixture(scope="module")
def inference() -> Job:
    X = np.random.default_rng(3).standard_normal((6, 3)).astype(np.float32)
    return job_from_torch(_module(), torch.zeros(2, 3), (X, None), steps=3, kind="inference")


def test_inference_outputs_open_against_c_t(inference: Job, tmp_path: Path) -> None:
    world = TrainingWorld.from_job(inference)
    c_t = world.step_commitment(3)
    opening = open_result(inference, world)
    save_result(opening, tmp_path)
    loaded = load_result(tmp_path, c_t)
    assert loaded is not None and load_result(tmp_path, b"\x01" * 32) is None
    outs = verify_result(inference, loaded, c_t)["output"]
    run = inference.make_run()
    run.run()
    final = {s.name: run.state.tensors[s.producer] for s in inference.program.graph.states}
    assert np.array_equal(outs, inference_outputs(inference, final)["output"])
    assert np.allclose(outs, _module()(torch.tensor(inference.dataset.X)).detach().numpy(), atol=1e-5)


def test_openings_that_do_not_open_the_accepted_result_are_refused(inference: Job) -> None:
    honest = TrainingWorld.from_job(inference)
    c_t = honest.step_commitment(3)
    good = open_result(inference, honest)
    # a cheater's (self-consistent) opening of its own result, checked against the accepted one
    node = inference.program.graph.named["output"]
    lie = open_result(inference, TrainingWorld.from_job(inference, OutputFault(1, node, 0, bit=4)))
    with pytest.raises(ResultError, match="accepted result"):
        verify_result(inference, lie, c_t)
    lie.result = c_t  # claiming the accepted C_T does not help: the tensor does not open it
    with pytest.raises(ResultError, match="does not open"):
        verify_result(inference, lie, c_t)
    (name,) = good.tensors
    t = good.tensors[name].copy()
    t[5] = np.float32(t[5] + 1)
    with pytest.raises(ResultError, match="InvalidProof"):
        verify_result(inference, type(good)(c_t, {name: t}, good.openings), c_t)


def test_a_training_jobs_deliverable_is_its_trained_parameters() -> None:
    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((8, 3)).astype(np.float32), rng.integers(0, 2, 8)
    job = job_from_torch(_module(), torch.zeros(4, 3), (X, y), steps=3)
    world = TrainingWorld.from_job(job)
    params = verify_result(job, open_result(job, world), world.step_commitment(3))
    run = job.make_run()
    run.run()
    state = job.program.graph.state_by_name()
    assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for k, v in params.items():
        assert np.array_equal(v.reshape(-1), run.state.tensors[state[k].producer])


def test_opening_a_result_chunks_each_output_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each deliverable spans several 128-element leaves; opening it used to re-chunk the whole
    tensor once per leaf (quadratic: minutes for resnet18's 11 M parameters)."""
    from verde_chain.commit import tensor

    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(3, 300), nn.Tanh(), nn.Linear(300, 2))  # 900 + 600 weights
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((8, 3)).astype(np.float32), rng.integers(0, 2, 8)
    job = job_from_torch(module, torch.zeros(4, 3), (X, y), steps=2)
    world = TrainingWorld.from_job(job)
    c_t = world.step_commitment(2)
    calls = []
    real = tensor.chunks
    monkeypatch.setattr(tensor, "chunks", lambda bits: calls.append(bits.size) or real(bits))
    params = verify_result(job, open_result(job, world), c_t)
    assert sum(-(-v.size // 128) for v in params.values()) > len(params)  # several leaves each
    assert len(calls) == len(params)

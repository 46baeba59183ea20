"""Training on RepOps against plain torch, and the two example jobs (digits MLP, tiny transformer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.graph import build
from verde_chain.graph.executor import StepExecutor, TrainingRun
from verde_chain.graph.onnx_import import import_torch
from verde_chain.graph.structure import SourceKind
from verde_chain.graph.training import OUTPUT_ROW_FIELD, OptimizerSpec, build_inference_graph

REPO = Path(__file__).resolve().parents[2]


def torch_optimizer(kind: str, params, o: OptimizerSpec):  # type: ignore[no-untyped-def]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)


@pytest.mark.parametrize(
    "opt",
    [
        OptimizerSpec("sgd", lr=0.1, momentum=0.9),
        OptimizerSpec("sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
        OptimizerSpec("adam", lr=0.01, weight_decay=1e-3),
        OptimizerSpec("adamw", lr=0.01, weight_decay=0.1),
    ],
    ids=lambda o: f"{o.kind}{'-nesterov' if o.nesterov else ''}",
)
def test_training_tracks_plain_torch(opt: OptimizerSpec) -> None:
    """8 steps: losses within 1e-4 relative and parameters within 1e-4 absolute of torch's."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    ref = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    ref.load_state_dict(m.state_dict())
    rng = np.random.default_rng(1)
    X = rng.standard_normal((8, 8, 6)).astype(np.float32)
    Y = rng.integers(0, 3, (8, 8)).astype(np.float32)
    prog = build(m, torch.zeros(8, 6), opt=opt)
    run = TrainingRun(prog.graph, prog.initial_state(), lambda s: prog.batch(s, {"x": X[s - 1]}, Y[s - 1]), 8)
    run.run()
    o = torch_optimizer(opt.kind, ref.parameters(), opt)
    for s in range(8):
        o.zero_grad()
        loss = nn.functional.cross_entropy(ref(torch.tensor(X[s])), torch.tensor(Y[s]).long())
        loss.backward()
        o.step()
        assert abs(run.logs[s].loss - loss.item()) <= 1e-4 * abs(loss.item())
    by_name = {sl.name: run.state.tensors[sl.producer] for sl in prog.graph.states}
    for name, p in ref.named_parameters():
        assert np.max(np.abs(by_name[name] - p.detach().numpy().reshape(-1))) <= 1e-4, name


def test_digits_mlp_reaches_90_percent() -> None:
    from verde_chain.examples.digits import digits_data, digits_job, mlp_accuracy

    job = digits_job(steps=120, checkpoint_interval=0)
    run = job.make_run()
    run.run()
    _, (Xt, yt) = digits_data()
    state = {s.name: run.state.tensors[s.producer].reshape(s.shape) for s in job.program.graph.states}
    acc = mlp_accuracy(state, Xt, yt)
    assert acc >= 0.90, acc
    assert run.logs[-1].loss < 0.3 * run.logs[0].loss


def test_tiny_transformer_loss_falls() -> None:
    from verde_chain.examples.transformer import transformer_job

    job = transformer_job(steps=12, checkpoint_interval=0)
    labels = {n.label.split("/")[0] for n in job.program.graph.nodes}
    assert {"gather", "scatter_add", "layer_norm", "softmax", "softmax_bwd", "layer_norm_bwd", "carry:block.mask"} <= labels
    run = job.make_run()
    run.run()
    losses = [log.loss for log in run.logs]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses


def test_inference_graph_is_forward_only() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    model, _ = import_torch(m, torch.zeros(3, 4), ["x"])
    g = build_inference_graph(model, steps=2)
    assert not any("grad" in n.label or "sgd" in n.label for n in g.nodes)
    ex = StepExecutor(g)
    init = {v.name: v.data for v in model.params()} | {"outputs:output": np.zeros((2, 6), dtype=np.float32)}
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    res = ex.run_step(ex.initial_state(init), g.pack_batch({"x": x, OUTPUT_ROW_FIELD: np.zeros(1)}))
    want = m(torch.tensor(x)).detach().numpy()
    assert np.allclose(res.output(g, "output"), want, atol=1e-5)
    # the step wrote its outputs into row 0 of the outputs buffer (row 1 is still zero), and
    # parameters are carried unchanged, so the next step reads the same weights
    buf = res.output(g, "outputs:output")
    assert np.array_equal(buf[0], res.output(g, "output").reshape(-1)) and not buf[1].any()
    for slot in g.states:
        if slot.role != "outputs":
            assert np.array_equal(res.state.tensors[slot.producer], init[slot.name].reshape(-1))
    assert any(s.kind == SourceKind.PREV_STEP_NODE_OUTPUT for n in g.nodes for s in n.inputs)


def test_cli_json_summary(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verde_chain.cli", "train", "digits", "--steps", "4", "--checkpoint-interval", "2",
         "--out", str(tmp_path), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["final_commitment"].startswith("0x")
    assert len(bytes.fromhex(summary["final_commitment"][2:])) == 32
    commits = json.loads((tmp_path / "commitments.json").read_text())
    assert commits["4"] == summary["final_commitment"]
    again = subprocess.run(
        [sys.executable, "-m", "verde_chain.cli", "train", str(tmp_path / "job"), "--steps", "4", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    assert json.loads(again.stdout.strip().splitlines()[-1])["final_commitment"] == summary["final_commitment"]
    # a crash after step 3: only checkpoints 0 and 2 survive; --resume continues from step 2
    for f in (tmp_path / "checkpoints").glob("step_00000004.*"):
        f.unlink()
    resumed = subprocess.run(
        [sys.executable, "-m", "verde_chain.cli", "train", str(tmp_path / "job"), "--out", str(tmp_path), "--resume",
         "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["final_commitment"] == summary["final_commitment"]

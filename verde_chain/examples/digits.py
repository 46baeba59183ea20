"""MLP on scikit-learn's bundled 8x8 digits (no download): 64 -> 64 -> ReLU -> 10, SGD momentum.

Split: the first 1500 samples (in a fixed, seeded shuffle) train, the other 297 test. Pixels are
scaled to [0, 1] (x / 16, exact in binary32). The torch module only provides the architecture and
the initial weights (seeded); training runs on RepOps.
"""

from __future__ import annotations

import numpy as np

from verde_chain.graph.data import Dataset
from verde_chain.graph.onnx_import import export_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import Job, make_job

N_TRAIN = 1500


def digits_data() -> tuple[Dataset, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.float32)
    perm = np.random.default_rng(1234).permutation(len(X))
    X, y = X[perm], y[perm]
    return Dataset(X[:N_TRAIN], y[:N_TRAIN]), (X[N_TRAIN:], y[N_TRAIN:])


def digits_module(hidden: int = 64, seed: int = 0):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def digits_job(steps: int = 150, batch_size: int = 64, lr: float = 0.1, momentum: float = 0.9,
               checkpoint_interval: int = 25, seed: int = 7, hidden: int = 64, shards: int = 1) -> Job:
    """``shards`` S > 1: each step's ``batch_size`` samples in S micro-batches (the model is
    exported at ``batch_size / S``)."""
    import torch

    train, _ = digits_data()
    module = digits_module(hidden)
    micro = batch_size // shards if shards >= 1 and batch_size % shards == 0 else batch_size
    onnx_bytes = export_torch(module, torch.zeros(micro, 64), ["x"])
    return make_job(
        "digits-mlp", onnx_bytes, train, LossSpec("cross_entropy"), OptimizerSpec("sgd", lr=lr, momentum=momentum),
        steps, batch_size, seed, checkpoint_interval, shards=shards,
    )


def mlp_accuracy(state: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of trained MLP weights (plain numpy forward; evaluation is not committed)."""
    w1, b1, w2, b2 = state["0.weight"], state["0.bias"], state["2.weight"], state["2.bias"]
    h = np.maximum(X @ w1.reshape(-1, X.shape[1]).T + b1, 0)
    logits = h @ w2.reshape(-1, h.shape[1]).T + b2
    return float((logits.argmax(1) == y).mean())

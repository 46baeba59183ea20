"""Vision models with random weights (no downloads): torchvision's resnet18 and mobilenet_v2 at
3x32x32, and a small CNN on scikit-learn's bundled 8x8 digits.

Each is exported in training mode (batch norm on batch statistics with running-statistics
updates, dropout active) and made a job: the torch module gives the architecture and the
seeded initial weights, training runs on RepOps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from verde_chain.examples.digits import digits_data
from verde_chain.graph.data import Dataset
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import Job, job_from_torch

VISION_MODELS = ("resnet18", "mobilenet_v2", "digits_cnn")


def torchvision_models() -> Any:
    """``torchvision.models``, importable without torchvision's compiled ops.

    PyPI's torchvision wheels link a CUDA torch; with the CPU torch we pin, their ``_C`` does
    not load, and torchvision 0.28 then fails at import registering fake kernels for
    ``torchvision::nms``/``qnms``, ops that only ``_C`` defines. The models are plain Python and
    need none of it: declare the two schemas (no kernels) when ``_C`` cannot load."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed (pinned: torchvision==0.28.0)")
    if not hasattr(torch.ops.torchvision, "nms"):
        ext = sorted(Path(spec.origin).parent.glob("_C*.so"))
        try:
            torch.ops.load_library(str(ext[0]))
        except (IndexError, OSError):
            lib = torch.library.Library("torchvision", "DEF")  # held in _KEEP: a collected Library deregisters
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _KEEP.append(lib)
    import torchvision.models

    return torchvision.models


_KEEP: list[Any] = []  # the schema library of torchvision_models, alive as long as the process


def vision_module(name: str, seed: int = 0) -> Any:
    """A freshly initialised (seeded) torch module: resnet18 / mobilenet_v2 (10 classes, for
    3x32x32) or the digits CNN (1x8x8)."""
    import torch

    torch.manual_seed(seed)
    if name == "digits_cnn":
        nn = torch.nn
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
        )
    models = torchvision_models()
    if name == "resnet18":
        return models.resnet18(weights=None, num_classes=10)
    if name == "mobilenet_v2":
        return models.mobilenet_v2(weights=None, num_classes=10)
    raise ValueError(f"unknown vision model {name!r}; known: {VISION_MODELS}")


def input_shape(name: str) -> tuple[int, ...]:
    return (1, 8, 8) if name == "digits_cnn" else (3, 32, 32)


def cifar_like(n: int, seed: int = 0) -> Dataset:
    """``n`` random 3x32x32 images in [0, 1) and labels 0..9 (a stand-in for CIFAR-10: no
    download; the protocol does not care what the pixels show)."""
    r = np.random.default_rng(seed)
    X = r.random((n, 3, 32, 32), dtype=np.float32)
    Y = r.integers(0, 10, n).astype(np.float32)
    return Dataset(X, Y)


def digits_images() -> tuple[Dataset, tuple[np.ndarray, np.ndarray]]:
    """The digits split of ``examples/digits.py`` as 1x8x8 images."""
    train, (Xt, yt) = digits_data()
    return Dataset(train.X.reshape(-1, 1, 8, 8), train.Y), (Xt.reshape(-1, 1, 8, 8), yt)


def vision_job(name: str, steps: int = 10, batch_size: int = 8, lr: float = 0.05, momentum: float = 0.9,
               seed: int = 7, checkpoint_interval: int = 0, samples: int = 256) -> Job:
    """A training job for one of ``VISION_MODELS``: cross-entropy, SGD with momentum, made the way
    a user makes one (``job_from_torch``: training-mode export, the module's buffers frozen)."""
    import torch

    module = vision_module(name)
    data = digits_images()[0] if name == "digits_cnn" else cifar_like(samples)
    return job_from_torch(
        module, torch.zeros(batch_size, *input_shape(name)), data, steps=steps, name=name,
        loss=LossSpec("cross_entropy"), optimizer=OptimizerSpec("sgd", lr=lr, momentum=momentum), seed=seed,
        checkpoint_interval=checkpoint_interval,
    )


def digits_cnn_job(steps: int = 150, batch_size: int = 32, lr: float = 0.05, momentum: float = 0.9,
                   checkpoint_interval: int = 0, seed: int = 7) -> Job:
    """The digits CNN (two conv + batch norm + ReLU + max pool stages, a linear head), SGD with
    momentum: 150 steps of batch 32 reach >= 97% test accuracy."""
    return vision_job("digits_cnn", steps, batch_size, lr, momentum, seed, checkpoint_interval)


def digits_cnn_accuracy(state: dict[str, np.ndarray]) -> float:
    """Test accuracy of trained digits-CNN state (the job's parameters and running statistics)
    on the held-out digits, evaluated by the torch module in eval mode (evaluation is not
    committed)."""
    import torch

    module = vision_module("digits_cnn")
    sd = module.state_dict()
    missing = [k for k in sd if k not in state and not k.endswith("num_batches_tracked")]
    if missing:
        raise KeyError(f"state lacks {missing}")
    module.load_state_dict({k: torch.tensor(state[k]).reshape(v.shape) if k in state else v for k, v in sd.items()})
    module.eval()
    _, (X, y) = digits_images()
    with torch.no_grad():
        return float((module(torch.tensor(X)).argmax(1).numpy() == y).mean())

"""Example jobs a client can post: an MLP and a CNN on scikit-learn's digits, a tiny character
transformer, torchvision's resnet18 and mobilenet_v2 on 3x32x32 images."""

import functools
from collections.abc import Callable

from verde_chain.examples.digits import digits_job
from verde_chain.examples.transformer import transformer_job
from verde_chain.examples.vision import digits_cnn_job, vision_job
from verde_chain.job import Job

EXAMPLES: dict[str, Callable[..., Job]] = {
    "digits": digits_job,
    "transformer": transformer_job,
    "digits_cnn": digits_cnn_job,
    "resnet18": functools.partial(vision_job, "resnet18"),
    "mobilenet_v2": functools.partial(vision_job, "mobilenet_v2"),
}

__all__ = ["EXAMPLES", "digits_cnn_job", "digits_job", "transformer_job", "vision_job"]

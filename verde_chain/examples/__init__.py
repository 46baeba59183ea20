"""Example jobs a client can post: an MLP on scikit-learn's digits, a tiny character transformer."""

from collections.abc import Callable

from verde_chain.examples.digits import digits_job
from verde_chain.examples.transformer import transformer_job
from verde_chain.job import Job

EXAMPLES: dict[str, Callable[..., Job]] = {"digits": digits_job, "transformer": transformer_job}

__all__ = ["EXAMPLES", "digits_job", "transformer_job"]

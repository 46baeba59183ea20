"""Fixtures of the explorer tests: one tiny digits job per module, its published bundle, a fresh market."""

from tests.support.bots import bundles, job, world  # noqa: F401 - fixtures

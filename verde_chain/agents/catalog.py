"""Jobs the client can post, and the shared bundle directory trainers fetch them from.

A posted job carries only commitments on chain (specHash, graphRoot, C_0, batchRoot). The bundle
itself (``job.json``, ``model.onnx``, ``data.npz``, ``init.npz``, see ``verde_chain/job.py``)
is published under ``<bundles>/<specHash hex>/``: content addressed, as it would be on IPFS;
bots on other machines download it from the job's ``bundleUri`` (``verde-chain bundles serve``)
into their own directory, verified (``verde_chain/bundles/fetch.py``).
Whoever fetches a bundle re-derives every commitment (``load_job``) and checks it against the
on-chain job before spending compute on it.
"""

from __future__ import annotations

from pathlib import Path

from verde_chain.agents.errors import AgentError
from verde_chain.bundles import BundleRefused, fetch_bundle
from verde_chain.dispute.world import World
from verde_chain.errors import VerdeError
from verde_chain.job import Job, load_job, save_job
from verde_chain.market.types import JobTerms
from verde_chain.results import ResultOpening, load_result, open_result, save_result

JOB_KINDS = ("digits", "transformer", "llama", "llama-inference", "resnet18", "mobilenet_v2", "digits_cnn")


def build_job(kind: str, steps: int, seed: int = 7) -> Job:
    """The demo's jobs, kept small enough to dispute in well under a minute on two cores."""
    if kind == "digits":
        from verde_chain.examples.digits import digits_job

        return digits_job(steps=steps, batch_size=64, hidden=64, checkpoint_interval=max(1, steps // 4), seed=seed)
    if kind == "transformer":
        from verde_chain.examples.transformer import transformer_job

        return transformer_job(steps=steps, batch_size=2, context=8, dim=8, heads=2,
                               checkpoint_interval=max(1, steps // 4), seed=seed)
    if kind in ("llama", "llama-inference"):
        from verde_chain.examples.lm import LMConfig, lm_job

        # the tiny Llama (2 layers, hidden 64, vocabulary 128, sequence 16), batch 2;
        # an inference job is one batch of prompts per job (its C_T commits to its last batch)
        inference = kind == "llama-inference"
        return lm_job(LMConfig("llama"), "inference" if inference else "train", steps=1 if inference else steps,
                      checkpoint_interval=max(1, steps // 4), seed=seed)
    if kind in ("resnet18", "mobilenet_v2", "digits_cnn"):
        from verde_chain.examples.vision import vision_job

        # the CIFAR-shaped nets at batch 2 on 8 random images: a dispute, not a training run
        return vision_job(kind, steps=steps, batch_size=2 if kind != "digits_cnn" else 32, samples=8,
                          checkpoint_interval=max(1, steps // 4), seed=seed)
    raise AgentError(f"unknown job kind {kind!r}; choose one of {', '.join(JOB_KINDS)}")


class Bundles:
    """The shared, content-addressed directory of job bundles."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._cache: dict[bytes, Job] = {}

    def publish(self, job: Job) -> bytes:
        h = job.spec.hash()
        save_job(job, self.root / h.hex())
        self._cache[h] = job
        return h

    def uri(self, spec_hash: bytes) -> str:
        """Where the bundle of ``spec_hash`` is published (the job's on-chain ``bundleUri``)."""
        return (self.root / spec_hash.hex()).resolve().as_uri()

    def fetch(self, spec_hash: bytes, uri: str = "") -> Job:
        """The verified bundle of ``spec_hash``: from this directory, else downloaded from the
        job's ``uri`` into it (``bundles/fetch.py``; a refusal names its reason)."""
        if spec_hash not in self._cache:
            d = self.root / spec_hash.hex()
            if not (d / "job.json").exists():
                if not uri:
                    raise AgentError(f"no bundle for spec 0x{spec_hash.hex()} under {self.root} and the job names no "
                                     "bundleUri", spec_hash=spec_hash)
                try:
                    self._cache[spec_hash] = fetch_bundle(uri, spec_hash, self.root)
                except BundleRefused as exc:
                    raise AgentError(str(exc), spec_hash=spec_hash, reason=exc.reason, field=exc.field) from exc
                return self._cache[spec_hash]
            try:
                job = load_job(d)
            except VerdeError as exc:  # a bad bundle is one job refused, never a bot down
                raise AgentError(f"bundle {d} refused: {exc}", spec_hash=spec_hash) from exc
            if job.spec.hash() != spec_hash:
                raise AgentError(f"bundle {d} hashes to 0x{job.spec.hash().hex()}", spec_hash=spec_hash)
            self._cache[spec_hash] = job
        return self._cache[spec_hash]

    def results_dir(self, spec_hash: bytes) -> Path:
        """Where trainers publish the openings of their results (``verde_chain/results.py``)."""
        return self.root / spec_hash.hex() / "results"

    def publish_result(self, job: Job, world: World) -> Path:
        """Publish the opening of the result ``world`` computes, beside the job's bundle."""
        return save_result(open_result(job, world), self.results_dir(job.spec.hash()))

    def result(self, spec_hash: bytes, result: bytes) -> ResultOpening | None:
        """The published opening of ``result`` (None if no trainer published one)."""
        return load_result(self.results_dir(spec_hash), result)


def check_against_chain(job: Job, terms: JobTerms) -> str | None:
    """The first on-chain field that disagrees with the bundle, or None when they all match."""
    checks = [
        ("specHash", terms.spec_hash, job.spec.hash()),
        ("graphRoot", terms.graph_root, job.spec.graph_root),
        ("initialCommitment", terms.initial_commitment, job.spec.initial_commitment),
        ("batchRoot", terms.batch_root, job.spec.batch_root),
        ("numSteps", terms.num_steps, job.spec.steps),
        ("numNodes", terms.num_nodes, job.spec.num_nodes),
    ]
    return next((name for name, a, b in checks if a != b), None)

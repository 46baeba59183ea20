"""Bundles over HTTP: a served bundle is fetched and verified; every tampered file, a missing file,
an unreachable server and an unknown scheme are refused with a named reason."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import assert_refused, run_cli
from verde_chain.agents.catalog import Bundles, build_job
from verde_chain.agents.errors import AgentError
from verde_chain.bundles import BundleRefused, fetch_bundle
from verde_chain.bundles.server import base_url, bundle_uri, serve_in_thread
from verde_chain.job import Job, save_job
from verde_chain.ports import free_port


@pytest.fixture(scope="module")
def job() -> Job:
    return build_job("digits", 3)


def _tamper_npz(path: Path, key: str) -> None:
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays[key].reshape(-1)[0] += 1.0
    np.savez(path, **arrays)


def _other_model(d: Path) -> None:
    import torch

    from verde_chain.examples.digits import digits_module
    from verde_chain.graph.onnx_import import export_torch

    (d / "model.onnx").write_bytes(export_torch(digits_module(64, seed=1), torch.zeros(64, 64), ["x"]))


TAMPER = {  # variant -> (what is changed, the commitment that catches it)
    "data": (lambda d: _tamper_npz(d / "data.npz", "X"), "dataset_root"),
    "init": (lambda d: _tamper_npz(d / "init.npz", "0.weight"), "initial_commitment"),
    "model": (_other_model, "model_hash"),
    "spec": (lambda d: save_job(build_job("digits", 4), d), "specHash"),  # a valid bundle of another job
}


@pytest.fixture(scope="module")
def served(job: Job, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("served")
    h = Bundles(root).publish(job).hex()
    for name, (change, _) in TAMPER.items():
        shutil.copytree(root / h, root / name)
        change(root / name)
    shutil.copytree(root / h, root / "incomplete")
    (root / "incomplete" / "init.npz").unlink()
    server = serve_in_thread(root)
    yield root, base_url(server)
    server.shutdown()


def test_a_served_bundle_is_fetched_verified_and_kept(job: Job, served: tuple[Path, str], tmp_path: Path) -> None:
    _, base = served
    h = job.spec.hash()
    got = fetch_bundle(bundle_uri(base, h), h, tmp_path)
    assert got.spec == job.spec and got.spec.batch_root == job.spec.batch_root
    assert sorted(p.name for p in tmp_path.iterdir()) == [h.hex()]  # no partial download left behind
    # the bots' directory: fetched once by URI, then found locally (the shared directory keeps working)
    b = Bundles(tmp_path / "bot")
    assert b.fetch(h, bundle_uri(base, h)).spec == job.spec
    assert Bundles(tmp_path / "bot").fetch(h).spec == job.spec


@pytest.mark.parametrize("variant", list(TAMPER))
def test_a_tampered_bundle_is_refused_naming_the_commitment(job: Job, served: tuple[Path, str], tmp_path: Path,
                                                            variant: str) -> None:
    _, base = served
    with pytest.raises(BundleRefused) as err:
        fetch_bundle(f"{base}/{variant}", job.spec.hash(), tmp_path)
    assert (err.value.reason, err.value.field) == ("tampered", TAMPER[variant][1])
    assert list(tmp_path.iterdir()) == []  # nothing of it is kept


def test_missing_unreachable_and_unknown_uris_are_refused_by_name(job: Job, served: tuple[Path, str],
                                                                  tmp_path: Path) -> None:
    _, base = served
    h = job.spec.hash()
    cases = {f"{base}/incomplete": "missing-file", f"{base}/nothing-here": "missing-file",
             f"http://127.0.0.1:{free_port()}/{h.hex()}": "unreachable", f"ipfs://{h.hex()}": "unsupported-uri"}
    for uri, reason in cases.items():
        with pytest.raises(BundleRefused) as err:
            fetch_bundle(uri, h, tmp_path)
        assert err.value.reason == reason, uri
    # a bot sees an AgentError (one job refused, the bot carries on) with the reason in its fields
    with pytest.raises(AgentError, match=r"refused \(tampered: dataset_root\)") as agent_err:
        Bundles(tmp_path / "bot").fetch(h, f"{base}/data")
    assert agent_err.value.fields["reason"] == "tampered"
    with pytest.raises(AgentError, match="names no bundleUri"):
        Bundles(tmp_path / "bot").fetch(h)


def test_serving_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    assert_refused(run_cli("bundles", "serve", str(tmp_path / "nope"), "--port", "0"), "no bundle directory")

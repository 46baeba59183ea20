"""Fetch a job bundle by its ``bundleUri`` and verify it before it is used.

A bundle URI names a directory holding the files ``save_job`` writes (``job.BUNDLE_FILES``):
``http(s)://HOST[:PORT]/PATH`` (``verde-chain bundles serve`` publishes ``DIR/<specHash hex>/``
as ``http://HOST:PORT/<specHash hex>``) or ``file:///PATH``. The files are downloaded into
``<cache>/<specHash hex>.partial/`` and the bundle is accepted only if

    1. ``load_job`` re-derives every commitment the spec states from the files and they match:
       model hash, dataset root, graph root, C_0 and (every batch) batch root;
    2. the spec hashes to the ``specHash`` the job carries on chain;

then the directory is renamed to ``<cache>/<specHash hex>/``, where a shared bundle directory
would have it. (The caller then compares the on-chain graphRoot, C_0, batchRoot, T and node count
with the bundle: ``agents/catalog.py``'s ``check_against_chain``.) Anything else is refused with
``BundleRefused``, whose ``reason`` names what went wrong (``REASONS``).
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from verde_chain.errors import VerdeError
from verde_chain.job import BUNDLE_FILES, Job, load_job

REASONS = (
    "unsupported-uri",  # not http(s):// or file://
    "unreachable",  # no connection, a timeout, a server error
    "missing-file",  # the server answers 404 (or a file:// path lacks a file)
    "too-large",  # a file beyond MAX_BYTES
    "tampered",  # a commitment does not match the files, or the spec is not the job's specHash
)
MAX_BYTES = 1 << 30  # one file of a bundle; beyond it the bundle is refused rather than filling a disk
TIMEOUT_S = 30.0


class BundleRefused(VerdeError):
    """A bundle that cannot be used: ``reason`` one of ``REASONS``, ``field`` the commitment that
    did not match (for ``tampered``), ``uri`` where it was fetched from."""

    def __init__(self, reason: str, uri: str, detail: str, field: str = "") -> None:
        self.reason, self.uri, self.field = reason, uri, field
        super().__init__(f"bundle {uri} refused ({reason}{': ' + field if field else ''}): {detail}")


def _download(uri: str, name: str, dest: Path) -> None:
    url = uri.rstrip("/") + "/" + name
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme == "file":
        src = Path(urllib.parse.urlparse(url).path)
        if not src.is_file():
            raise BundleRefused("missing-file", uri, f"no {name} at {src}")
        if src.stat().st_size > MAX_BYTES:
            raise BundleRefused("too-large", uri, f"{name} is over {MAX_BYTES} bytes")
        shutil.copyfile(src, dest)
        return
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, open(dest, "wb") as out:
            total = 0
            while chunk := resp.read(1 << 20):
                total += len(chunk)
                if total > MAX_BYTES:
                    raise BundleRefused("too-large", uri, f"{name} is over {MAX_BYTES} bytes")
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        reason = "missing-file" if exc.code == 404 else "unreachable"
        raise BundleRefused(reason, uri, f"GET {url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, DNS, timeout
        why = getattr(exc, "reason", exc)
        raise BundleRefused("unreachable", uri, f"GET {url}: {why}") from exc


def fetch_bundle(uri: str, spec_hash: bytes, cache: str | Path) -> Job:
    """The verified job the bundle at ``uri`` holds, for the job whose specHash is ``spec_hash``
    (module docstring); kept under ``cache/<specHash hex>/``."""
    if urllib.parse.urlparse(uri).scheme not in ("http", "https", "file"):
        raise BundleRefused("unsupported-uri", uri, "a bundle URI is http://, https:// or file://")
    root = Path(cache)
    final, partial = root / spec_hash.hex(), root / f"{spec_hash.hex()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for name in BUNDLE_FILES:
            _download(uri, name, partial / name)
        try:
            job = load_job(partial)
        except VerdeError as exc:  # a commitment the files do not give, or files that do not parse
            raise BundleRefused("tampered", uri, str(exc).replace(str(partial), "the bundle"),
                                str(getattr(exc, "fields", {}).get("field", ""))) from exc
        if job.spec.hash() != spec_hash:
            raise BundleRefused("tampered", uri, f"its spec hashes to 0x{job.spec.hash().hex()}, the job's specHash "
                                f"is 0x{spec_hash.hex()}", "specHash")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return job

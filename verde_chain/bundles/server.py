"""``verde-chain bundles serve DIR``: publish a bundle directory over HTTP, read only.

``DIR`` is laid out as a shared bundle directory (``DIR/<specHash hex>/`` per job, what the
client bot's ``--bundles`` holds), so ``http://HOST:PORT/<specHash hex>`` is the ``bundleUri`` of
that job. Nothing is trusted on either side: the fetcher verifies every commitment
(``bundles/fetch.py``), so the server is a plain static file server (GET and HEAD only; no
directory listings).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import threading
from pathlib import Path

from verde_chain.errors import VerdeError


class _Handler(http.server.SimpleHTTPRequestHandler):
    def list_directory(self, path: str | Path) -> None:  # type: ignore[override]
        self.send_error(404, "no listings")

    def log_message(self, format: str, *args: object) -> None:
        pass


def make_server(directory: str | Path, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    """A server of ``directory`` (not started; ``serve_forever`` it, or use ``serve_in_thread``)."""
    d = Path(directory)
    if not d.is_dir():
        raise VerdeError(f"no bundle directory {d} (a client bot publishes bundles under its --bundles directory)")
    try:
        return http.server.ThreadingHTTPServer((host, port), functools.partial(_Handler, directory=str(d)))
    except OSError as exc:
        raise VerdeError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc


def base_url(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


def bundle_uri(base: str, spec_hash: bytes) -> str:
    """The bundleUri of a job published under ``base`` (empty: no URI, a shared directory only)."""
    return f"{base.rstrip('/')}/{spec_hash.hex()}" if base else ""


def serve_in_thread(directory: str | Path, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    server = make_server(directory, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("serve", help="publish DIR/<specHash hex>/ bundles over HTTP")
    s.add_argument("dir", type=Path, help="the bundle directory (a client bot's --bundles)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8600, help="port (0: any free one)")


def run(args: argparse.Namespace) -> int:
    server = make_server(args.dir, args.host, args.port)
    print(f"serving {args.dir} at {base_url(server)}/ (a job's bundleUri: {base_url(server)}/<specHash hex>)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

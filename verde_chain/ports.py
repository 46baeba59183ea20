"""A free local TCP port for a server we are about to start (Anvil, a rendezvous, a test server).

The port is only free when drawn: the socket is closed before the caller's server binds it, so
another process can take it in between. A server started on it must therefore prove that what
answers on the port is itself (``chain.anvil`` reads its own node's ``Listening on`` line) and
draw again if its bind failed."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

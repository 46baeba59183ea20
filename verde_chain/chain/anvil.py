"""Start and stop a local Anvil chain: free port, logs to a file, never an orphan process.

Anvil's stdout goes to a log file (an undrained pipe blocks Anvil after ~64 KiB of logs). The
child is tied to its parent with PR_SET_PDEATHSIG, so it dies even if the parent is SIGKILLed,
and ``stop()`` runs from ``atexit`` and on SIGTERM/SIGINT.
"""

from __future__ import annotations

import atexit
import ctypes
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from web3 import Web3

from verde_chain.chain.paths import BUILD, anvil_binary
from verde_chain.chain.tx import http_provider
from verde_chain.errors import ChainError
from verde_chain.ports import free_port

DEFAULT_MNEMONIC = "test test test test test test test test test test test junk"
DEFAULT_BALANCE_ETH = 10_000
BLOCK_GAS_LIMIT = 1_000_000_000  # lets test harnesses push thousands of softfloat ops per call
MAINNET_GAS_LIMIT = 30_000_000  # an Ethereum mainnet block (the mainnet-shaped test profile)
PORT_DRAWS = 5  # a drawn port can be taken before Anvil binds it (ports.py): draw again, this often
_PORT_TAKEN = b"Address already in use"


class PortTaken(ChainError):
    """Anvil could not bind its port: another process holds it."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Anvil:
    """A running Anvil process. Use as a context manager or call ``stop()``."""

    def __init__(
        self,
        port: int | None = None,
        accounts: int = 10,
        log_dir: Path | None = None,
        block_time: float | None = None,
        chain_id: int = 31337,
        gas_limit: int = BLOCK_GAS_LIMIT,
    ) -> None:
        binary = anvil_binary()
        if not binary.exists():
            raise ChainError(f"anvil not found at {binary}; run `make setup` (npm ci) first")
        log_dir = log_dir or BUILD / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.chain_id = chain_id
        self._log_dir = log_dir
        self._args = [
            str(binary),
            "--host", "127.0.0.1",
            "--accounts", str(accounts),
            "--balance", str(DEFAULT_BALANCE_ETH),
            "--mnemonic", DEFAULT_MNEMONIC,
            "--chain-id", str(chain_id),
            "--gas-limit", str(gas_limit),
            "--code-size-limit", str(0x6000),
            "--hardfork", "cancun",
        ]
        if block_time:
            self._args += ["--block-time", str(block_time)]
        # A port the caller chose is tried once (taken: PortTaken); a drawn one is drawn again.
        draws = 1 if port else PORT_DRAWS
        for draw in range(draws):
            try:
                self._start(port or free_port())
                return
            except PortTaken:
                if draw + 1 == draws:
                    raise

    def _start(self, port: int) -> None:
        self.port = port
        self.rpc_url = f"http://127.0.0.1:{port}"
        self.log_path = Path(tempfile.mkstemp(prefix=f"anvil-{port}-", suffix=".log", dir=self._log_dir)[1])
        # Kept open for the process's whole life (closed in stop()), so no context manager.
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*self._args, "--port", str(port)], stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, needed so Anvil dies with us
        )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 30.0) -> None:
        """Return once OUR node answers. Whatever answers on the port is not enough: another
        process's node may hold it (the port was free when drawn), and this Anvil is then about to
        exit with a bind error while RPC calls would go to that other chain. Our node's own log
        line says it bound the port."""
        deadline = time.monotonic() + timeout
        listening = f"Listening on 127.0.0.1:{self.port}".encode()
        w3 = self.web3()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_path.read_bytes()
                if _PORT_TAKEN in log:
                    raise PortTaken(f"port {self.port} is taken: another process listens on it")
                raise ChainError(f"anvil exited with {self.proc.returncode}; log: {log[-2000:].decode(errors='replace')}")
            try:
                if listening in self.log_path.read_bytes() and w3.is_connected():
                    return
            except Exception:  # noqa: BLE001, S110 - not listening yet; retried until the deadline
                pass
            time.sleep(0.05)
        raise ChainError(f"anvil did not answer on {self.rpc_url} within {timeout}s")

    def web3(self) -> Web3:
        return Web3(http_provider(self.rpc_url))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# -- test-time helpers (JSON-RPC methods Anvil implements) ---------------------------------------

def snapshot(w3: Web3) -> str:
    return str(w3.provider.make_request("evm_snapshot", []).get("result"))  # type: ignore[arg-type]


def revert(w3: Web3, snap_id: str) -> None:
    res = w3.provider.make_request("evm_revert", [snap_id])  # type: ignore[arg-type]
    if res.get("result") is not True:
        raise ChainError(f"evm_revert({snap_id}) failed: {res}")


def increase_time(w3: Web3, seconds: int) -> None:
    w3.provider.make_request("evm_increaseTime", [int(seconds)])  # type: ignore[arg-type]
    mine(w3, 1)


def set_next_block_timestamp(w3: Web3, timestamp: int) -> None:
    """The next block (and the calls and gas estimates run against it) carries exactly `timestamp`."""
    w3.provider.make_request("evm_setNextBlockTimestamp", [int(timestamp)])  # type: ignore[arg-type]


def mine(w3: Web3, blocks: int = 1) -> None:
    w3.provider.make_request("anvil_mine", [hex(blocks)])  # type: ignore[arg-type]


_stop_signal: int | None = None  # the SIGTERM a foreground command was asked to stop by


def install_signal_cleanup() -> None:
    """SIGTERM stops a foreground command (``verde-chain node``) the way Ctrl-C does: the handler
    only records the signal, and the command's loop polls ``stop_requested`` and leaves its
    ``with Anvil`` block, which stops the node. The handler once raised SystemExit, but a signal
    can land inside any code, a ``__del__`` run by the garbage collector included, where Python
    prints the exception as a traceback and swallows it: the node then kept running."""

    def _record(signum: int, _frame: object) -> None:
        global _stop_signal
        _stop_signal = signum

    signal.signal(signal.SIGTERM, _record)


def stop_requested() -> int | None:
    """The signal number ``install_signal_cleanup``'s handler recorded, or None."""
    return _stop_signal

"""Ports and the wait for a coordinator, shared by the harness and every backend's engine (no framework)."""

from __future__ import annotations

import socket
import time

RETRY_S = 0.25   # between connection attempts to a coordinator that is not listening yet


def free_port() -> int:
    """A loopback port free now (the engine binds it a moment later; a clash fails that run, not the report)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_coordinator(host: str, port: int, timeout: float, what: str) -> None:
    """Return when HOST:PORT accepts a connection; ConnectionError naming `what` and the address after
    `timeout` seconds. For engines that would otherwise wait forever (ps-lite) or die without a Python error
    (jax.distributed) when their coordinator is absent."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"could not reach the {what} at {host}:{port} within {timeout:g} s: {e}") \
                    from None
        time.sleep(RETRY_S)

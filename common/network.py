"""Ports, the wait for a coordinator, and this host's interfaces and addresses, shared by the harness and every
backend's engine (no framework)."""

from __future__ import annotations

import fcntl
import socket
import struct
import time

RETRY_S = 0.25  # between connection attempts to a coordinator that is not listening yet


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
                raise ConnectionError(
                    f"could not reach the {what} at {host}:{port} within {timeout:g} s: {e}"
                ) from None
        time.sleep(RETRY_S)


# An interface's IPv4 address (Linux's SIOCGIFADDR): the standard library has no call for it.
SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface `name` (its primary one); None if it has none or no such exists."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> dict[str, str | None]:
    """{interface name: its IPv4 address or None} of this host (this network namespace)."""
    return {name: interface_address(name) for _, name in socket.if_nameindex()}


def interface_of(address: str) -> str | None:
    """The interface whose primary IPv4 address is `address`; None if none is (a secondary address, IPv6)."""
    return next((name for name, own in interfaces().items() if own == address), None)


def is_local_address(address: str) -> bool:
    """Whether this host holds `address` (a socket can be bound to it: secondary addresses count too)."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def listed_interfaces() -> str:
    """This host's interfaces for an error message: "lo 127.0.0.1, eth0 10.0.0.2"."""
    return ", ".join(
        f"{name} {address or '(no IPv4 address)'}" for name, address in interfaces().items()
    )

"""The nodes of one run (`NodeSpec`): how many, which one this process is, where they meet, and how long they wait
for each other; with the checks the harness's node flags share (harness/nodes/nodes.py).

Several processes on one or more hosts ("nodes"): a run's devices are its global count, devices // nodes on each
node; every node runs the same config with its own rank, and joins the framework's engine (torchrun's rendezvous,
jax.distributed's coordinator, MXNet's ps-lite scheduler) at the coordinator.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, fields

from common.errors import ConfigError


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_join_timeout(seconds) -> None:
    if not is_number(seconds) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"--join-timeout must be positive and finite, in seconds (got {seconds})")


def check_peer_timeout(seconds) -> None:
    if not is_number(seconds) or not math.isfinite(seconds) or seconds < 1:
        raise ConfigError(f"--peer-timeout must be at least 1 second, and finite (got {seconds})")


def check_local_addr(address) -> None:
    try:
        address is None or ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(
            f"--local-addr takes an IP address of this host (got {address!r})"
        ) from None


def check_interface(name) -> None:
    # Linux's rule for interface names: 1 to 15 characters, no whitespace, "/" or ":"
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[^\s/:]{1,15}", name)):
        raise ConfigError(f"--interface takes a network interface's name, like eth0 (got {name!r})")


def parse_address(text) -> tuple[str, int]:
    """("host", port) from "HOST:PORT" (an IPv6 host in brackets: "[::1]:29500"); ConfigError otherwise."""
    host, sep, port = str(text or "").rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (
        not sep
        or not host
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
        or any(c.isspace() for c in host)
    ):
        raise ConfigError(
            f"--coordinator takes HOST:PORT with a port from 1 to 65535 (got {text!r})"
        )
    return host, int(port)


# results.json's flat config keys of the fields whose names here drop the "node" they would repeat
FLAT_NAMES = {"count": "nodes", "rank": "node_rank", "loopback": "loopback_nodes"}


@dataclass(frozen=True)
class NodeSpec:
    """The nodes of one run, from this node's side."""

    count: int = 1
    rank: int = 0
    coordinator: str | None = None  # "HOST:PORT" where node 0 listens; needed when count > 1
    # the nodes are process groups on this host over 127.0.0.1 (simulated)
    loopback: bool = True
    # across hosts: the longest wait for the other nodes before a run (roll call)
    join_timeout: float = 300.0
    # Across hosts: how long a node may go unheard mid-run (no heartbeat: harness/nodes/watch.py) before the others
    # stop their workers and fail the run naming it; the engines' own timeouts are set from it too.
    peer_timeout: float = 30.0
    # This node's address as the other nodes reach it, and the interface that holds it, for the engines'
    # transports (gloo, NCCL, ps-lite), which would otherwise take whatever the host's name resolves to.
    local_addr: str | None = None
    interface: str | None = None

    @property
    def coordinator_address(self) -> tuple[str, int]:
        """(host, port) of node 0's rendezvous; validate() has checked the form."""
        return parse_address(self.coordinator)

    def validate(self) -> NodeSpec:
        if not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"--nodes must be at least 1 (got {self.count})")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.count:
            raise ConfigError(
                f"--node-rank must be between 0 and {self.count - 1} (got {self.rank})"
            )
        if self.count > 1 or self.coordinator is not None:
            parse_address(self.coordinator)
        check_join_timeout(self.join_timeout)
        check_peer_timeout(self.peer_timeout)
        check_local_addr(self.local_addr)
        check_interface(self.interface)
        return self

    def flat(self) -> dict:
        """Its fields by their names in results.json's config."""
        return {FLAT_NAMES.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_flat(cls, d: dict) -> NodeSpec:
        """From a flat config (results.json's, a worker's config file): the node keys it has."""
        named = {FLAT_NAMES.get(f.name, f.name): f.name for f in fields(cls)}
        return cls(**{name: d[key] for key, name in named.items() if key in d})

"""Several nodes: which nodes this harness runs, where they meet, and how they are launched.

A run on M nodes is M processes groups that each framework's engine joins into one job (torchrun's
rendezvous, jax.distributed's coordinator, MXNet's ps-lite scheduler), at the coordinator HOST:PORT.

* Loopback (no --node-rank): this harness starts all M nodes itself, as process groups on this host over
  127.0.0.1, each run at a fresh free port; the report says the nodes are simulated.
* Real hosts: the same command on every host, with --nodes M, --node-rank R and --coordinator HOST:PORT
  (node 0's host, reachable from all). Under Slurm (`srun`), the three come from SLURM_NTASKS, SLURM_PROCID
  and the first host of SLURM_NODELIST. Node 0's host writes the report; the other hosts keep their own
  logs and per-node results in their --out (their numbers are node 0's: every figure is reduced across ranks).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from common import network
from common.config import ConfigError, check_join_timeout, check_peer_timeout, parse_address
from harness.arguments import UsageError

# torchrun's default master port: open in most cluster firewalls for this purpose
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Topology:
    counts: tuple[int, ...] = (1,)  # node counts to run (a sweep, like --gpus)
    node_rank: int | None = None  # None: every node here, over loopback; else this host's node
    coordinator: str | None = None  # HOST:PORT of node 0 (None: a free loopback port per run)
    how: str = ""  # one line for the console and the report
    join_timeout: float = 300.0  # across hosts: the longest wait for the other nodes before a run
    # across hosts: the longest a node may go unheard mid-run (harness/nodes/watch.py)
    peer_timeout: float = 30.0
    # across hosts: this host's address and interface, if given (else found)
    local_addr: str | None = None
    interface: str | None = None

    @property
    def loopback(self) -> bool:
        return self.node_rank is None

    def runs_here(self, nodes: int) -> bool:
        """A host of rank R takes part in the runs on more than R nodes."""
        return self.loopback or self.node_rank < nodes


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[07-09,12],cpu01" -> "gpu07"."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m or not m.group(1):
        raise UsageError(
            f"cannot read the first host of SLURM_NODELIST={nodelist!r}; give --coordinator HOST:PORT"
        )
    prefix, ranges = m.group(1), m.group(2)
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--nodes takes a node count or a list like 1,2 (got {text!r})") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"--nodes must be at least 1 (got {text!r})")
    return tuple(counts)


def from_args(args, environ=os.environ) -> Topology:
    """The nodes asked for: the flags, else Slurm's variables (srun with one task per node), else one node."""
    try:  # a bad value is refused wherever it would not be used, too (one host: nobody to wait for)
        check_join_timeout(args.join_timeout)
        check_peer_timeout(args.peer_timeout)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    slurm = "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1") or 1) > 1
    if args.nodes is None and slurm and args.node_rank is None:
        host = first_slurm_host(
            environ.get("SLURM_NODELIST", environ.get("SLURM_JOB_NODELIST", ""))
        )
        coordinator = args.coordinator or f"{host}:{DEFAULT_PORT}"
        topology = Topology(
            (int(environ["SLURM_NTASKS"]),),
            int(environ["SLURM_PROCID"]),
            coordinator,
            f"Slurm: task {environ['SLURM_PROCID']} of {environ['SLURM_NTASKS']}, coordinator "
            f"{coordinator}",
        )
    else:
        counts = parse_counts(args.nodes) if args.nodes is not None else (1,)
        if args.node_rank is None:
            if args.coordinator:
                raise UsageError(
                    "--coordinator goes with --node-rank (one node per host); without --node-rank "
                    "every node runs here over 127.0.0.1 at a free port"
                )
            how = (
                ""
                if counts == (1,)
                else f"{max(counts)} nodes simulated on this host over 127.0.0.1"
            )
            refuse_host_flags_on_loopback(args)
            return Topology(counts, None, None, how)
        if not args.coordinator:
            raise UsageError(
                "--node-rank needs --coordinator HOST:PORT (node 0's host, reachable from every node)"
            )
        if len(counts) != 1:
            raise UsageError("--node-rank takes one --nodes count (every host runs the same runs)")
        topology = Topology(
            counts,
            args.node_rank,
            args.coordinator,
            f"node {args.node_rank} of {counts[0]}, coordinator {args.coordinator}",
        )
    if not 0 <= topology.node_rank < max(topology.counts):
        raise UsageError(
            f"--node-rank must be between 0 and {max(topology.counts) - 1} (got {topology.node_rank})"
        )
    try:
        parse_address(topology.coordinator)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return dataclasses.replace(
        topology, join_timeout=args.join_timeout, peer_timeout=args.peer_timeout, **this_host(args)
    )


def this_host(args) -> dict:
    """--local-addr and --interface, checked against this host's own (a typo fails here, not in an engine)."""
    given = {"local_addr": args.local_addr, "interface": args.interface}
    if args.interface is not None and network.interface_address(args.interface) is None:
        raise UsageError(
            f"--interface {args.interface}: this host has no such interface with an IPv4 address "
            f"(it has: {network.listed_interfaces()})"
        )
    if args.local_addr is not None and not network.is_local_address(args.local_addr):
        raise UsageError(
            f"--local-addr {args.local_addr} is not an address of this host (it has: "
            f"{network.listed_interfaces()})"
        )
    return given


def refuse_host_flags_on_loopback(args) -> None:
    """--interface and --local-addr name this host's place among hosts: loopback nodes all use 127.0.0.1."""
    for flag in ("interface", "local_addr"):
        if getattr(args, flag, None) is not None:
            raise UsageError(
                f"--{flag.replace('_', '-')} goes with runs across hosts (--node-rank, or Slurm); "
                "loopback nodes use 127.0.0.1"
            )

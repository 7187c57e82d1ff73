"""Several nodes: which nodes this harness runs, where they meet, and how they are launched.

A run on M nodes is M processes groups that each framework's engine joins into one job (torchrun's
rendezvous, jax.distributed's coordinator, MXNet's ps-lite scheduler), at the coordinator HOST:PORT.

* Loopback (no --node-rank): this harness starts all M nodes itself, as process groups on this host over
  127.0.0.1, each run at a fresh free port; the report says the nodes are simulated.
* Real hosts: the same command on every host, with --nodes M, --node-rank R and --coordinator HOST:PORT
  (node 0's host, reachable from all; torchrun's spellings --nnodes, --node_rank, --master-addr and --master-port
  are read too). Node 0's host writes the report; the other hosts keep their own logs and per-node results in
  their --out (their numbers are node 0's: every figure is reduced across ranks).
* Launchers (launched()): under Slurm (`srun`, one task per node) the three come from SLURM_NTASKS, SLURM_PROCID
  and the first host of SLURM_NODELIST, and the GPUs per node from SLURM_GPUS_ON_NODE; under torchrun's or
  Kubernetes' variables (a Kubeflow PyTorchJob: one pod per node) from WORLD_SIZE, RANK, MASTER_ADDR and
  MASTER_PORT. One task or process per GPU is refused in one line that names the variables and the fix: the
  harness is one process per node and starts that node's processes for its GPUs itself.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from common import network
from common.errors import ConfigError
from common.flags import flag, name_list, nonempty
from common.nodes import NodeSpec, check_join_timeout, check_peer_timeout, parse_address
from harness.errors import UsageError

# torchrun's default master port: open in most cluster firewalls for this purpose
DEFAULT_PORT = 29500
# across hosts: a host may be minutes late (building its environments on first use)
DEFAULT_JOIN_TIMEOUT = 300.0


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

    def spec(self, count: int) -> NodeSpec:
        """The nodes of one run on `count` of them, from this host's side. Loopback nodes are planned as node 0 at
        torchrun's default port; the runner gives each run a free port when it starts."""
        coordinator = self.coordinator
        if count == 1:
            coordinator = None
        elif self.loopback:
            coordinator = f"127.0.0.1:{DEFAULT_PORT}"
        return NodeSpec(
            count,
            0 if self.loopback else self.node_rank,
            coordinator,
            self.loopback,
            self.join_timeout,
            self.peer_timeout,
            self.local_addr,
            self.interface,
        )


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


@dataclass(frozen=True)
class NodeRequest:
    """The nodes a request asks for: --nodes, --node-rank, --coordinator (or torchrun's --master-addr and
    --master-port), this host's --local-addr and --interface, and the two timeouts (None: not given)."""

    nodes: str | None = field(
        default=None,
        metadata=flag(
            "nodes (hosts) x --gpus devices each: a count (2) or a sweep (1,2). Without --node-rank "
            "all nodes run on this host as process groups over 127.0.0.1 (simulated). Default: 1, "
            "or the launcher's: Slurm's task count under srun (one task per node), WORLD_SIZE where torchrun's "
            "or Kubernetes' variables are set (docs/nodes.md)",
            aliases=("--nnodes",),
            type=name_list,
            metavar="M",
        ),
    )
    node_rank: int | None = field(
        default=None,
        metadata=flag(
            "this host's node (0..M-1) of a run across hosts: run the same command on every host",
            aliases=("--node_rank",),
            type=int,
            metavar="R",
        ),
    )
    coordinator: str | None = field(
        default=None,
        metadata=flag(
            "with --node-rank: where node 0 listens (its engine's rendezvous), reachable from every "
            "host; under Slurm: the first host of the job, port 29500; under torchrun's or Kubernetes' "
            "variables: MASTER_ADDR:MASTER_PORT",
            type=nonempty,
            metavar="HOST:PORT",
        ),
    )
    master_addr: str | None = field(
        default=None,
        metadata=flag(
            "torchrun's spelling: --coordinator HOST:PORT with --master-port PORT (default 29500)",
            aliases=("--master_addr",),
            type=nonempty,
            metavar="HOST",
        ),
    )
    master_port: int | None = field(
        default=None,
        metadata=flag(
            "torchrun's spelling, with --master-addr",
            aliases=("--master_port",),
            type=int,
            metavar="PORT",
        ),
    )
    local_addr: str | None = field(
        default=None,
        metadata=flag(
            "across hosts: this host's address for the engines, instead of the one found",
            type=nonempty,
            metavar="ADDR",
        ),
    )
    interface: str | None = field(
        default=None,
        metadata=flag(
            "across hosts: the network interface this host's engines use (gloo, NCCL, ps-lite). "
            "Default: the one holding the address the other nodes reach this host at",
            type=nonempty,
            metavar="NAME",
        ),
    )
    join_timeout: float = field(
        default=DEFAULT_JOIN_TIMEOUT,
        metadata=flag(
            "across hosts: how long the nodes wait for each other before each run, after which "
            "the run fails naming the node that did not come (default: %(default)g)",
            type=float,
            metavar="S",
        ),
    )
    peer_timeout: float = field(
        default=NodeSpec.peer_timeout,
        metadata=flag(
            "across hosts: how long a node may go unheard mid-run (the harnesses exchange heartbeats) "
            "before every other host stops its workers and fails the run naming it; the engines' own "
            "timeouts are set from it (default: %(default)g)",
            type=float,
            metavar="S",
        ),
    )


def from_request(asked: NodeRequest, environ=os.environ) -> Topology:
    """The nodes asked for: the flags, else Slurm's variables (srun with one task per node), else one node."""
    try:  # a bad value is refused wherever it would not be used, too (one host: nobody to wait for)
        check_join_timeout(asked.join_timeout)
        check_peer_timeout(asked.peer_timeout)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    coordinator = coordinator_flag(asked)
    by_launcher = (
        launched(environ, coordinator) if asked.nodes is None and asked.node_rank is None else None
    )
    if by_launcher is not None:
        topology = by_launcher
    else:
        counts = parse_counts(asked.nodes) if asked.nodes is not None else (1,)
        if asked.node_rank is None:
            if coordinator:
                raise UsageError(
                    "--coordinator goes with --node-rank (one node per host); without --node-rank "
                    "every node runs here over 127.0.0.1 at a free port"
                )
            how = (
                ""
                if counts == (1,)
                else f"{max(counts)} nodes simulated on this host over 127.0.0.1"
            )
            refuse_host_flags_on_loopback(asked)
            return Topology(counts, None, None, how)
        if not coordinator:
            raise UsageError(
                "--node-rank needs --coordinator HOST:PORT (node 0's host, reachable from every node)"
            )
        if len(counts) != 1:
            raise UsageError("--node-rank takes one --nodes count (every host runs the same runs)")
        topology = Topology(
            counts,
            asked.node_rank,
            coordinator,
            f"node {asked.node_rank} of {counts[0]}, coordinator {coordinator}",
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
        topology,
        join_timeout=asked.join_timeout,
        peer_timeout=asked.peer_timeout,
        **this_host(asked),
    )


def coordinator_flag(asked: NodeRequest) -> str | None:
    """--coordinator HOST:PORT, or torchrun's --master-addr HOST with --master-port PORT (default 29500)."""
    addr, port = asked.master_addr, asked.master_port
    if addr is None and port is None:
        return asked.coordinator
    if asked.coordinator is not None:
        raise UsageError("give --coordinator HOST:PORT or --master-addr/--master-port, not both")
    if addr is None:
        raise UsageError("--master-port goes with --master-addr (node 0's host)")
    return f"{addr}:{DEFAULT_PORT if port is None else port}"


def launched(environ, coordinator: str | None) -> Topology | None:
    """The nodes a launcher's variables give (Slurm's, else torchrun's and Kubernetes'), or None where none says
    there are several: one node, as without a launcher. `coordinator` (the flag) overrides the launcher's."""
    if "SLURM_PROCID" in environ:
        return slurm_nodes(environ, coordinator)
    if "WORLD_SIZE" in environ or "MASTER_ADDR" in environ:
        return torchrun_nodes(environ, coordinator)
    return None


def whole_number(environ, name: str, default: int | None = None) -> int | None:
    """A launcher's variable read as a whole number (absent: `default`); anything else is refused in one line."""
    text = environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a whole number") from None
    if value < 0:
        raise UsageError(f"{name}={text!r} is negative")
    return value


def slurm_nodes(environ, coordinator: str | None) -> Topology | None:
    """srun with one task per node: SLURM_NTASKS nodes, this one SLURM_PROCID, meeting at the job's first host.
    Several tasks on a node (one per GPU) is refused: the harness starts a node's GPU processes itself."""
    tasks = whole_number(environ, "SLURM_NTASKS", 1)
    nodes = whole_number(
        environ, "SLURM_NNODES", whole_number(environ, "SLURM_JOB_NUM_NODES", tasks)
    )
    if tasks != nodes:
        raise UsageError(
            f"Slurm runs {tasks} tasks on {nodes} node(s) (SLURM_NTASKS={tasks}, SLURM_NNODES={nodes}): the "
            "harness is one task per node and starts the node's processes for its GPUs itself; launch it with "
            "`srun --ntasks-per-node=1` (#SBATCH --ntasks-per-node=1) and give the GPUs per node with --gpus "
            "(docs/nodes.md)"
        )
    if tasks <= 1:
        return None
    rank = whole_number(environ, "SLURM_PROCID")
    if rank >= tasks:
        raise UsageError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={tasks}")
    host = first_slurm_host(environ.get("SLURM_NODELIST", environ.get("SLURM_JOB_NODELIST", "")))
    coordinator = coordinator or f"{host}:{DEFAULT_PORT}"
    return Topology(
        (tasks,), rank, coordinator, f"Slurm: task {rank} of {tasks}, coordinator {coordinator}"
    )


def torchrun_nodes(environ, coordinator: str | None) -> Topology | None:
    """torchrun's and Kubernetes' variables with one process per node (a Kubeflow PyTorchJob's pods, an Indexed
    Job): WORLD_SIZE nodes, this one RANK, meeting at MASTER_ADDR:MASTER_PORT. Several processes on a node
    (LOCAL_WORLD_SIZE > 1: one per GPU) is refused: the harness starts a node's GPU processes itself."""
    world = whole_number(environ, "WORLD_SIZE", 1)
    local = whole_number(environ, "LOCAL_WORLD_SIZE", 1)
    if local > 1:
        raise UsageError(
            f"LOCAL_WORLD_SIZE={local}: the launcher starts a process per GPU, but the harness is one process "
            "per node and starts the node's processes for its GPUs itself; launch one process per node "
            "(torchrun --nproc-per-node=1, or a pod per node) and give the GPUs per node with --gpus "
            "(docs/nodes.md)"
        )
    if world <= 1:
        return None
    missing = [name for name in ("RANK", "MASTER_ADDR") if not environ.get(name)]
    if missing and not (coordinator and missing == ["MASTER_ADDR"]):
        raise UsageError(
            f"WORLD_SIZE={world} says {world} nodes, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: each node needs "
            "its RANK and node 0's MASTER_ADDR (and MASTER_PORT, default 29500)"
        )
    rank = whole_number(environ, "RANK")
    if rank >= world:
        raise UsageError(f"RANK={rank} is not below WORLD_SIZE={world}")
    port = whole_number(environ, "MASTER_PORT", DEFAULT_PORT)
    coordinator = coordinator or f"{environ['MASTER_ADDR']}:{port}"
    return Topology(
        (world,),
        rank,
        coordinator,
        f"WORLD_SIZE/RANK: node {rank} of {world}, coordinator {coordinator}",
    )


def launcher_gpus(environ=os.environ) -> int | None:
    """The GPUs per node a launcher gives this task: Slurm's SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE
    ("8", "h100:8"); None where it gives none."""
    if environ.get("SLURM_GPUS_ON_NODE"):
        return whole_number(environ, "SLURM_GPUS_ON_NODE") or None
    text = environ.get("SLURM_GPUS_PER_NODE", "")
    count = text.rsplit(":", 1)[-1] if text else ""
    return int(count) if count.isdigit() and int(count) > 0 else None


def this_host(asked: NodeRequest) -> dict:
    """--local-addr and --interface, checked against this host's own (a typo fails here, not in an engine)."""
    given = {"local_addr": asked.local_addr, "interface": asked.interface}
    if asked.interface is not None and network.interface_address(asked.interface) is None:
        raise UsageError(
            f"--interface {asked.interface}: this host has no such interface with an IPv4 address "
            f"(it has: {network.listed_interfaces()})"
        )
    if asked.local_addr is not None and not network.is_local_address(asked.local_addr):
        raise UsageError(
            f"--local-addr {asked.local_addr} is not an address of this host (it has: "
            f"{network.listed_interfaces()})"
        )
    return given


def refuse_host_flags_on_loopback(asked: NodeRequest) -> None:
    """--interface and --local-addr name this host's place among hosts: loopback nodes all use 127.0.0.1."""
    for name in ("interface", "local_addr"):
        if getattr(asked, name) is not None:
            raise UsageError(
                f"--{name.replace('_', '-')} goes with runs across hosts (--node-rank, or Slurm); "
                "loopback nodes use 127.0.0.1"
            )

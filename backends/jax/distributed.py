"""Several nodes in JAX: every node process joins jax.distributed at the coordinator (node 0 hosts its
service), once per process, before jax initialises a backend; the run's devices are then the first
cfg.local_devices devices of every process, in process order.

On the CPU the cross-process collectives are gloo's (XLA's CPU default has none), bound to the address the
harness found for this node (bind_transport); on GPUs, NCCL.
jax.distributed aborts the process (no exception) when it cannot register with the coordinator, so a node
first waits for the coordinator's port itself, bounded by the run's timeout, and fails with the address.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax._src import distributed as jax_distributed
from jax._src import xla_bridge
from jax._src.lib import _jax
from jax.experimental import multihost_utils

from backends.jax.parallel import devices
from common.errors import Unsupported
from common.network import wait_for_coordinator

ENGINE = "jax.distributed"

_joined: tuple | None = None  # (nodes, node_rank, coordinator, device kind) of this process's join


def topology(cfg) -> tuple:
    return cfg.nodes.count, cfg.nodes.rank, cfg.nodes.coordinator, cfg.device_kind


def transport(cfg) -> str:
    return "NCCL" if cfg.device_kind == "gpu" else "gloo"


def join(cfg) -> None:
    """The session's join (common/backend.py): jax.distributed as node cfg.nodes.rank of cfg.nodes.count, before
    anything asks jax for its devices (jax joins before its backends exist); nothing with one node. Once
    per process: the same topology again changes nothing, a different one is refused (jax joins once)."""
    global _joined
    if cfg.nodes.count == 1:
        refuse_a_joined_process(cfg)
        return
    if _joined is not None:
        if _joined != topology(cfg):
            raise RuntimeError(
                f"this process joined {ENGINE} as {_joined}; it cannot join again as {topology(cfg)}"
            )
        return
    if cfg.device_kind == "cpu":  # before any backend exists: XLA's CPU client is made with it
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Its SIGTERM handler notes a preemption and lets the process run on: a node the harness stops (its peer
    # failed, Ctrl-C) then waited for the SIGKILL that follows 5 s later. The run has no use for the notice.
    jax.config.update("jax_enable_preemption_service", False)
    timeout = max(1, int(cfg.timeout))
    if cfg.nodes.rank:
        wait_for_coordinator(*cfg.nodes.coordinator_address, timeout, f"{ENGINE} coordinator")
    jax.distributed.initialize(
        cfg.nodes.coordinator,
        num_processes=cfg.nodes.count,
        process_id=cfg.nodes.rank,
        local_device_ids=local_gpu_ids(cfg),
        initialization_timeout=timeout,
        # A peer that stops answering is declared dead (and this process stopped) after the run's engine bound
        # (twice --peer-timeout) instead of jax's default 100 s: a second line behind the harness's heartbeats.
        heartbeat_timeout_seconds=max(1, int(cfg.engine_timeout)),
    )
    bind_transport(cfg)
    _joined = topology(cfg)


def bind_transport(cfg) -> None:
    """The cross-process collectives bind to the address and interface the harness found for this node
    (cfg.nodes.local_addr, cfg.nodes.interface). jax builds its CPU client's gloo collectives with neither, so
    gloo takes whatever the host's name resolves to, often 127.0.0.1, which the other hosts cannot reach: the CPU
    backend's factory is registered again, before any backend exists, with collectives that have both.
    NCCL (GPUs) reads its interface from NCCL_SOCKET_IFNAME, unless the user set it."""
    if cfg.device_kind == "gpu":
        if cfg.nodes.interface:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", cfg.nodes.interface)
        return
    if not (cfg.nodes.local_addr or cfg.nodes.interface):
        return

    def cpu_client():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=jax_distributed.global_state.client,
            hostname=cfg.nodes.local_addr,
            interface=cfg.nodes.interface,
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


def local_gpu_ids(cfg) -> list[int] | None:
    """This node's GPUs: loopback nodes share the host's, node r taking [r*L, (r+1)*L); else the first L."""
    if cfg.device_kind != "gpu":
        return None
    return list(range(cfg.first_gpu, cfg.first_gpu + cfg.local_devices))


def leave(clean: bool = True) -> None:
    """Nothing to leave: jax's distributed runtime stays joined until the process ends (it cannot join again)."""


def launch(cfg, job, payload=None):
    """job(cfg, rank, payload) where every strategy runs (common/backend.py): in this process, one per node,
    on the devices the session joined."""
    return job(cfg, 0, payload)


def refuse_a_joined_process(cfg) -> None:
    """A process that joined several nodes cannot run on one: its devices are the job's."""
    if _joined is not None:
        raise RuntimeError(
            f"this process joined {ENGINE} as node {_joined[1]} of {_joined[0]}; "
            "a one-process run needs a process of its own"
        )


def run_devices(cfg) -> list:
    """The run's devices: the first cfg.devices of this process, or with several nodes (joined by the
    session) the first cfg.local_devices of every node's."""
    if cfg.nodes.count == 1:
        refuse_a_joined_process(cfg)
        return devices(cfg.devices, cfg.device_kind)
    if _joined != topology(cfg):
        raise RuntimeError(
            f"{ENGINE} is not joined as node {cfg.nodes.rank} of {cfg.nodes.count}: a run on several "
            "nodes runs inside the backend's session (join)"
        )
    return global_devices(cfg)


def global_devices(cfg) -> list:
    """The run's devices: the first cfg.local_devices of every process, ordered by process (so device
    i of the run holds shard i of the global batch, as on one node)."""
    platform = "gpu" if cfg.device_kind == "gpu" else "cpu"
    found = jax.devices(platform)
    chosen = []
    for process in range(cfg.nodes.count):
        own = [d for d in found if d.process_index == process]
        if len(own) < cfg.local_devices:
            raise Unsupported(
                f"{cfg.local_devices} {platform.upper()} devices per node requested, "
                f"node {process} has {len(own)}"
            )
        chosen += own[: cfg.local_devices]
    return chosen


def across_processes(values, reduce: str) -> np.ndarray:
    """Every process's float64 `values` reduced over the processes ("sum", added in process order, or
    "max"), the same on every process. They travel as their bits (uint32 words), so float32 arithmetic
    (jax_enable_x64 off) rounds nothing."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if jax.process_count() == 1:
        return values
    words = np.asarray(multihost_utils.process_allgather(values.view(np.uint32)))
    gathered = np.ascontiguousarray(words).view(np.float64)  # (processes, len(values))
    return gathered.max(axis=0) if reduce == "max" else gathered.sum(axis=0)

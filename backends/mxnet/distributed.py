"""Several nodes through MXNet's parameter server (ps-lite), started as mxnet's tools/launch.py does.

Every node process is a ps-lite worker; node 0 also starts the scheduler (at cfg.nodes.coordinator) and every
node starts one server, both child processes (`python -c "import mxnet"` with DMLC_ROLE set: mxnet's
kvstore_server module then runs the role until the workers stop it). They stay in the node's process
group, so whatever kills the node kills them; leave() ends them when the node is done.

ps-lite runs once per process: its settings (DMLC_*) are read when the first dist kvstore is made, and
in mxnet 1.9.1 only a process's first dist kvstore initialises keys on the servers (KVStoreDist::InitImpl
pushes for customer 0 only). So one "dist_sync" kvstore per process serves every trainer and probe
that runs in it, each through keyed(): its own prefix on string keys, so a new trainer's keys never
meet an earlier one's on the servers.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time

from backends.mxnet.compat import mx
from common.config import RunConfig
from common.network import wait_for_coordinator

KVSTORE = "dist_sync"
# how long a scheduler or server may take to exit by itself once the workers stopped it
SETTLE_S = 10.0

_node = None  # the process's Node, once joined


class Node:
    """This process's place in the run: the ps-lite children it started and the one dist kvstore."""

    def __init__(self, cfg: RunConfig):
        self.coordinator, self.nodes, self.rank = (
            cfg.nodes.coordinator,
            cfg.nodes.count,
            cfg.nodes.rank,
        )
        self.children: list[subprocess.Popen] = []
        self.kvstore = None
        self.uses = 0


def ps_environment(cfg: RunConfig, role: str) -> dict[str, str]:
    """The DMLC_* settings of a ps-lite process (tools/launch.py's): one server and one worker per node."""
    host, port = cfg.nodes.coordinator_address
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": host,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(cfg.nodes.count),
        "DMLC_NUM_WORKER": str(cfg.nodes.count),
        # ps-lite's heartbeats, off by default: the scheduler then notes a node dead after the run's engine
        # bound (twice --peer-timeout). It does not end a worker waiting on that node: the harness's heartbeats
        # (harness/nodes/watch.py) do. Every second: ps-lite's shutdown waits for the heartbeat's sleep to end,
        # which at a fifth of the bound (6 s) was most of a two-node run's exit.
        "PS_HEARTBEAT_INTERVAL": "1",
        "PS_HEARTBEAT_TIMEOUT": str(max(1, int(cfg.engine_timeout))),
    }
    # The address this node's ps-lite processes advertise: the one the harness found (loopback nodes:
    # 127.0.0.1), unless the user chose with ps-lite's own variables.
    address = cfg.nodes.local_addr or ("127.0.0.1" if cfg.nodes.loopback else None)
    if address and not ({"DMLC_NODE_HOST", "DMLC_INTERFACE"} & set(os.environ)):
        env["DMLC_NODE_HOST"] = address
    return env


def start_role(cfg: RunConfig, role: str) -> subprocess.Popen:
    """A scheduler or server: a python that imports mxnet with DMLC_ROLE set, in this process's group."""
    return subprocess.Popen(
        [sys.executable, "-c", "import mxnet"],
        env={**os.environ, **ps_environment(cfg, role)},
        stdout=subprocess.DEVNULL,
    )


def join(cfg: RunConfig) -> None:
    """Several nodes: the process's dist kvstore, started for the session (common/backend.py): the scheduler on
    node 0, a server on every node. One node: nothing. A process joins ps-lite once: a second run must name
    the same nodes."""
    global _node
    if cfg.nodes.count == 1:
        return
    if _node is not None:
        if (_node.coordinator, _node.nodes, _node.rank) != (
            cfg.nodes.coordinator,
            cfg.nodes.count,
            cfg.nodes.rank,
        ):
            raise RuntimeError(
                f"this process joined ps-lite at {_node.coordinator} as node {_node.rank} of "
                f"{_node.nodes}; ps-lite cannot join another run in the same process"
            )
        return
    _node = Node(cfg)
    atexit.register(leave)
    if cfg.nodes.rank == 0:
        _node.children.append(start_role(cfg, "scheduler"))
    _node.children.append(start_role(cfg, "server"))
    # ps-lite waits forever for an absent scheduler: a connection to it first, for --timeout at most
    wait_for_coordinator(
        *cfg.nodes.coordinator_address, cfg.timeout, "coordinator (ps-lite scheduler)"
    )
    os.environ.update(ps_environment(cfg, "worker"))
    _node.kvstore = mx.kv.create(KVSTORE)  # returns once every worker and server has joined


def keyed(cfg: RunConfig) -> KeyedKVStore:
    """A view of the process's dist kvstore (joined by the session) whose keys are its own (a fresh prefix per
    call)."""
    if _node is None or _node.kvstore is None:
        raise RuntimeError(
            "no dist kvstore: a run on several nodes runs inside the backend's session (join)"
        )
    _node.uses += 1
    return KeyedKVStore(_node.kvstore, f"u{_node.uses}:")


def leave(clean: bool = True) -> None:
    """The node is done. clean: free the kvstore (a barrier of every worker, then worker 0 stops the servers
    and the scheduler) and let the children exit; otherwise (a failure: the peers may be gone) drop the
    kvstore without its barrier. Either way no child outlives this call."""
    global _node
    node, _node = _node, None
    if node is None:
        return
    if node.kvstore is not None:
        if clean:  # now, not when the last view of it goes: the children exit only after it
            mx.base.check_call(mx.base._LIB.MXKVStoreFree(node.kvstore.handle))
        # unclean: never freed, its destructor would wait for the other workers
        node.kvstore.handle = None
    # Without a kvstore (the join failed) nothing tells the children to stop: they are not waited for.
    settles = clean and node.kvstore is not None
    deadline = time.monotonic() + (SETTLE_S if settles else 0)
    for child in node.children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def launch(cfg: RunConfig, job, payload=None):
    """job(cfg, rank, payload) where every strategy runs (common/backend.py): in this process, one per node,
    through the kvstore the session made."""
    return job(cfg, 0, payload)


class KeyedKVStore(mx.kv.KVStore):
    """The process's dist kvstore under a key prefix: int or str keys become "<prefix><key>" strings.
    gluon.Trainer keys its parameters 0..n-1 in every trainer; through this view each trainer has its own."""

    def __init__(self, kv, prefix: str):  # shares kv's handle; never frees it (kv owns it)
        self._kv, self._prefix = kv, prefix
        super().__init__(kv.handle)

    def __del__(self):
        pass

    def _key(self, key):
        return (
            [self._key(k) for k in key]
            if isinstance(key, (list, tuple))
            else f"{self._prefix}{key}"
        )

    def init(self, key, value):
        super().init(self._key(key), value)

    def broadcast(self, key, value, out, priority=0):
        super().broadcast(self._key(key), value, out, priority)

    def push(self, key, value, priority=0):
        super().push(self._key(key), value, priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        super().pull(self._key(key), out, priority, ignore_sparse)

    def pushpull(self, key, value, out=None, priority=0):
        super().pushpull(self._key(key), value, out, priority)

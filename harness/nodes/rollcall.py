"""Across hosts, the nodes meet before each run: a roll call at the coordinator's port, before any engine.

The engines' own joins fail badly when a host is absent or gives the wrong address. gloo (torch, jax and Keras
on the CPU) advertises whatever the host's name resolves to, which is often 127.0.0.1, and node 0 then waits
out --timeout; jax.distributed aborts the process. So the harness, framework-free, first takes a roll call:

* node 0 listens at the coordinator's port; every other node connects and says its rank, the node count and
  the run it is at (one JSON line). Node 0 answers each at once (an acknowledgement), and again once all are
  in, or with an error;
* a node that is absent, at another run, or sent by another command fails the run on every host with one
  line that names it, within --join-timeout;
* the meeting gives each node its address as the others reach it: the local end of its roll-call
  connection (on node 0, the end that node 1 reached). The engines bind their transports to it.

Node 0 then closes the port and its engine opens it; the other nodes' engines retry until it does. A
node that comes to the next roll call early may reach node 0's engine of the last run, still listening: a
reply that is not an acknowledgement sends it back to retry. Node 0 answers first and closes last, so the
other nodes' end of each connection keeps the TIME_WAIT, and the port is free at once for the engine.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from dataclasses import dataclass

from common.config import RunConfig
from common.network import RETRY_S, interface_address, interface_of
from harness.nodes import watch as watchlib

ACK_S = 5.0  # how long a node waits for node 0's acknowledgement before it tries again
LINE_BYTES = 4096  # the longest message read (a stray connection sends anything)
GOODBYE_S = 5.0  # how long node 0 waits for a node to close its end after the answer


class JoinError(Exception):
    """The nodes did not meet: the message is the run's one line."""


@dataclass(frozen=True)
class Meeting:
    address: str  # this node's address as the other nodes reach it
    peers: dict[int, str]  # node 0: every other node's address; other nodes: {0: node 0's}
    watch: watchlib.Watch | None = None  # the run's heartbeats (harness/nodes/watch.py), started


# Once the nodes failed to meet, the hosts are out of step (a host absent, or at another run): this harness's
# later runs across hosts fail at once with that line instead of each waiting out --join-timeout again.
_failed: str | None = None


def meet(cfg: RunConfig, run: str) -> Meeting:
    """The roll call of run `run` (its name, the same on every host), from node cfg.nodes.rank's side."""
    global _failed
    if _failed is not None:
        raise JoinError(f"not run: the nodes did not meet before an earlier run ({_failed})")
    host, port = cfg.nodes.coordinator_address
    wait = min(cfg.nodes.join_timeout, cfg.timeout)
    try:
        if cfg.nodes.rank == 0:
            meeting, server = _call_roll(port, cfg.nodes.count, run, wait)
            connections = watchlib.gather(server, cfg.nodes.count, run, ACK_S)
            missing = [r for r in range(1, cfg.nodes.count) if r not in connections]
            if missing:
                raise JoinError(
                    f"node 0: node {missing[0]} met, but did not reach node 0's watch port within "
                    f"{ACK_S:g} s (a firewall between the hosts?)"
                )
        else:
            meeting, watch_port = _answer_roll(
                host, port, cfg.nodes.rank, cfg.nodes.count, run, wait
            )
            connections = {0: _join_watch(host, watch_port, cfg.nodes.rank, run)}
    except JoinError as e:
        _failed = str(e)
        raise
    watch = watchlib.Watch(cfg.nodes.rank, run, connections, cfg.nodes.peer_timeout).start()
    return dataclasses.replace(meeting, watch=watch)


def _join_watch(host: str, port, rank: int, run: str):
    """Another node's watch connection to node 0, at the port its answer gave."""
    if not isinstance(port, int) or not 0 < port < 65536:
        raise JoinError(
            f"node {rank}: node 0's answer gave no watch port (a harness of another version?)"
        )
    try:
        return watchlib.join(host, port, rank, run, ACK_S)
    except OSError as e:
        raise JoinError(
            f"node {rank} met node 0 but cannot reach its watch port {host}:{port}: {e} (a firewall between "
            "the hosts?)"
        ) from None


def meet_and_tell(cfg: RunConfig, run: str, say) -> Meeting:
    """meet(), saying so: the wait, and (once per harness, unless it changes) where this host was placed."""
    say(
        f"Nodes: node {cfg.nodes.rank} of {cfg.nodes.count} meeting at {cfg.nodes.coordinator} before {run} "
        f"(at most {min(cfg.nodes.join_timeout, cfg.timeout):g} s, --join-timeout)"
    )
    meeting = meet(cfg, run)
    placed = addressed(cfg, meeting)
    peers = ", ".join(f"node {r} at {address}" for r, address in sorted(meeting.peers.items()))
    how = "given" if cfg.nodes.local_addr or cfg.nodes.interface else "as the others reach it"
    interface = (
        placed.nodes.interface or "no interface holds it as its first address: give --interface"
    )
    told = (
        f"Nodes: met {peers}; this host is {placed.nodes.local_addr} on {interface} ({how}; the engines' "
        "transports bind to it)"
    )
    if told not in _told:
        _told.add(told)
        say(told)
    return meeting


_told: set[str] = set()


def addressed(cfg: RunConfig, meeting: Meeting) -> RunConfig:
    """cfg with this node's address and interface for the engines: the user's (--local-addr, --interface),
    else the address the meeting found and the interface that holds it."""
    address = cfg.nodes.local_addr or (
        interface_address(cfg.nodes.interface) if cfg.nodes.interface else meeting.address
    )
    return cfg.with_nodes(
        local_addr=address, interface=cfg.nodes.interface or interface_of(address)
    )


# Node 0


def _call_roll(port: int, nodes: int, run: str, wait: float) -> tuple[Meeting, socket.socket]:
    deadline = time.monotonic() + wait
    try:
        server = socket.create_server(("", port))  # every address, as the engines listen
    except OSError as e:
        raise JoinError(
            f"node 0 cannot listen at port {port} for the other nodes: {e} "
            "(pick another --coordinator port)"
        ) from None
    joined: dict[int, socket.socket] = {}
    try:
        with server:
            while len(joined) < nodes - 1:
                if time.monotonic() >= deadline:
                    raise JoinError(_absent(nodes, joined, port, wait))
                server.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                _admit(conn, nodes, run, joined, deadline)
        meeting = Meeting(
            joined[1].getsockname()[0], {r: c.getpeername()[0] for r, c in joined.items()}
        )
        watch = watchlib.listen()  # before the answer: a node connects as soon as it has it
        for conn in joined.values():
            _send(conn, {"run": run, "met": True, "watch": watch.getsockname()[1]})
        _await_goodbyes(joined.values())
        return meeting, watch
    except JoinError as e:
        for conn in joined.values():
            _send(conn, {"run": run, "error": str(e)})
        raise
    finally:
        for conn in joined.values():
            conn.close()


def _admit(
    conn: socket.socket, nodes: int, run: str, joined: dict[int, socket.socket], deadline: float
) -> None:
    """Read a node's hello and acknowledge it, or refuse it: a stray connection (not one of ours) is closed
    and forgotten; a node of another run or node count fails the roll call (the hosts are out of step)."""
    hello = _read_message(conn, min(ACK_S, max(0.01, deadline - time.monotonic())))
    rank = hello.get("node") if hello else None
    if not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(hello.get("run"), str):
        conn.close()
        return
    if hello["run"] != run or hello.get("nodes") != nodes or not 1 <= rank < nodes:
        error = (
            f"node {rank} came to run {hello['run']!r} of {hello.get('nodes')} nodes, node 0 is at run "
            f"{run!r} of {nodes}: every host must run the same command, with its own --node-rank"
        )
        _send(conn, {"run": hello["run"], "error": error})
        conn.close()
        raise JoinError(error)
    earlier = joined.get(rank)
    if earlier is not None and not _closed(earlier):
        error = (
            f"two hosts came as node {rank} ({earlier.getpeername()[0]} and {conn.getpeername()[0]}): "
            "give each host its own --node-rank"
        )
        _send(conn, {"run": run, "error": error})
        conn.close()
        raise JoinError(error)
    if earlier is not None:
        earlier.close()  # the same node again, after it gave up on an acknowledgement
    joined[rank] = conn
    _send(conn, {"run": run, "joined": sorted(joined)})


def _absent(nodes: int, joined: dict[int, socket.socket], port: int, wait: float) -> str:
    missing = [r for r in range(1, nodes) if r not in joined]
    which = f"node {missing[0]}" if len(missing) == 1 else f"nodes {', '.join(map(str, missing))}"
    return (
        f"node 0: {which} of {nodes} did not join at port {port} within {wait:g} s (--join-timeout): start "
        f"the same command on {'its host' if len(missing) == 1 else 'their hosts'} with --node-rank "
        f"{', '.join(map(str, missing))} and this host's address as --coordinator"
    )


def _await_goodbyes(conns) -> None:
    """Each node closes its end first once it has the answer (so the TIME_WAIT is on its side)."""
    deadline = time.monotonic() + GOODBYE_S
    for conn in conns:
        try:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.recv(1)
        except OSError:
            pass


def _closed(conn: socket.socket) -> bool:
    """Whether the other end of `conn` has gone (an end of file, or an error, waiting to be read)."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.setblocking(True)


# The other nodes


def _answer_roll(
    host: str, port: int, rank: int, nodes: int, run: str, wait: float
) -> tuple[Meeting, int | None]:
    deadline = time.monotonic() + wait
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            conn = socket.create_connection(
                (host, port), timeout=max(0.01, min(ACK_S, deadline - time.monotonic()))
            )
        except OSError as e:
            last = str(e)
            time.sleep(RETRY_S)
            continue
        with conn:
            answer = _attend(conn, rank, nodes, run, deadline)
        if answer is not None:
            return answer
        last = "an answer that was not node 0's roll call (the port is still another program's?)"
        time.sleep(RETRY_S)
    raise JoinError(
        f"node {rank} could not meet node 0 at {host}:{port} within {wait:g} s (--join-timeout): {last}"
    )


def _attend(
    conn: socket.socket, rank: int, nodes: int, run: str, deadline: float
) -> tuple[Meeting, int | None] | None:
    """Say who this node is and wait for node 0's answer: the meeting and node 0's watch port; None if whoever
    listens is not node 0's roll call."""
    try:
        conn.sendall(json.dumps({"node": rank, "nodes": nodes, "run": run}).encode() + b"\n")
    except OSError:
        return None
    reader = conn.makefile("rb")
    ack = _read_message(conn, ACK_S, reader)
    if ack is None or (ack.get("run") != run and "error" not in ack):
        return None
    while "error" not in ack and not ack.get("met"):
        remaining = deadline - time.monotonic()
        answer = _read_message(conn, remaining, reader) if remaining > 0 else None
        if answer is None:
            raise JoinError(
                f"node {rank}: node 0 did not call the roll of run {run!r} within the wait "
                "(--join-timeout): another node did not join"
            )
        ack = answer
    if "error" in ack:
        raise JoinError(str(ack["error"]))
    return Meeting(conn.getsockname()[0], {0: conn.getpeername()[0]}), ack.get("watch")


# One JSON line each way


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # that node has gone: its own wait ends with its own line


def _read_message(conn: socket.socket, timeout: float, reader=None) -> dict | None:
    """One JSON object from one line of at most LINE_BYTES; None on silence, a closed end, or anything else."""
    try:
        conn.settimeout(max(0.01, timeout))
        line = (reader or conn.makefile("rb")).readline(LINE_BYTES)
        message = json.loads(line)
    except (OSError, ValueError):
        return None
    return message if isinstance(message, dict) else None

"""Across hosts, the nodes keep in touch for the whole run: a heartbeat both ways, without any framework.

Once a run has started, each host's harness sees only its own workers, and what happens when a peer host
disappears (a network cut, a killed harness) is left to each engine: gloo waits out its 30-minute timeout,
ps-lite waits on a dead worker forever. So, at the roll call (harness/nodes/rollcall.py), node 0 opens a watch port
of its own and every other node connects to it; for the whole run each side sends a heartbeat every
`beat_s(peer_timeout)` seconds, node 0 with the run's progress (its epoch and step). A node is lost when:

* its connection ends without a goodbye: its harness died (killed, or its host went down and came back);
* nothing came from it for --peer-timeout seconds: the network between the hosts is cut, or the host hangs.

The host that sees the loss stops its own workers and fails the run in one line that names the lost node,
its address and the run's last progress; node 0 also tells every other node, which does the same. A node
whose workers ended says goodbye first, so its peers do not take its leaving for a loss.
"""

from __future__ import annotations

import json
import socket
import threading
import time

# The longest message read: a heartbeat, a loss, a goodbye.
LINE_BYTES = 4096


def beat_s(peer_timeout: float) -> float:
    """How often a node says it is alive: every 2 s, or more often where five beats would not fit in the
    bound (one late beat must not be a loss)."""
    return min(2.0, peer_timeout / 5)


# Making the connections, at the roll call.


def listen() -> socket.socket:
    """Node 0's watch port: any free one, on every address (the roll call tells the others which)."""
    return socket.create_server(("", 0))


def gather(server: socket.socket, nodes: int, run: str, wait: float) -> dict[int, socket.socket]:
    """Node 0: the other nodes' watch connections, each introduced by its rank; those that came within
    `wait` seconds (a stray connection is closed)."""
    deadline = time.monotonic() + wait
    joined: dict[int, socket.socket] = {}
    with server:
        while len(joined) < nodes - 1 and time.monotonic() < deadline:
            server.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            hello = _hello(conn, max(0.01, deadline - time.monotonic()))
            rank = hello.get("node")
            if hello.get("run") != run or not isinstance(rank, int) or not 1 <= rank < nodes:
                conn.close()
                continue
            joined[rank] = conn
    return joined


def join(host: str, port: int, rank: int, run: str, wait: float) -> socket.socket:
    """Another node: its watch connection to node 0 (OSError if node 0 cannot be reached within `wait`)."""
    conn = socket.create_connection((host, port), timeout=wait)
    conn.sendall(json.dumps({"node": rank, "run": run}).encode() + b"\n")
    return conn


def _hello(conn: socket.socket, timeout: float) -> dict:
    try:
        conn.settimeout(timeout)
        message = json.loads(conn.makefile("rb").readline(LINE_BYTES))
    except (OSError, ValueError):
        return {}
    return message if isinstance(message, dict) else {}


class PeerLost(Exception):
    """A peer host was lost mid-run: the message is the run's one line."""


class Watch:
    """This host's side of a run's heartbeats: node 0 holds one connection per other node, another node one
    to node 0. `lost()` is None while every peer is in touch, then the line that says which was lost."""

    def __init__(
        self,
        rank: int,
        run: str,
        connections: dict[int, socket.socket],
        peer_timeout: float,
    ):
        self.rank, self.run, self.peer_timeout = rank, run, peer_timeout
        self.connections = connections
        self.addresses = {r: _peer_address(c) for r, c in connections.items()}
        self.progress = ""  # the run's last progress: node 0's own, or what node 0 last sent
        self.done: set[int] = set()  # peers that said goodbye
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._send_lock = threading.Lock()

    def start(self) -> Watch:
        for rank, conn in self.connections.items():
            threading.Thread(target=self._listen, args=(rank, conn), daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()
        return self

    def lost(self) -> str | None:
        return self._lost

    def report(self, record: dict) -> None:
        """Node 0: the run's progress, a progress record of its worker (common/progress.py), sent with each
        beat."""
        epoch, epochs = record.get("epoch"), record.get("epochs")
        if record.get("event") in ("step", "epoch") and epoch is not None:
            step = f", step {record['step']}/{record['steps']}" if "step" in record else " done"
            self.progress = f"epoch {epoch}/{epochs}{step}"
        elif record.get("event") == "warmup":
            self.progress = "after the warm-up step"
        if record.get("event") in (
            "warmup",
            "epoch",
        ):  # news the others get now, not at the next beat
            self._send_all(self._beat_message())

    def finish(self) -> None:
        """This host's workers ended: say goodbye, stop beating, close."""
        self._stop.set()
        self._send_all({"run": self.run, "done": True})
        for conn in self.connections.values():
            try:
                conn.shutdown(socket.SHUT_RDWR)  # now: the listener's reader holds the socket open
                conn.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ inside

    def _beat(self) -> None:
        while not self._stop.wait(beat_s(self.peer_timeout)):
            self._send_all(self._beat_message())

    def _beat_message(self) -> dict:
        return {"run": self.run, "beat": time.time(), "progress": self.progress}

    def _listen(self, rank: int, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        conn.settimeout(self.peer_timeout)
        while not self._stop.is_set():
            try:
                line = reader.readline(LINE_BYTES)
            except TimeoutError:
                self._lose(
                    rank,
                    f"no heartbeat for {self.peer_timeout:g} s (--peer-timeout): the network "
                    "between the hosts is cut, or that host stopped",
                )
                return
            except OSError as e:
                line, why = b"", str(e)
            else:
                why = ""
            if not line:
                if rank not in self.done and not self._stop.is_set():
                    self._lose(
                        rank,
                        "its harness ended without a goodbye (killed, or its host went down)"
                        + (f": {why}" if why else ""),
                    )
                return
            self._heard(rank, line)

    def _heard(self, rank: int, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("done"):
            self.done.add(rank)
        if isinstance(message.get("progress"), str) and rank == 0 and message["progress"]:
            self.progress = message["progress"][:200]
        if isinstance(message.get("lost"), str):  # node 0 lost another node: this host stops too
            self._set_lost(message["lost"][:1000])

    def _lose(self, rank: int, why: str) -> None:
        where = f" ({self.addresses[rank]})" if self.addresses.get(rank) else ""
        at = f"; the run was at {self.progress}" if self.progress else ""
        line = f"node {rank}{where} lost mid-run: {why}{at}"
        if self._set_lost(line) and self.rank == 0:
            self._send_all({"run": self.run, "lost": line})

    def _set_lost(self, line: str) -> bool:
        """Record the first loss; True if this was it."""
        with self._lock:
            if self._lost is not None:
                return False
            self._lost = line
            return True

    def _send_all(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\n"
        with self._send_lock:
            for rank, conn in self.connections.items():
                if rank in self.done:
                    continue
                try:
                    conn.sendall(data)
                except OSError:
                    pass  # its listener says what happened


def _peer_address(conn: socket.socket) -> str | None:
    try:
        return conn.getpeername()[0]
    except OSError:
        return None

"""The nodes' roll call before a run across hosts (harness/nodes/rollcall.py), over 127.0.0.1: framework-free."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.config import RunConfig
from common.network import free_port
from common.nodes import NodeSpec
from harness.nodes import rollcall
from harness.processes import runner
from tests.harness.helpers import fake_python


@pytest.fixture(autouse=True)
def fresh_harness(monkeypatch):
    """Each test is a fresh harness: no earlier failed meeting."""
    monkeypatch.setattr(rollcall, "_failed", None)
    monkeypatch.setattr(rollcall, "ACK_S", 1.0)


def node(rank: int, nodes: int, port: int, wait: float = 5.0, **extra) -> RunConfig:
    return RunConfig(
        backend="torch",
        strategy="ddp",
        devices=nodes,
        batch_size=6 * nodes,
        nodes=NodeSpec(nodes, rank, f"127.0.0.1:{port}", loopback=False, join_timeout=wait),
        **extra,
    ).validate()


def meet_all(configs: list[RunConfig], runs: list[str]) -> list:
    """Every node's meeting (or the JoinError it raised), the nodes meeting at once from threads."""

    def attend(cfg, run):
        try:
            return rollcall.meet(cfg, run)
        except rollcall.JoinError as e:
            return e

    with ThreadPoolExecutor(len(configs)) as pool:
        return list(pool.map(attend, configs, runs))


def test_the_nodes_meet_and_each_learns_its_address():
    port = free_port()
    zero, one, two = meet_all([node(r, 3, port) for r in range(3)], ["torch-ddp-x3-3nodes"] * 3)
    assert (zero.address, zero.peers) == ("127.0.0.1", {1: "127.0.0.1", 2: "127.0.0.1"})
    assert (one.address, one.peers) == (two.address, two.peers) == ("127.0.0.1", {0: "127.0.0.1"})
    # and each keeps in touch with node 0 for the run (harness/nodes/watch.py): node 0 with both others
    assert sorted(zero.watch.connections) == [1, 2] and list(one.watch.connections) == [0]
    for meeting in (zero, one, two):
        meeting.watch.finish()
    placed = rollcall.addressed(node(1, 3, port), one)
    assert (placed.nodes.local_addr, placed.nodes.interface) == ("127.0.0.1", "lo")


def test_an_absent_node_fails_the_meeting_on_every_host_naming_it():
    port = free_port()
    started = time.monotonic()
    zero, one = meet_all([node(0, 3, port, wait=1.5), node(1, 3, port, wait=30)], ["run-a"] * 2)
    expected = (
        "node 0: node 2 of 3 did not join at port {} within 1.5 s (--join-timeout): start the same command "
        "on its host with --node-rank 2 and this host's address as --coordinator"
    ).format(port)
    assert str(zero) == str(one) == expected
    # node 1 heard it from node 0, not from its own 30 s wait
    assert time.monotonic() - started < 25
    with pytest.raises(
        rollcall.JoinError,
        match=r"^not run: the nodes did not meet before an earlier run \(node 0: ",
    ):
        rollcall.meet(node(0, 3, port, wait=30), "run-b")  # at once: the hosts are out of step


def test_a_node_without_node_0_fails_naming_the_address():
    port = free_port()
    with pytest.raises(rollcall.JoinError) as caught:
        rollcall.meet(node(1, 2, port, wait=1.0), "run-a")
    expected = f"node 1 could not meet node 0 at 127.0.0.1:{port} within 1 s (--join-timeout): "
    assert str(caught.value).startswith(expected)


def test_hosts_at_different_runs_both_fail_naming_both_runs():
    port = free_port()
    zero, one = meet_all(
        [node(0, 2, port), node(1, 2, port)], ["torch-ddp-x2-2nodes", "jax-pmap-x2-2nodes"]
    )
    assert (
        str(zero)
        == str(one)
        == (
            "node 1 came to run 'jax-pmap-x2-2nodes' of 2 nodes, node 0 is at run "
            "'torch-ddp-x2-2nodes' of 2: every host must run the same command, with its "
            "own --node-rank"
        )
    )


def test_two_hosts_as_the_same_node_fail_the_meeting():
    port = free_port()
    zero, one, again = meet_all(
        [node(0, 3, port), node(1, 3, port), node(1, 3, port)], ["run-a"] * 3
    )
    assert (
        str(zero)
        == str(one)
        == str(again)
        == (
            "two hosts came as node 1 (127.0.0.1 and 127.0.0.1): give each host its own --node-rank"
        )
    )


def test_a_stray_connection_is_ignored_and_a_port_held_by_another_program_is_retried():
    port = free_port()
    # another program on the port: answers garbage
    impostor = socket.create_server(("127.0.0.1", port))

    def answer_garbage_then_leave():
        for _ in range(2):
            conn, _ = impostor.accept()
            conn.sendall(b"\x00\x01 not a roll call\n")
            conn.close()
        impostor.close()

    threading.Thread(target=answer_garbage_then_leave, daemon=True).start()
    one = ThreadPoolExecutor(1).submit(rollcall.meet, node(1, 2, port, wait=20), "run-a")
    deadline = time.monotonic() + 10
    while impostor.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stray = ThreadPoolExecutor(1).submit(_stray_visit, port)
    zero = rollcall.meet(node(0, 2, port, wait=20), "run-a")
    assert zero.peers == {1: "127.0.0.1"} and one.result(timeout=20).peers == {0: "127.0.0.1"}
    stray.result(timeout=20)


def _stray_visit(port: int) -> None:
    """A connection that is not a node: it sends a line that is not a roll call, then goes."""
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                return
        except OSError:
            time.sleep(0.05)


def test_a_host_whose_peer_never_starts_fails_the_run_in_one_line_without_a_worker(tmp_path):
    marker = tmp_path / "worker-started"
    python = fake_python(tmp_path, f"touch {marker}; exit 1")
    cfg = node(0, 2, free_port(), wait=1.0, model="lenet")
    with open(os.devnull, "w") as quiet:
        result = runner.run(
            cfg, python, tmp_path / "work", runner.Console(quiet=True, stream=quiet)
        )
    assert result["status"] == "failed"
    assert result["error"].startswith("node 0: node 1 of 2 did not join at port ")
    assert len(result["error"].splitlines()) == 1 and not marker.exists()

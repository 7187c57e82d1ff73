"""Across hosts, a host lost mid-run fails the run on every other host within --peer-timeout, in one line that
names it (harness/nodes/watch.py): the heartbeats on their own, then two harnesses over 127.0.0.1 with workers that
train forever (no framework), one of them killed or stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from common.network import free_port
from harness.nodes import watch as watchlib
from tests.harness.helpers import ROOT, fake_python

PEER_TIMEOUT = 3.0
# a stated margin over the bound, for a loaded CI host: the tests bound, they do not time
MARGIN_S = 10.0


def watch_pair(peer_timeout: float = PEER_TIMEOUT) -> tuple[watchlib.Watch, watchlib.Watch]:
    """Node 0's and node 1's watches of one run, connected over 127.0.0.1 as the roll call connects them."""
    server = watchlib.listen()
    port = server.getsockname()[1]
    conn = watchlib.join("127.0.0.1", port, 1, "run-a", 5.0)
    gathered = watchlib.gather(server, 2, "run-a", 5.0)
    zero = watchlib.Watch(0, "run-a", gathered, peer_timeout).start()
    one = watchlib.Watch(1, "run-a", {0: conn}, peer_timeout).start()
    return zero, one


def wait_for(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


def test_peers_in_touch_lose_nobody_and_a_goodbye_is_not_a_loss():
    zero, one = watch_pair()
    zero.report({"event": "step", "epoch": 1, "epochs": 2, "step": 3, "steps": 8})
    assert wait_for(lambda: one.progress, 2 * PEER_TIMEOUT) == "epoch 1/2, step 3/8"
    assert zero.lost() is None and one.lost() is None
    one.finish()
    time.sleep(PEER_TIMEOUT + 1)  # node 1's end is closed, after its goodbye
    assert zero.lost() is None
    zero.finish()


def test_a_node_that_goes_away_without_a_goodbye_is_lost_at_once_with_its_address():
    zero, one = watch_pair()
    zero.report({"event": "epoch", "epoch": 1, "epochs": 2})
    wait_for(lambda: one.progress, 2 * PEER_TIMEOUT)
    for conn in one.connections.values():  # as a killed harness's kernel closes them, no goodbye
        conn.shutdown(socket.SHUT_RDWR)
    line = wait_for(zero.lost, 2.0)  # well within the bound: an end of file is news at once
    assert line == (
        "node 1 (127.0.0.1) lost mid-run: its harness ended without a goodbye (killed, or its host "
        "went down); the run was at epoch 1/2 done"
    )
    zero.finish()


def test_a_silent_node_is_lost_after_the_bound_and_node_0_tells_the_others():
    server = watchlib.listen()
    port = server.getsockname()[1]
    silent = watchlib.join("127.0.0.1", port, 1, "run-a", 5.0)  # connected, then never beats
    other = watchlib.join("127.0.0.1", port, 2, "run-a", 5.0)
    zero = watchlib.Watch(0, "run-a", watchlib.gather(server, 3, "run-a", 5.0), PEER_TIMEOUT)
    two = watchlib.Watch(2, "run-a", {0: other}, PEER_TIMEOUT).start()
    zero.start()
    line = wait_for(zero.lost, PEER_TIMEOUT + MARGIN_S)
    assert line.startswith("node 1 (127.0.0.1) lost mid-run: no heartbeat for 3 s (--peer-timeout)")
    assert wait_for(two.lost, MARGIN_S) == line  # node 2 stops with node 0's line
    silent.close()
    zero.finish()
    two.finish()


def test_node_0_takes_only_its_runs_nodes_at_its_watch_port():
    server = watchlib.listen()
    port = server.getsockname()[1]
    stray = socket.create_connection(("127.0.0.1", port))
    stray.sendall(b"GET / HTTP/1.0\n")
    other_run = watchlib.join("127.0.0.1", port, 1, "run-b", 5.0)
    ours = watchlib.join("127.0.0.1", port, 1, "run-a", 5.0)
    gathered = watchlib.gather(server, 2, "run-a", 5.0)
    assert list(gathered) == [1] and gathered[1].getpeername() == ours.getsockname()
    for conn in (stray, other_run, ours, *gathered.values()):
        conn.close()


# Two harnesses as two hosts over 127.0.0.1, their workers training forever (a worker's progress lines, then
# a sleep), one of them killed or stopped mid-run.
FOREVER_WORKER = """
import json, sys, time
cfg = json.load(open(sys.argv[sys.argv.index('--config') + 1]))
print('@dpbench ' + json.dumps({"event": "warmup", "seconds": 0.1}), flush=True)
print('@dpbench ' + json.dumps({"event": "step", "epoch": 1, "epochs": 1, "step": 2, "steps": 4}), flush=True)
time.sleep(600)
"""


def start_node(tmp_path, rank: int, port: int) -> tuple[subprocess.Popen, object]:
    script = tmp_path / "worker.py"
    script.write_text(FOREVER_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    out = tmp_path / f"reports{rank}"
    log = open(tmp_path / f"node{rank}.log", "w")
    args = [
        *("--backend", "torch", "--strategy", "ddp", "--model", "lenet", "--gpus", "1"),
        *("--device", "cpu", "--dataset", "synthetic", "--train-size", "64", "--test-size", "32"),
        *("--epochs", "1", "--no-check", "--timed-steps", "0", "--python", f"torch={python}"),
        *("--nodes", "2", "--node-rank", str(rank), "--coordinator", f"127.0.0.1:{port}"),
        *("--peer-timeout", str(PEER_TIMEOUT), "--join-timeout", "60", "--out", str(out)),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, out


def the_run(out) -> dict:
    (results,) = out.glob("*/results.json")
    (row,) = json.loads(results.read_text())["runs"]
    return row


def left_running(marker) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize(
    "lost, fault, why",
    [
        (1, signal.SIGKILL, "its harness ended without a goodbye"),
        (0, signal.SIGKILL, "its harness ended without a goodbye"),
        (1, signal.SIGSTOP, "no heartbeat for 3 s"),
    ],
)
def test_a_host_lost_mid_run_ends_the_others_within_the_bound_naming_it(tmp_path, lost, fault, why):
    """A host's harness killed (its connections end) or stopped (silent, as behind a cut link): the other host
    stops its worker and fails the run within --peer-timeout and a margin, naming the lost node; its report is
    written and nothing of it is left running."""
    port = free_port()
    nodes = [start_node(tmp_path, rank, port) for rank in (0, 1)]
    survivor, (victim, _) = nodes[1 - lost], nodes[lost]
    log = tmp_path / f"node{1 - lost}.log"
    assert wait_for(lambda: "lost" not in log.read_text() and "met node" in log.read_text(), 60)
    time.sleep(1.0)  # the workers are training
    os.killpg(victim.pid, fault)
    started = time.monotonic()
    try:
        code = survivor[0].wait(timeout=PEER_TIMEOUT + MARGIN_S)
    finally:
        ended = time.monotonic() - started
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    assert code == 1 and ended <= PEER_TIMEOUT + MARGIN_S
    row = the_run(survivor[1])
    assert row["status"] == "failed"
    assert row["error"].startswith(f"node {lost} (127.0.0.1) lost mid-run: {why}")
    assert "the run was at epoch 1/1, step 2/4" in row["error"]
    # (the victim's fake worker has no lifeline to die by, as a real worker does: removed here)
    subprocess.run(["pkill", "-9", "-f", str(tmp_path / f"reports{lost}")])
    assert wait_for(lambda: not left_running(survivor[1]), 15), left_running(survivor[1])


def test_a_worker_dead_in_native_code_is_headlined_by_the_line_that_says_what_happened():
    """jax's coordination service aborting a process: its output ends in absl's stack frames, which were the
    report's headline ("failed:     @     0x7f930e6a71f5  (unknown)")."""
    from harness.processes.runner import readable_cause

    output = [
        "UserWarning: an error-shaped warning is no cause\n",
        "E1126 01:02:03.456 coordination_service_agent.cc:332] Polled an error from coordination service: "
        "UNAVAILABLE: failed to connect to all addresses\n",
        "F1126 01:02:03.457 client.h:77] Terminating process because the JAX distributed service detected "
        "fatal errors.\n",
        "*** Check failure stack trace: ***\n",
        "    @     0x7f930e6a71f5  (unknown)\n",
        "    @     0x7f930e6a0a37  (unknown)\n",
    ]
    assert readable_cause(output) == "\ncause: " + output[1].strip()
    assert readable_cause(["    @     0x7f930e6a71f5  (unknown)\n"]) == ""

"""Across hosts for real, in every backend's environment: the README's recipe, one harness per host, each
host with an address of its own (two network namespaces, tests/backends/hosts.py), for each engine a
strategy runs its nodes with. The machine's own name may resolve to 127.0.0.1 (as here, and on many hosts): the engines
must bind to the address the hosts reach each other at, which the harness finds at the nodes' roll call.

The trained weights must be those of the same run on loopback nodes and in one process with 2 devices:
the same batches, initial weights and steps, with one allreduce of two shards per step. Every run has one
thread per process, so a shard's arithmetic is the same in each; and a sum of two is the same in either
order. So the three are compared bit for bit: any difference is a different computation, not rounding.

A backend whose nodes meet through another's engine (Keras's ddp: torch's launcher and process group) is proven in
that backend's suite. Both tests run once per engine, with its first strategy (jax's pmap and sharding share
jax.distributed): what crosses hosts is the engine's (its coordinator, the address it binds, its collectives), and
what ends a run that lost a host is the harness's heartbeats and the engine's own timeouts, not the strategy. Each
other strategy of an engine is proven on that engine's loopback nodes, bit for bit against one process
(test_contract.py's test_two_nodes_take_the_steps_of_one_process_and_of_one_device)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from common import manifest
from common import weights as weightslib
from tests.backends.conftest import NAME
from tests.backends.hosts import run_row, small_run, start_harness, two_hosts, wait_all

STRATEGIES = manifest.load(NAME).strategies if NAME else {}
# those whose nodes meet through another backend's engine (backend.toml's `engine_backend`) are proven in its suite
BORROWED = {s.engine_backend for s in STRATEGIES.values() if s.engine_backend}
ENGINE_STRATEGIES = [name for name, s in STRATEGIES.items() if s.engine and not s.engine_backend]
pytestmark = pytest.mark.skipif(
    bool(BORROWED) and not ENGINE_STRATEGIES,
    reason=f"{NAME}'s nodes meet through {', '.join(sorted(BORROWED))}'s engine, proven in its suite",
)
# the first strategy of each engine
ONE_PER_ENGINE = list(
    {STRATEGIES[name].engine: name for name in reversed(ENGINE_STRATEGIES)}.values()
)
PORT = 29500  # each namespace has its own ports: nothing else listens there
WAIT_S = 420


def start_both(hosts, tmp_path: Path, strategy: str, *extra: str, quiet: bool = True):
    """A harness on each host, node 0 and node 1 of one small run of `strategy` across them:
    (report folders, logs, processes)."""
    outs = [tmp_path / f"host-{r}" for r in range(2)]
    logs = [tmp_path / f"host-{r}.log" for r in range(2)]
    procs = []
    for rank, (host, out, log) in enumerate(zip(hosts, outs, logs)):
        out.mkdir()
        args = small_run(NAME, strategy, out)
        if not quiet:
            args.remove("--quiet")
        nodes = ("--nodes", "2", "--gpus", "1", "--node-rank", str(rank))
        meet = ("--coordinator", f"{hosts[0].address}:{PORT}", "--join-timeout", "120")
        procs.append(start_harness(host, [*args, *nodes, *meet, *extra], log))
    return outs, logs, procs


def run_here(tmp_path: Path, name: str, strategy: str, *extra: str) -> tuple[dict, dict]:
    """The same run on this host (loopback nodes, or one process): its trained weights and its row."""
    out = tmp_path / name
    out.mkdir()
    log = tmp_path / f"{name}.log"
    proc = start_harness(None, small_run(NAME, strategy, out, *extra), log)
    assert wait_all([proc], [log], WAIT_S) == [0], log.read_text()[-3000:]
    return weightslib.load(out / "weights.npz"), run_row(out)


@pytest.mark.parametrize("engine_strategy", ONE_PER_ENGINE)
def test_two_hosts_train_the_same_weights_as_loopback_nodes_and_one_process(
    backend, engine_strategy, tmp_path
):
    with two_hosts(NAME) as hosts:
        outs, logs, procs = start_both(hosts, tmp_path, engine_strategy)
        codes = wait_all(procs, logs, WAIT_S)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    coordinator = f"{hosts[0].address}:{PORT}"
    for host, out, log in zip(hosts, outs, logs):
        row = run_row(out)
        assert (row["config"]["local_addr"], row["config"]["interface"]) == (
            host.address,
            host.interface,
        )
        assert f"this host is {host.address} on {host.interface}" in log.read_text()
        # where the engine met, recorded
        assert coordinator in json.dumps(row["environment"]["details"])
    across_hosts = weightslib.load(outs[0] / "weights.npz")
    loopback, row = run_here(
        tmp_path, "loopback", engine_strategy, "--nodes", "2", "--gpus", "1", "--timed-steps", "2"
    )
    one_process, _ = run_here(tmp_path, "one-process", engine_strategy, "--gpus", "2")
    # The loopback run's record: its nodes, every process of the job, the timed steps across the nodes.
    environment = row["environment"]
    assert (
        environment["nodes"] == 2
        and environment["processes"] >= 2
        and environment["loopback_nodes"]
    )
    assert row["step_time"]["steps"] == 2 and math.isfinite(row["epochs"][0]["train_loss"])
    moved = [
        name
        for name, w in backend.initial_weights("lenet", 0).items()
        if across_hosts[name].tobytes() != w.tobytes()
    ]
    assert moved, "the run did not train"
    for name in across_hosts:
        assert across_hosts[name].tobytes() == loopback[name].tobytes(), (
            f"{name}: hosts vs loopback nodes"
        )
        assert across_hosts[name].tobytes() == one_process[name].tobytes(), (
            f"{name}: hosts vs 1 process"
        )


# ------------------------------------------------------------------------------ a host lost mid-run

PEER_TIMEOUT = 5  # short in tests: CI time
# the stated margin over the bound: the survivor stops its workers and writes its report
MARGIN_S = 30


def cut_link(host) -> None:
    """The host's network gone: its end of the link down (the other host sees silence, not a closed end)."""
    subprocess.run(["ip", "-n", host.namespace, "link", "set", host.interface, "down"], check=True)


def kill_harness(proc) -> None:
    """The host's harness killed, as by the OOM killer or a crash: its workers follow it (their lifeline)."""
    os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("fault", ["link cut", "harness killed"])
@pytest.mark.parametrize("engine_strategy", ONE_PER_ENGINE)
def test_a_host_lost_mid_run_ends_the_other_within_the_bound_naming_it(
    engine_strategy, fault, tmp_path
):
    """Host b lost mid-epoch (its link cut, or its harness killed): every surviving host ends within
    --peer-timeout and a margin, in one line naming node 1 and its address, with its report written, and
    nothing of the run left running."""
    with two_hosts(NAME) as hosts:
        outs, logs, procs = start_both(
            hosts,
            tmp_path,
            engine_strategy,
            *("--epochs", "400", "--peer-timeout", str(PEER_TIMEOUT)),
            quiet=False,  # the epochs' lines: the fault comes once training is under way
        )
        assert wait_until(lambda: "epoch 2/400" in logs[0].read_text(), WAIT_S), logs[0].read_text()
        time.sleep(1.0)  # node 1 has heard of that epoch
        cut_link(hosts[1]) if fault == "link cut" else kill_harness(procs[1])
        started = time.monotonic()
        survivors = procs if fault == "link cut" else procs[:1]
        codes = wait_all(survivors, logs, PEER_TIMEOUT + MARGIN_S)
        ended = time.monotonic() - started
        if fault == "harness killed":
            procs[1].wait()
    assert codes == [1] * len(survivors) and ended <= PEER_TIMEOUT + MARGIN_S
    for rank, out in enumerate(outs[: len(survivors)]):
        headline = run_row(out)["error"].splitlines()[
            -1
        ]  # (the engine's own words may come before it)
        lost = 1 - rank
        assert headline.startswith(f"node {lost} ({hosts[lost].address}) lost mid-run: "), headline
        assert "the run was at epoch" in headline
    assert wait_until(lambda: not running(tmp_path), 15), running(tmp_path)


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def running(marker) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True)
    return found.stdout.split()

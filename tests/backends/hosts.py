"""Two hosts on this machine, for the across-hosts tests: two network namespaces joined by a veth pair, each
with an address of its own (10.199.0.1 and .2) and a name (its namespace's), so that a harness in each meets
the other as it would on two hosts. Their traffic stays between the two namespaces. Made with `ip`, as
root; where that is not possible, the test is skipped with the reason. Everything made is removed on the
way out."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.processes.envs import worker_env

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.199.0"


@dataclass(frozen=True)
class Host:
    namespace: str
    interface: str
    address: str


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_hosts(tag: str):
    """(host a, host b): network namespaces "dpb-<tag>-<pid>-a"/"-b", linked, each with its own address."""
    if os.geteuid() != 0:
        pytest.skip("making network namespaces needs root")
    if shutil.which("ip") is None:
        pytest.skip("making network namespaces needs the `ip` command (iproute2)")
    stem = f"dpb{os.getpid() % 100000}{tag[:3]}"  # interface names: at most 15 characters
    hosts = [
        Host(f"{stem}-{side}", f"{stem}{side}", f"{SUBNET}.{i}")
        for i, side in enumerate("ab", start=1)
    ]
    made: list[str] = []
    try:
        for host in hosts:
            _must(_ip("netns", "add", host.namespace), skip=True)
            made.append(host.namespace)
            write_hosts_file(host, hosts)
        _must(
            _ip(
                "link",
                "add",
                hosts[0].interface,
                "type",
                "veth",
                "peer",
                "name",
                hosts[1].interface,
            ),
            skip=True,
        )
        for host in hosts:
            _must(_ip("link", "set", host.interface, "netns", host.namespace))
            _must(
                _ip(
                    "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface
                )
            )
            _must(_ip("-n", host.namespace, "link", "set", host.interface, "up"))
            _must(_ip("-n", host.namespace, "link", "set", "lo", "up"))
        yield tuple(hosts)
    finally:
        for namespace in made:  # (the veth pair goes with its namespaces)
            _ip("netns", "delete", namespace)
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


# `ip netns exec NS` shows /etc/netns/NS/hosts as /etc/hosts: each host knows the other by its namespace's
# name, and its own name (the machine's) as Debian's default /etc/hosts has it, 127.0.1.1, which the
# engines must not advertise.
NETNS_ETC = Path("/etc/netns")


def write_hosts_file(host: Host, hosts: list[Host]) -> None:
    folder = NETNS_ETC / host.namespace
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(
        f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n"
        + "".join(f"{h.address} {h.namespace}\n" for h in hosts)
    )


def _must(done: subprocess.CompletedProcess, skip: bool = False) -> None:
    if done.returncode:
        message = f"`ip {' '.join(done.args[1:])}` failed: {done.stderr.strip()}"
        if skip:
            pytest.skip(f"cannot make network namespaces here: {message}")
        raise AssertionError(message)


def start_harness(
    host: Host | None, args: list[str], log: Path, env: dict | None = None
) -> subprocess.Popen:
    """`python -m harness ARGS` inside `host`'s namespace (None: here), its output in `log`."""
    inside = ["ip", "netns", "exec", host.namespace] if host else []
    with open(log, "w") as out:
        return subprocess.Popen(
            [*inside, sys.executable, "-m", "harness", *args],
            cwd=ROOT,
            env=worker_env(**(env or {})),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_all(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> list[int]:
    """Every process's exit status; one still running after `timeout` is killed, with its group, and fails
    the test with the logs' tails."""
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        raise AssertionError(
            "a host's harness did not finish in time:\n"
            + "\n".join(log.read_text()[-2000:] for log in logs)
        ) from None


def small_run(backend: str, strategy: str, out: Path, *extra: str) -> list[str]:
    """The harness's flags for a small LeNet run of `strategy` on 2 devices in all, one thread per process,
    its report under `out` and its trained weights in out/weights.npz; the worker is this interpreter."""
    return [
        "--backend",
        backend,
        "--strategy",
        strategy,
        "--device",
        "cpu",
        "--model",
        "lenet",
        "--dataset",
        "synthetic",
        "--train-size",
        "64",
        "--test-size",
        "32",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--timed-steps",
        "0",
        "--threads",
        "1",
        "--no-check",
        "--quiet",
        "--timeout",
        "300",
        "--out",
        str(out),
        "--save-weights",
        str(out / "weights.npz"),
        "--python",
        f"{backend}={sys.executable}",
        *extra,
    ]


def run_row(out: Path) -> dict:
    """The one run's row of the report folder under `out`."""
    (results,) = out.glob("*/results.json")
    (row,) = json.loads(results.read_text())["runs"]
    return row

"""The lanes a pass's queue runs in: each lane a disjoint share of the usable CPUs, taking the next suite as soon as it
is free; a suite is one pytest run on its lane's CPUs, its output and JUnit report kept, its processes stopped whole
on an interrupt."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from common import caches, sysinfo
from harness.processes import runner
from harness.processes.envs import ROOT
from harness.suites.records import Counts, Outcome, junit_counts, junit_cpu, junit_times


@dataclass
class Suite:
    """One pytest run: its title, the interpreter, the test paths, the environment, the pass's own selection
    (PORTABLE_SELECTION or none), the user's arguments, its pass, and its declared minutes (what orders it before
    a pass has measured it)."""

    title: str
    python: str
    paths: list[str]
    env: dict
    selection: list[str]
    pytest_args: list[str]
    pass_name: str = "normal"
    minutes: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.pass_name, self.title)

    @property
    def one_cpu(self) -> bool:
        """The portable pass runs each suite on one CPU, whatever its lane holds."""
        return self.pass_name == "portable"

    def run(self, cpus: set[int] | None) -> Outcome:
        return run_suite(self, cpus)


def label(key: tuple[str, str]) -> str:
    """How the output names a pass's suite: a normal one by its title, a portable one after its pass."""
    pass_name, title = key
    return title if pass_name == "normal" else f"{pass_name}: {title}"


def start_on(cmd: list[str], cpus: set[int] | None, **popen) -> subprocess.Popen:
    """Start `cmd` on `cpus` (None: wherever this process may run). A small shim sets them, then becomes `cmd`, so
    that everything it starts inherits them from its first instruction: the workers size their thread pools from
    the usable CPUs, not from OMP_NUM_THREADS (torch's set_num_threads, MXNet's compat, XLA, which has no switch)."""
    if cpus is not None:
        cmd = [sys.executable, "-c", PIN_SHIM, ",".join(map(str, sorted(cpus))), *cmd]
    return subprocess.Popen(cmd, **popen)


PIN_SHIM = (
    "import os, sys\n"
    "os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class Running:
    """The suites' processes alive now: an interrupt (Ctrl-C, SIGTERM, SIGHUP) stops each one's whole process
    group, so that no pytest, and no worker a test started, outlives the pass."""

    def __init__(self):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def holding(self, proc: subprocess.Popen):
        with self._lock:
            self._procs.add(proc)
        try:
            yield
        finally:
            with self._lock:
                self._procs.discard(proc)

    def stop(self) -> None:
        """Every suite's process group stopped as a worker's is: SIGTERM, then SIGKILL after the grace."""
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            runner.kill_group(proc)


RUNNING = Running()


def own_compile_caches(folder: Path) -> dict[str, str]:
    """A suite's compile caches in `folder`, gone with it. Inductor's default is one folder per user, and its keys
    do not hold the CPU's capability: a pass with capped kernels read the normal pass's C++ kernels and failed to
    compile them (common/caches.py)."""
    return caches.own_folders(folder)


def run_suite(suite: Suite, cpus: set[int] | None = None) -> Outcome:
    """One pytest run with a JUnit XML report, on `cpus` (None: wherever the caller runs), its output kept."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        xml, log = Path(tmp) / "junit.xml", Path(tmp) / "output.log"
        cmd = [
            suite.python,
            "-m",
            "pytest",
            *suite.paths,
            "-q",
            f"--junitxml={xml}",
            *suite.selection,
            *suite.pytest_args,
        ]
        with open(log, "w") as out:
            # Its own process group, so that an interrupt stops the suite with everything it started.
            proc = start_on(
                cmd,
                cpus,
                cwd=ROOT,
                env={**suite.env, **own_compile_caches(Path(tmp))},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            used = cpus or os.sched_getaffinity(0)
            busy = sysinfo.busy_cpu_seconds(used)
            with RUNNING.holding(proc):
                rc = proc.wait()
            cpu = cpu_since(busy, used)
        output = log.read_text(errors="replace")
        if not xml.exists():
            output += f"\n{suite.title}: pytest exited with status {rc} and no report\n"
            return Outcome(Counts(failed=1), output, time.monotonic() - start, cpu_seconds=cpu)
        try:
            counts, tests, tests_cpu = junit_counts(xml), junit_times(xml), junit_cpu(xml)
        except (
            ET.ParseError,
            ValueError,
        ) as e:  # cut short (a killed pytest, a full disk): untrusted input
            output += (
                f"\n{suite.title}: pytest exited with status {rc} and an unreadable report ({e})\n"
            )
            return Outcome(Counts(failed=1), output, time.monotonic() - start, cpu_seconds=cpu)
    # (with -k and the like, selecting nothing is fine)
    if counts.total == 0 and not suite.pytest_args:
        output += f"\n{suite.title}: no test ran; counted as a failure\n"
        counts.failed += 1
    return Outcome(counts, output, time.monotonic() - start, tests, cpu, tests_cpu)


def cpu_since(busy: float | None, cpus: set[int]) -> float | None:
    """The busy seconds of `cpus` since they were `busy`: a suite's CPU time, where its lane's CPUs are its own."""
    now = sysinfo.busy_cpu_seconds(cpus)
    return None if busy is None or now is None else round(now - busy, 1)


def lanes(jobs: int, cpus: set[int]) -> list[set[int]]:
    """`jobs` disjoint sets of the usable CPUs, as even as they divide: each lane runs one suite at a time, so that
    two suites never share a core (their thread pools are sized from the CPUs they may use)."""
    ordered = sorted(cpus)
    jobs = max(1, min(jobs, len(ordered)))
    return [set(ordered[i::jobs]) for i in range(jobs)]


def run_suites(items: list, jobs: int) -> dict[tuple[str, str], Outcome]:
    """Every item of one queue (the suites of either pass, the portable pass's Probes), at most `jobs` at once, each
    lane taking the next item as soon as it is free, in the order given (longest first keeps the lanes even). A
    normal suite runs on its lane's CPUs (on every CPU with one lane), a portable item on one CPU of its lane. Each
    item's output is printed whole when it ends, with its wall time. The outcomes by the items' keys."""
    pending = list(items)
    outcomes: dict[tuple[str, str], Outcome] = {}
    lock = threading.Lock()

    def lane(cpus: set[int]) -> None:
        while True:
            with lock:
                if not pending:
                    return
                item = pending.pop(0)
                used = item_cpus(item, cpus, jobs)
                shown = ",".join(map(str, sorted(used or cpus)))
                print(f"started: {label(item.key)} (CPU {shown})", flush=True)
            outcome = item.run(used)
            with lock:
                outcomes[item.key] = outcome
                print(
                    f"\n=== {label(item.key)} ({outcome.seconds:.0f} s) ===\n{outcome.output.rstrip()}\n",
                    flush=True,
                )

    workers = [
        threading.Thread(target=lane, args=(cpus,), daemon=True)
        for cpus in lanes(jobs, os.sched_getaffinity(0))
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    # (the main thread's: SIGTERM and SIGHUP too, under interrupts.handled)
    except KeyboardInterrupt:
        with lock:
            pending.clear()  # no lane starts another suite
        RUNNING.stop()
        raise
    return {item.key: outcomes[item.key] for item in items}


def item_cpus(item, lane: set[int], jobs: int) -> set[int] | None:
    """Where a queue's item runs: a portable one on one CPU of its lane; a normal one on its lane, or, with one
    lane, wherever this process may run."""
    if item.one_cpu:
        return {min(lane)}
    return lane if jobs > 1 else None

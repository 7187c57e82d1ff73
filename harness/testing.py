"""`python -m harness test`: the harness's tests here, each backend's tests inside its own environment.

Each suite is a pytest run with a JUnit XML report; the counts are added up per pass and in all, and the last line
printed is `N passed, N failed` (and skipped). Exit status 0 only if nothing failed and every suite ran at least
one test.

The portable pass (`--passes portable`, or `--portable`) runs the backend and cross-backend tests whose verdict
rests on how the CPU kernels round (marked `rounding`: a float32 or bf16 tolerance) again, on one CPU with every
framework's CPU kernels capped to SSE4.1/SSE4.2 (x86-64-v2, numpy 2's own floor), so that a pass says the tests hold
on any x86-64 CPU, not only on the one they were written on. The other tests judge float64 identities, exact
copies, processes and records: no kernel's rounding decides them. `--passes normal,portable` runs both passes'
suites from one queue, so that no lane waits for another pass.

Every pass keeps what it measured in TIMES_FILE: per suite its wall time and each test's, with the date and the
host. The next pass starts the suites longest first by those times, prints the longest tests, and its wall time
against BUDGETS.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import caches, manifest, sysinfo
from common.files import write_json_atomic
from harness.arguments import Parser, backends_flags, name_list, python_flags
from harness.errors import UsageError
from harness.planning.plan import parse_backends, parse_pythons
from harness.processes import envs, runner
from harness.processes.envs import ROOT

# What --portable caps, per library; each was checked to change the kernels in the pinned versions
# (each backend's kernel probe, probe() below, prints the evidence at the start of the pass).
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's ATen kernels: no AVX2 / AVX-512 variants
    "ONEDNN_MAX_CPU_ISA": "SSE41",  # torch's oneDNN 3.x
    "DNNL_MAX_CPU_ISA": "SSE41",  # MXNet 1.9.1's oneDNN 2.4, which reads only this name
    "MKL_CBWR": "COMPATIBLE",  # torch's MKL: the code path that computes alike on every x86-64 CPU
    "OPENBLAS_CORETYPE": "Nehalem",  # MXNet's and numpy's OpenBLAS: SSE4.2 kernels, no AVX
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MXNET_CPU_WORKER_NTHREADS": "1",
}
# Appended to the caller's XLA_FLAGS. A flag XLA does not know aborts jax: these two exist in jaxlib 0.10.2.
PORTABLE_XLA_FLAGS = "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
# What the portable pass selects: the tests marked `rounding` (pyproject.toml lists the marker).
PORTABLE_SELECTION = ["-m", "rounding"]
PASSES = ("normal", "portable")
# The suites start longest first, by the wall times the last pass measured (TIMES_FILE); a suite no pass has
# measured (a fresh clone) by its declared minutes on one core of a 2-core CPU: backend.toml's [tests] minutes for a
# backend's suite, these for the others (docs/testing.md's table).
HARNESS_TITLE = "harness (no framework)"
HARNESS_MINUTES = 3.1
# tests/cross: every backend's check and checkpoint runs (186 s measured on a 2-core host with AVX-512).
CROSS_MINUTES = 3.1
# The cross-backend portable suite's (a backend's portable suite declares its own: [tests] portable_minutes).
PORTABLE_CROSS_MINUTES = 1.05

# What a pass measured, left behind (.gitignore keeps it out of the repository): per suite its wall time and each
# test's, with the date and the host. JUnit's reports, the only other record of a test's time, live in a suite's
# temporary folder.
TIMES_FILE = ROOT / ".test-times.json"
LONGEST_SHOWN = 10
# The JUnit property tests/conftest.py gives each test: its CPU seconds.
CPU_PROPERTY = "cpu_s"

# The full pass's budget (`--passes normal,portable`, every backend, the environments' build included), by the widest
# vector set the host has: XLA's and oneDNN's CPU kernels run half as wide without AVX-512. Set for 2 cores, where CI
# took 1,278 s from a fresh clone on an AVX-512 host (the normal pass 1,104 s with the build, then the portable pass
# 173 s), and 1,912-2,297 s at the five landings before on hosts of which the later had no AVX-512. A report, not a
# failure: a loaded host must not fail CI.
BUDGET_HOST = "a 2-core host"
# seconds, the first vector set the host has (without either: AVX2's)
BUDGETS = (("AVX-512", 900), ("AVX2", 1500))

# The lines of a probe's output worth showing, and how to say them.
PROBE_FACTS = [
    (r"^probe: (.*)$", "{}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,isa:(.*)$", "oneDNN ISA {}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,runtime:OpenMP,nthr:(\d+)$", "oneDNN {} thread(s)"),
    (r"^(?:onednn|dnnl)_verbose,.*exec,cpu,convolution,([^,]+),", "oneDNN convolution {}"),
    (r"^MKL_VERBOSE SGEMM.* CNR:(\S+) .*NThr:(\d+)", "MKL CNR {} with {} thread(s)"),
    (
        r"`xla_cpu_max_isa` is set\. Will not use features newer than: (\S+)",
        "XLA codegen capped to {}",
    ),
]


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


def junit_counts(path: Path) -> Counts:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    c = Counts()
    for s in suites:
        tests, failures, errors, skipped = (
            int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
        )
        c.failed += failures + errors
        c.skipped += skipped
        c.passed += tests - failures - errors - skipped
    return c


def junit_times(path: Path) -> dict[str, float]:
    """Each test's seconds in a JUnit report (setup, call and teardown, as pytest counts them), by its id:
    classname::name, e.g. tests.backends.test_contract::test_parameter_counts."""
    return {
        f"{case.get('classname')}::{case.get('name')}": float(case.get("time", 0.0))
        for case in ET.parse(path).getroot().iter("testcase")
    }


def junit_cpu(path: Path) -> dict[str, float]:
    """Each test's CPU seconds in a JUnit report (the busy seconds of the CPUs it ran on: the property
    tests/conftest.py records), by its id; a test without the property is left out."""
    return {
        f"{case.get('classname')}::{case.get('name')}": float(prop.get("value"))
        for case in ET.parse(path).getroot().iter("testcase")
        for prop in case.iter("property")
        if prop.get("name") == CPU_PROPERTY and is_number(prop.get("value"))
    }


def is_number(text: str | None) -> bool:
    """A finite count of seconds, >= 0 (a report is untrusted input: no NaN or infinity reaches the times file)."""
    try:
        return text is not None and 0 <= float(text) < math.inf
    except ValueError:
        return False


def suite_env(extra_env: dict, portable: bool, caller: Mapping[str, str] = os.environ) -> dict:
    """A suite's environment: the caller's, with the project importable and the suite's own variables;
    portable adds the caps of PORTABLE_ENV and appends PORTABLE_XLA_FLAGS to the caller's XLA_FLAGS."""
    env = envs.worker_env(caller, **extra_env)
    if portable:
        env.update(PORTABLE_ENV)
        env["XLA_FLAGS"] = " ".join(
            f for f in (caller.get("XLA_FLAGS", ""), PORTABLE_XLA_FLAGS) if f
        )
    return env


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


def probe_facts(output: str) -> list[str]:
    """What a probe's output says about its kernels, in PROBE_FACTS order, each fact once."""
    facts = []
    for pattern, template in PROBE_FACTS:
        match = re.search(pattern, output, re.MULTILINE)
        if match:
            facts.append(template.format(*match.groups()))
    return facts


def probe(library: str, python: str, cpus: set[int]) -> str:
    """One line: what `library`'s kernels run with in the environment of `python`, on `cpus`: the probe its backend
    declares (backend.toml's [kernels_probe]), with the portable environment and the library's verbose switches,
    so that the pass starts by showing what the kernels really run with."""
    declared = manifest.load(library).kernels_probe if library in manifest.known() else None
    if declared is None:
        return f"{library}: no probe for this library"
    # a script, not its package's module: importing backends.<name> sets the backend up (jax's asks XLA for
    # devices); -P keeps its folder, whose models.py and the like would shadow modules of those names, off sys.path
    proc = start_on(
        [python, "-P", str(declared.script)],
        cpus,
        cwd=ROOT,
        env={**suite_env({}, True), **declared.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode:
        return f"{library}: the probe failed (status {proc.returncode}): {stderr.strip()[-500:]}"
    return f"{library}: " + "; ".join(probe_facts(stdout + stderr))


def caps(pythons: dict[str, str], cpus: set[int]) -> list[str]:
    """One line per backend and kernel library: what the kernels are capped to, as the library reports it."""
    return [
        f"{name}: {probe(library, python, cpus)}"
        if library != name
        else probe(library, python, cpus)
        for name, python in pythons.items()
        for library in manifest.load(name).kernels
    ]


@dataclass
class Outcome:
    """What one suite's run gave: its counts, everything pytest printed, its wall time, each test's seconds by
    its id (JUnit's classname::name), and the CPU seconds of the suite and of each test (None and {} where not
    measured). Wall time well above CPU time is waiting: a timeout, a peer's grace, a sleep, or a loaded host."""

    counts: Counts
    output: str
    seconds: float
    tests: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float | None = None
    tests_cpu: dict[str, float] = field(default_factory=dict)


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


@dataclass
class Probes:
    """The portable pass's opening evidence, what each backend's kernels run with: an item of the pass's queue like
    a suite, on one CPU of the lane that takes it, so that no lane waits for it."""

    pythons: dict[str, str]
    title: str = "what each backend's CPU kernels run with"
    pass_name: str = "portable"
    one_cpu: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.pass_name, self.title)

    def run(self, cpus: set[int]) -> Outcome:
        start = time.monotonic()
        return Outcome(Counts(), "\n".join(caps(self.pythons, cpus)), time.monotonic() - start)


def label(key: tuple[str, str]) -> str:
    """How the output names a pass's suite: a normal one by its title, a portable one after its pass."""
    pass_name, title = key
    return title if pass_name == "normal" else f"{pass_name}: {title}"


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
    return {name: str(folder / caches.FOLDERS[name]) for name in caches.ALWAYS_ON}


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


DESCRIPTION = (
    "Run the harness tests, then each backend's tests in its own environment (--passes normal,portable: "
    "then again with capped CPU kernels, from one queue)."
)


def parents() -> list[Parser]:
    """The flags of `python -m harness test`."""
    own = Parser(add_help=False)
    own.add_argument(
        "--passes",
        type=name_list,
        default=None,
        metavar="PASSES",
        help="the passes to run, from one queue: normal, portable, or normal,portable (CI's; default: normal). "
        "The portable pass runs the backend and cross-backend tests whose verdict rests on the kernels' "
        "rounding (marked rounding) on one CPU each with every framework's CPU kernels capped to "
        "SSE4.1/SSE4.2 and one thread (torch: ATEN_CPU_CAPABILITY=default, oneDNN SSE41, "
        "MKL_CBWR=COMPATIBLE; jax: XLA_FLAGS --xla_cpu_max_isa=SSE4_2; mxnet: oneDNN SSE41, OpenBLAS "
        "Nehalem), to show the tests pass on any x86-64 CPU, and prints what each backend's kernels run with",
    )
    own.add_argument(
        "--portable",
        action="store_true",
        help="the same as --passes portable",
    )
    own.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="suites run at once, each on its own share of the usable CPUs (default: one per usable "
        "CPU; 1 runs them one after another on every CPU)",
    )
    own.add_argument(
        "pytest_args", nargs="*", help="passed to pytest (after --), e.g. -- -k split -x"
    )
    return [
        backends_flags("backends whose tests to run (comma list, or all, or none)"),
        python_flags("use this interpreter for BACKEND's tests instead of .venvs/BACKEND/"),
        own,
    ]


def chosen_passes(passes: str | None, portable: bool) -> list[str]:
    """The passes --passes (or --portable) names, each once, in PASSES's order; bad input in one line."""
    if portable:
        if passes not in (None, "portable"):
            raise UsageError(
                f"--portable is --passes portable: give one of them (got --passes {passes})"
            )
        return ["portable"]
    asked = [p.strip() for p in (passes or "normal").split(",") if p.strip()]
    if unknown := [p for p in asked if p not in PASSES]:
        raise UsageError(
            f"unknown pass {unknown[0]!r} in --passes; choose from {', '.join(PASSES)}"
        )
    return [p for p in PASSES if p in asked]


def backend_pythons(
    names: list[str], pythons: dict[str, str]
) -> tuple[dict[str, str], dict[str, Outcome]]:
    """Each backend's interpreter: --python's, else its environment, the missing ones built at once (pip spends
    most of a build waiting on downloads and disks); the backends whose environment failed, as failed outcomes."""
    found, failed = {}, {}
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        builds = {
            name: pool.submit(envs.ensure_backend, name, manifest.load(name).requirements, say_line)
            for name in names
            if name not in pythons
        }
        for name in names:
            if name in pythons:
                found[name] = pythons[name]
                continue
            try:
                found[name] = str(builds[name].result())
            except envs.EnvError as e:
                failed[name] = Outcome(Counts(failed=1), f"environment setup failed\n{e}", 0.0)
                print(f"\n=== {name}: environment setup failed ===\n{e}", flush=True)
    return found, failed


def say_line(text: str) -> None:
    """One line in one write, so that the lines of builds running at once do not interleave."""
    print(text + "\n", end="", flush=True)


def pass_suites(
    pass_name: str, interpreters: dict[str, str], pytest_args: list[str]
) -> list[Suite]:
    """One pass's suites: the normal pass's start with the harness's own; the cross-backend suite needs two
    backends and runs whole."""
    portable = pass_name == "portable"
    suites = [] if portable else [harness_suite(pytest_args)]
    suites += [
        backend_suite(name, python, portable, pytest_args) for name, python in interpreters.items()
    ]
    if len(interpreters) >= 2 and not pytest_args:
        suites.append(cross_suite(interpreters, portable))
    return suites


def harness_suite(pytest_args: list[str]) -> Suite:
    return Suite(
        HARNESS_TITLE,
        sys.executable,
        ["tests/harness"],
        suite_env({}, False),
        [],
        pytest_args,
        minutes=HARNESS_MINUTES,
    )


def backend_suite(name: str, python: str, portable: bool, pytest_args: list[str]) -> Suite:
    """A backend's tests in its environment: the contract (test_contract.py, test_contract_*.py), then its own
    files (test_<name>.py, test_<name>_*.py)."""

    def files(*patterns: str) -> list[str]:
        found = (p for pattern in patterns for p in (ROOT / "tests" / "backends").glob(pattern))
        return sorted(str(p.relative_to(ROOT)) for p in found)

    contract = files("test_contract.py", "test_contract_*.py")
    own = files(f"test_{name}.py", f"test_{name}_*.py")
    return Suite(
        backend_suite_title(name),
        python,
        [*contract, *own],
        suite_env({"DPBENCH_BACKEND": name}, portable),
        PORTABLE_SELECTION if portable else [],
        pytest_args,
        pass_of(portable),
        declared_minutes(manifest.load(name), portable),
    )


def cross_suite(interpreters: dict[str, str], portable: bool) -> Suite:
    """The tests across backends (tests/cross), in a lane of its own beside the backends' suites: a broken
    backend then fails its own suite and the cross rows it takes part in, each saying so."""
    names = list(interpreters)
    env = suite_env(
        {
            "DPBENCH_BACKENDS": ",".join(names),
            "DPBENCH_PYTHONS": ",".join(f"{k}={v}" for k, v in interpreters.items()),
        },
        portable,
    )
    return Suite(
        cross_title(names),
        sys.executable,
        ["tests/cross"],
        env,
        PORTABLE_SELECTION if portable else [],
        [],
        pass_of(portable),
        PORTABLE_CROSS_MINUTES if portable else CROSS_MINUTES,
    )


def declared_minutes(meta: manifest.Manifest, portable: bool) -> float:
    """A backend's suite's declared minutes in the pass. Each portable suite declares its own: they end the queue,
    and taken longest first they end the two lanes together (all declared alike, the longest could come last)."""
    return meta.portable_test_minutes if portable else meta.test_minutes


def pass_of(portable: bool) -> str:
    return "portable" if portable else "normal"


def backend_suite_title(name: str) -> str:
    return f"{name} (inside its environment)"


def cross_title(names: list[str]) -> str:
    return f"cross-backend ({', '.join(names)})"


def longest_first(suites: list[Suite], measured: Mapping[str, float] | None = None) -> list[Suite]:
    """The suites ordered by their wall time, the longest first, so that the lanes end together: the last measured
    one (measured_seconds), else the declared minutes."""
    measured = measured or {}
    return sorted(suites, key=lambda s: -measured.get(times_key(s.key), s.minutes * 60))


# The project's own packages, byte-compiled before the suites start (compile_the_project).
PROJECT_PACKAGES = ("common", "harness", "backends", "benchmarks", "tests")


def compile_the_project() -> None:
    """The project's modules byte-compiled once, on every usable CPU, before the suites. Where
    PYTHONDONTWRITEBYTECODE is set (as in many images) Python never writes what it compiles on import, so each of
    the pass's hundreds of processes (harness runs, workers, nodes) compiled them again: 12% of the CPU time of four
    harness test files that start processes. In .venvs/harness/ it lands in the environment's own cache, where its
    interpreters read it (envs.keep_bytecode_inside). A file that does not compile is left to its tests to say."""
    import compileall

    for package in PROJECT_PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=2, workers=len(os.sched_getaffinity(0)))


def default_jobs() -> int:
    """As many suites at once as there are usable CPUs (a compile, and most of a small test, runs on one)."""
    return len(os.sched_getaffinity(0))


def main(args) -> int:
    """`python -m harness test`, its flags parsed (cli.build_parser)."""
    started = time.monotonic()
    passes = chosen_passes(args.passes, args.portable)
    names = [] if args.backend == "none" else parse_backends(args.backend)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(
            f"--jobs takes the number of suites to run at once, at least 1 (got {args.jobs})"
        )
    jobs = args.jobs or default_jobs()
    interpreters, unbuilt = backend_pythons(names, parse_pythons(args.python))
    compile_the_project()
    suites = [s for p in passes for s in pass_suites(p, interpreters, args.pytest_args)]
    earlier = read_times(TIMES_FILE)
    queue = longest_first(suites, measured_seconds(earlier))
    if "portable" in passes:
        # first: a few seconds, and the evidence the portable suites are read by
        queue.insert(0, Probes(interpreters))
    ran = run_suites(queue, jobs)
    outcomes = {(passes[0], name): outcome for name, outcome in unbuilt.items()}
    outcomes |= {s.key: ran[s.key] for s in suites}
    seconds, host = time.monotonic() - started, sysinfo.machine()
    last_pass = {"date": now(), "passes": passes, "backends": names, "wall_s": round(seconds, 1)}
    measured = measured_suites(suites, outcomes, last_pass["date"])
    keep_times(times_record(earlier, measured, host, last_pass))
    print_longest(longest_tests(outcomes))
    full = (
        set(passes) == set(PASSES) and set(names) == set(manifest.known()) and not args.pytest_args
    )
    return summarise(outcomes, passes, wall_time(seconds, host["vector_isa"], full))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------ what a pass measured, kept for the next


def times_key(key: tuple[str, str]) -> str:
    """A suite's name in TIMES_FILE: its pass and title."""
    return ": ".join(key)


def read_times(path: Path) -> dict:
    """What an earlier pass kept in `path` ({} where there is none, or it is not a JSON object)."""
    try:
        times = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return times if isinstance(times, dict) else {}


def measured_seconds(times: dict) -> dict[str, float]:
    """Each suite's wall time in an earlier pass's record, by times_key; a value that is no positive number is
    left out (its suite then has its declared minutes)."""
    suites = times.get("suites")
    if not isinstance(suites, dict):
        return {}
    seconds = {k: v.get("seconds") if isinstance(v, dict) else None for k, v in suites.items()}
    return {
        k: float(s)
        for k, s in seconds.items()
        if isinstance(s, int | float) and not isinstance(s, bool) and s > 0
    }


def measured_suites(suites: list[Suite], outcomes: dict, date: str) -> dict[str, dict]:
    """This pass's suites as TIMES_FILE keeps them: date, wall time, counts and each test's seconds. Only whole
    suites with a report: one run with the user's pytest arguments ran a part, and its time is not the suite's."""
    return {
        times_key(s.key): {
            "date": date,
            "seconds": round(o.seconds, 1),
            "passed": o.counts.passed,
            "failed": o.counts.failed,
            "skipped": o.counts.skipped,
            "cpu_seconds": o.cpu_seconds,
            "tests": o.tests,
            "tests_cpu": o.tests_cpu,
        }
        for s in suites
        if (o := outcomes.get(s.key)) and o.tests and not s.pytest_args
    }


def times_record(
    earlier: dict, measured: dict[str, dict], host: dict, last_pass: dict
) -> dict | None:
    """TIMES_FILE's new content: the suites this pass measured over those an earlier pass did on the same host
    (another host's times would misorder this one's lanes), with the host and this pass's date, passes and wall
    time. None where this pass measured no whole suite: the file stays as it was."""
    if not measured:
        return None
    kept = earlier.get("suites") if earlier.get("host") == host else None
    return {
        **last_pass,
        "host": host,
        "suites": {**(kept if isinstance(kept, dict) else {}), **measured},
    }


def keep_times(record: dict | None) -> None:
    """TIMES_FILE written whole; a failed write is one line, not a failed pass."""
    if record is None:
        return
    try:
        write_json_atomic(TIMES_FILE, record)
    except OSError as e:
        print(f"\nthe tests' times were not kept: {TIMES_FILE}: {e.strerror}", flush=True)
        return
    print(f"\nthe tests' times: {TIMES_FILE.name}", flush=True)


def longest_tests(
    outcomes: dict, n: int = LONGEST_SHOWN
) -> list[tuple[str, str, float, float | None]]:
    """The `n` longest tests of a pass: (suite, test id, seconds, CPU seconds or None), the longest first."""
    rows = [
        (label(key), test, seconds, outcome.tests_cpu.get(test))
        for key, outcome in outcomes.items()
        for test, seconds in outcome.tests.items()
    ]
    return sorted(rows, key=lambda row: -row[2])[:n]


def print_longest(rows: list[tuple[str, str, float, float | None]]) -> None:
    if not rows:
        return
    print(f"\n=== the {len(rows)} longest tests (wall time, CPU time) ===")
    for suite, test, seconds, cpu in rows:
        print(f"{seconds:7.1f} s {cpu_text(cpu):>9}  {suite}  {test}")


def cpu_text(cpu: float | None) -> str:
    return "" if cpu is None else f"CPU {cpu:.0f} s"


# ------------------------------------------------------------------------------------------------- the summary


def budget(vector_isa: list[str] | None) -> tuple[int, str]:
    """The full pass's budget in seconds on a host with `vector_isa`, and the host it is set for."""
    isa, seconds = next(((isa, s) for isa, s in BUDGETS if isa in (vector_isa or [])), BUDGETS[-1])
    return seconds, f"{BUDGET_HOST} with {isa}"


def wall_time(seconds: float, vector_isa: list[str] | None, full: bool) -> list[str]:
    """The pass's wall time against its budget; over it, one line more that says so. Only the full pass has one."""
    limit, host = budget(vector_isa)
    line = f"wall time of the pass: {seconds:,.0f} s ({seconds / 60:.1f} min)"
    if not full:
        return [
            f"{line}; the budget, {limit:,} s on {host}, is the full pass's (--passes normal,portable, every backend)"
        ]
    over = (
        [f"over budget by {seconds - limit:,.0f} s (a report, not a failure)"]
        if seconds > limit
        else []
    )
    return [f"{line}, budget {limit:,} s on {host}", *over]


def counted(outcomes) -> Counts:
    total = Counts()
    for outcome in outcomes:
        total.passed += outcome.counts.passed
        total.failed += outcome.counts.failed
        total.skipped += outcome.counts.skipped
    return total


def counts_line(c: Counts) -> str:
    return f"{c.passed} passed, {c.failed} failed, {c.skipped} skipped"


def summarise(outcomes: dict[tuple[str, str], Outcome], passes: list[str], wall: list[str]) -> int:
    """One line per suite with its wall time, one per pass with its counts (`portable pass: N passed, ...`), the
    pass's wall time (`wall`), then the closing line `N passed, N failed, N skipped`; the exit status (0 only if
    nothing failed and something passed)."""
    portable = " (portable: capped CPU kernels, one CPU per suite)" if "portable" in passes else ""
    print(f"\n=== summary{portable} ===")
    for (pass_name, title), outcome in outcomes.items():
        cpu = "" if outcome.cpu_seconds is None else f", {cpu_text(outcome.cpu_seconds)}"
        print(
            f"{pass_name:9} {title.split(' ')[0]:14} {counts_line(outcome.counts)} "
            f"in {outcome.seconds:.0f} s{cpu}"
        )
    for pass_name in passes:
        mine = [o for (p, _), o in outcomes.items() if p == pass_name]
        print(f"{pass_name} pass: {counts_line(counted(mine))}")
    for line in wall:
        print(line)
    total = counted(outcomes.values())
    print(counts_line(total), flush=True)
    return 1 if total.failed or total.passed == 0 else 0

"""`python -m harness test`: the harness's tests here, each backend's tests inside its own environment.

Each suite is a pytest run with a JUnit XML report; the counts are added up and the
last line printed is `N passed, N failed` (and skipped). Exit status 0 only if nothing
failed and every suite ran at least one test.

`--portable` runs the backend and cross-backend tests whose verdict rests on how the CPU kernels
round (marked `rounding`: a float32 or bf16 tolerance) again, on one CPU with every framework's
CPU kernels capped to SSE4.1/SSE4.2 (x86-64-v2, numpy 2's own floor), so that a pass says the
tests hold on any x86-64 CPU, not only on the one they were written on. The other tests judge
float64 identities, exact copies, processes and records: no kernel's rounding decides them.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path

from common import manifest
from harness.arguments import Parser, UsageError, backends_flags, python_flags
from harness.planning.plan import parse_backends, parse_pythons
from harness.processes import envs, runner
from harness.processes.envs import ROOT

# What --portable caps, per library; each was checked to change the kernels in the pinned versions
# (the probes below print the evidence at the start of the pass).
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
# The harness suite's title, and its wall time on one core of a 2-core CPU (backend.toml's [tests] minutes says a
# backend's): the suites start longest first.
HARNESS_TITLE = "harness (no framework)"
HARNESS_MINUTES = 4.0
# The cross-backend suite's, likewise (tests/cross: every backend's check and checkpoint runs).
CROSS_MINUTES = 5.5

# One tiny computation per kernel library (a backend.toml's `kernels`), run in each backend's environment with the
# portable environment and the library's own verbose switches, so that the pass starts by showing what the kernels
# really run with.
PROBES = {
    "torch": (
        {"ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"},
        "import torch\n"
        "torch.nn.functional.conv2d(torch.ones(2, 16, 8, 8), torch.ones(32, 16, 3, 3))\n"
        "torch.ones(64, 64) @ torch.ones(64, 64)\n"
        "print(f'probe: ATen capability {torch.backends.cpu.get_cpu_capability()}, '\n"
        "      f'{torch.get_num_threads()} thread(s)')\n",
    ),
    "jax": (
        {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "cpu_compiler=1"},
        "import os, jax, jax.numpy as jnp\n"
        "jax.jit(lambda a: jnp.tanh(a).sum())(jnp.ones(64)).block_until_ready()\n"
        "print(f'probe: XLA_FLAGS accepted ({os.environ.get(\"XLA_FLAGS\")}); the XLA thread pool spans '\n"
        "      f'{len(os.sched_getaffinity(0))} usable CPU(s): '\n"
        "      f'jaxlib {jax.__version__} has no thread-count switch')\n",
    ),
    "mxnet": (
        {"DNNL_VERBOSE": "1"},
        "import ctypes, os\n"
        "from backends.mxnet.compat import mx\n"
        "mx.nd.Convolution(mx.nd.ones((2, 16, 8, 8)), mx.nd.ones((32, 16, 3, 3)), kernel=(3, 3),\n"
        "                  num_filter=32, no_bias=True).wait_to_read()\n"
        "blas = ctypes.CDLL(os.path.join(os.path.dirname(mx.__file__), 'libopenblas.so.0'))\n"
        "blas.openblas_get_corename.restype = ctypes.c_char_p\n"
        "omp = ctypes.CDLL('libgomp.so.1')\n"
        "print(f'probe: OpenBLAS core {blas.openblas_get_corename().decode()}, '\n"
        "      f'{omp.omp_get_max_threads()} OpenMP thread(s)')\n",
    ),
}
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


def probe(library: str, python: str) -> str:
    """One line: what `library`'s kernels run with in the environment of `python`."""
    if library not in PROBES:
        return f"{library}: no probe for this library"
    verbose, code = PROBES[library]
    proc = start_on(
        [python, "-c", code],
        {min(os.sched_getaffinity(0))},
        cwd=ROOT,
        env={**suite_env({}, True), **verbose},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode:
        return f"{library}: the probe failed (status {proc.returncode}): {stderr.strip()[-500:]}"
    return f"{library}: " + "; ".join(probe_facts(stdout + stderr))


def print_caps(pythons: dict[str, str]) -> None:
    """One line per backend and kernel library: what the kernels are capped to, as the library reports it."""
    print("\n=== portable: what each backend's CPU kernels run with ===", flush=True)
    for name, python in pythons.items():
        for library in manifest.load(name).kernels:
            print(
                f"{name}: {probe(library, python)}" if library != name else probe(library, python),
                flush=True,
            )


@dataclass
class Suite:
    """One pytest run: its title, the interpreter, the test paths, the environment, the pass's own selection
    (PORTABLE_SELECTION or none) and the user's arguments."""

    title: str
    python: str
    paths: list[str]
    env: dict
    selection: list[str]
    pytest_args: list[str]


@dataclass
class Outcome:
    """What one suite's run gave: its counts, everything pytest printed, and its wall time."""

    counts: Counts
    output: str
    seconds: float


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
                env=suite.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with RUNNING.holding(proc):
                rc = proc.wait()
        output = log.read_text(errors="replace")
        if not xml.exists():
            output += f"\n{suite.title}: pytest exited with status {rc} and no report\n"
            return Outcome(Counts(failed=1), output, time.monotonic() - start)
        counts = junit_counts(xml)
    # (with -k and the like, selecting nothing is fine)
    if counts.total == 0 and not suite.pytest_args:
        output += f"\n{suite.title}: no test ran; counted as a failure\n"
        counts.failed += 1
    return Outcome(counts, output, time.monotonic() - start)


def lanes(jobs: int, cpus: set[int]) -> list[set[int]]:
    """`jobs` disjoint sets of the usable CPUs, as even as they divide: each lane runs one suite at a time, so that
    two suites never share a core (their thread pools are sized from the CPUs they may use)."""
    ordered = sorted(cpus)
    jobs = max(1, min(jobs, len(ordered)))
    return [set(ordered[i::jobs]) for i in range(jobs)]


def run_suites(suites: list[Suite], jobs: int, one_cpu_each: bool = False) -> dict[str, Outcome]:
    """Every suite, at most `jobs` at once, each on its own lane of CPUs, in the order given (longest first keeps
    the lanes even); each suite's output is printed whole when it ends, with its wall time. `one_cpu_each` (the
    portable pass): every suite on a single CPU, whatever the lane holds."""
    pending = list(suites)
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()

    def lane(cpus: set[int]) -> None:
        while True:
            with lock:
                if not pending:
                    return
                suite = pending.pop(0)
                print(
                    f"started: {suite.title} (CPU {','.join(map(str, sorted(cpus)))})", flush=True
                )
            outcome = run_suite(suite, {min(cpus)} if one_cpu_each else cpus if jobs > 1 else None)
            with lock:
                outcomes[suite.title] = outcome
                print(
                    f"\n=== {suite.title} ({outcome.seconds:.0f} s) ===\n{outcome.output.rstrip()}\n",
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
    return {suite.title: outcomes[suite.title] for suite in suites}


DESCRIPTION = "Run the harness tests, then each backend's tests in its own environment."


def parents() -> list[Parser]:
    """The flags of `python -m harness test`."""
    own = Parser(add_help=False)
    own.add_argument(
        "--portable",
        action="store_true",
        help="run the backend and cross-backend tests whose verdict rests on the kernels' rounding "
        "(marked rounding) on one CPU with every framework's CPU kernels capped to SSE4.1/SSE4.2 "
        "and one thread (torch: ATEN_CPU_CAPABILITY=default, oneDNN SSE41, MKL_CBWR=COMPATIBLE; "
        "jax: XLA_FLAGS --xla_cpu_max_isa=SSE4_2; mxnet: oneDNN SSE41, OpenBLAS Nehalem), to show "
        "the tests pass on any x86-64 CPU; it first prints what each backend's kernels run with",
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


def backend_suite(name: str, python: str, portable: bool, pytest_args: list[str]) -> Suite:
    """A backend's tests in its environment: the contract (test_contract.py, test_contract_*.py), then its own
    files (test_<name>.py, test_<name>_*.py)."""

    def files(*patterns: str) -> list[str]:
        found = (p for pattern in patterns for p in (ROOT / "tests" / "backends").glob(pattern))
        return sorted(str(p.relative_to(ROOT)) for p in found)

    contract = files("test_contract.py", "test_contract_*.py")
    own = files(f"test_{name}.py", f"test_{name}_*.py")
    return Suite(
        f"{name} (inside its environment)",
        python,
        [*contract, *own],
        suite_env({"DPBENCH_BACKEND": name}, portable),
        PORTABLE_SELECTION if portable else [],
        pytest_args,
    )


def longest_first(suites: list[Suite], names: list[str]) -> list[Suite]:
    """The suites ordered by their declared minutes (backend.toml's [tests]), the longest first: the lanes then
    end together."""
    minutes = {backend_suite_title(n): manifest.load(n).test_minutes for n in names}
    minutes[HARNESS_TITLE] = HARNESS_MINUTES
    minutes[cross_title(names)] = CROSS_MINUTES
    return sorted(suites, key=lambda s: -minutes.get(s.title, 0.0))


def backend_suite_title(name: str) -> str:
    return f"{name} (inside its environment)"


def default_jobs() -> int:
    """As many suites at once as there are usable CPUs (a compile, and most of a small test, runs on one)."""
    return len(os.sched_getaffinity(0))


def main(args) -> int:
    """`python -m harness test`, its flags parsed (cli.build_parser)."""
    started = time.monotonic()
    names = [] if args.backend == "none" else parse_backends(args.backend)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(
            f"--jobs takes the number of suites to run at once, at least 1 (got {args.jobs})"
        )
    jobs = args.jobs or default_jobs()
    interpreters, outcomes = backend_pythons(names, parse_pythons(args.python))
    if args.portable:
        print_caps(interpreters)
    suites = (
        []
        if args.portable
        else [
            Suite(
                HARNESS_TITLE,
                sys.executable,
                ["tests/harness"],
                suite_env({}, False),
                [],
                args.pytest_args,
            )
        ]
    )
    suites += [
        backend_suite(name, python, args.portable, args.pytest_args)
        for name, python in interpreters.items()
    ]
    if len(interpreters) >= 2 and not args.pytest_args:
        suites.append(cross_suite(interpreters, args.portable))
    outcomes.update(run_suites(longest_first(suites, names), jobs, one_cpu_each=args.portable))
    return summarise(outcomes, args.portable, time.monotonic() - started)


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
    )


def cross_title(names: list[str]) -> str:
    return f"cross-backend ({', '.join(names)})"


def summarise(outcomes: dict[str, Outcome], portable: bool, seconds: float) -> int:
    """One line per suite with its wall time, the pass's wall time, then the closing line `N passed, N failed,
    N skipped`; the exit status (0 only if nothing failed and something passed)."""
    total = Counts()
    print(
        f"\n=== summary{' (portable: capped CPU kernels, one CPU per suite)' if portable else ''} ==="
    )
    for title, outcome in outcomes.items():
        c = outcome.counts
        print(
            f"{title.split(' ')[0]:10} {c.passed} passed, {c.failed} failed, {c.skipped} skipped "
            f"in {outcome.seconds:.0f} s"
        )
        total.passed += c.passed
        total.failed += c.failed
        total.skipped += c.skipped
    print(f"wall time of the pass: {seconds:.0f} s ({seconds / 60:.1f} min)")
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped", flush=True)
    return 1 if total.failed or total.passed == 0 else 0

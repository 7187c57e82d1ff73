"""The suites of a pass: the harness's own (tests/harness, in this interpreter), each backend's inside its own
environment (the contract suite, then its own files), and the cross-backend suite (tests/cross), with what orders
them before a pass has measured them; and what runs before the first suite (the backends' environments, the
project byte-compiled)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from common import manifest
from harness.processes import envs
from harness.processes.envs import ROOT
from harness.suites.kernels import PORTABLE_SELECTION, suite_env
from harness.suites.lanes import Suite
from harness.suites.records import Counts, Outcome
from harness.suites.times import times_key

PASSES = ("normal", "portable")


# The suites start longest first, by the wall times the last pass measured (TIMES_FILE); a suite no pass has
# measured (a fresh clone) by its declared minutes on one core of a 2-core CPU: backend.toml's [tests] minutes for a
# backend's suite, these for the others (docs/testing.md's table).
HARNESS_TITLE = "harness (no framework)"


HARNESS_MINUTES = 3.4


# tests/cross: every backend's check and checkpoint runs (164 s measured on a 2-core host with AVX-512).
CROSS_MINUTES = 2.75


# The cross-backend portable suite's (a backend's portable suite declares its own: [tests] portable_minutes).
PORTABLE_CROSS_MINUTES = 1.0


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

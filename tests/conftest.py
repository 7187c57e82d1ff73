"""Every suite's: each test's CPU seconds, beside the wall time JUnit keeps, so that a pass tells a test that
computes from one that waits (a timeout, a peer's grace, a sleep). They are the busy seconds of the CPUs the test may
use, which `python -m harness test` gives each suite alone: run elsewhere, they count whatever else ran there."""

from __future__ import annotations

import os

import pytest

from common.sysinfo import busy_cpu_seconds

CPU_PROPERTY = "cpu_s"
START = pytest.StashKey[float | None]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[START] = busy_cpu_seconds(os.sched_getaffinity(0))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    start, end = item.stash.get(START, None), busy_cpu_seconds(os.sched_getaffinity(0))
    if start is not None and end is not None:
        # (the teardown's report, made after this hook, carries it into the JUnit report)
        item.user_properties.append((CPU_PROPERTY, f"{end - start:.2f}"))

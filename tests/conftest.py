"""Every suite's: each test's CPU seconds, beside the wall time JUnit keeps, so that a pass tells a test that
computes from one that waits (a timeout, a peer's grace, a sleep) and from a loaded host."""

from __future__ import annotations

import resource

import pytest

CPU_PROPERTY = "cpu_s"


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of every child it has waited for."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    # (the teardown's report, made after this hook, carries it into the JUnit report)
    item.user_properties.append((CPU_PROPERTY, f"{cpu_seconds() - item.stash[START]:.2f}"))


START = pytest.StashKey[float]()

"""What one suite's run gave, read from its JUnit XML report: the counts, each test's wall and CPU seconds. A report
is untrusted input (a killed pytest, a full disk): a number that is not a finite count of seconds is left out."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# The JUnit property tests/conftest.py gives each test: its CPU seconds.
CPU_PROPERTY = "cpu_s"


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


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


def counted(outcomes) -> Counts:
    total = Counts()
    for outcome in outcomes:
        total.passed += outcome.counts.passed
        total.failed += outcome.counts.failed
        total.skipped += outcome.counts.skipped
    return total


def counts_line(c: Counts) -> str:
    return f"{c.passed} passed, {c.failed} failed, {c.skipped} skipped"

"""What a pass measured, kept for the next (TIMES_FILE, which .gitignore keeps out of the repository): per suite its
wall time and each test's, with the date and the host. The next pass starts the suites longest first by those
times, prints the longest tests, and says its wall time against BUDGETS."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from common.files import write_json_atomic
from harness.processes.envs import ROOT
from harness.suites.lanes import Suite, label

# What a pass measured, left behind (.gitignore keeps it out of the repository): per suite its wall time and each
# test's, with the date and the host. JUnit's reports, the only other record of a test's time, live in a suite's
# temporary folder.
TIMES_FILE = ROOT / ".test-times.json"


LONGEST_SHOWN = 10


# The full pass's budget (`--passes normal,portable`, every backend, the environments' build included), by the widest
# vector set the host has: XLA's and oneDNN's CPU kernels run half as wide without AVX-512. Set for 2 cores, where CI
# took 1,278 s from a fresh clone on an AVX-512 host (the normal pass 1,104 s with the build, then the portable pass
# 173 s), and 1,912-2,297 s at the five landings before on hosts of which the later had no AVX-512. A report, not a
# failure: a loaded host must not fail CI.
BUDGET_HOST = "a 2-core host"


# seconds, the first vector set the host has (without either: AVX2's)
BUDGETS = (("AVX-512", 900), ("AVX2", 1500))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


def budget(vector_isa: list[str] | None) -> tuple[int, str]:
    """The full pass's budget in seconds on a host with `vector_isa`, and the host it is set for."""
    isa, seconds = next(((isa, s) for isa, s in BUDGETS if isa in (vector_isa or [])), BUDGETS[-1])
    return seconds, f"{BUDGET_HOST} with {isa}"

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

import os
import time

from common import manifest, sysinfo
from common.flags import name_list
from harness.arguments import Parser, flags_of
from harness.errors import UsageError
from harness.planning.plan import parse_backends, parse_pythons
from harness.planning.request import WhatRuns
from harness.suites import times
from harness.suites.catalog import (
    PASSES,
    backend_pythons,
    compile_the_project,
    longest_first,
    pass_suites,
)
from harness.suites.kernels import Probes, caps_words
from harness.suites.lanes import run_suites
from harness.suites.records import Outcome, counted, counts_line
from harness.suites.times import (
    budget,
    longest_tests,
    measured_seconds,
    measured_suites,
    times_record,
)

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
        f"SSE4.1/SSE4.2 and one thread ({caps_words()}), to show the tests pass on any x86-64 CPU, and "
        "prints what each backend's kernels run with",
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
        flags_of(
            WhatRuns,
            "backend",
            "python",
            backend={"help": "backends whose tests to run (comma list, or all, or none)"},
            python={"help": "use this interpreter for BACKEND's tests instead of .venvs/BACKEND/"},
        ),
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
    earlier = times.read_times(times.TIMES_FILE)
    queue = longest_first(suites, measured_seconds(earlier))
    if "portable" in passes:
        # first: a few seconds, and the evidence the portable suites are read by
        queue.insert(0, Probes(interpreters))
    ran = run_suites(queue, jobs)
    outcomes = {(passes[0], name): outcome for name, outcome in unbuilt.items()}
    outcomes |= {s.key: ran[s.key] for s in suites}
    seconds, host = time.monotonic() - started, sysinfo.machine()
    last_pass = {
        "date": times.now(),
        "passes": passes,
        "backends": names,
        "wall_s": round(seconds, 1),
    }
    measured = measured_suites(suites, outcomes, last_pass["date"])
    times.keep_times(times_record(earlier, measured, host, last_pass))
    print_longest(longest_tests(outcomes))
    full = (
        set(passes) == set(PASSES) and set(names) == set(manifest.known()) and not args.pytest_args
    )
    return summarise(outcomes, passes, wall_time(seconds, host["vector_isa"], full))


def print_longest(rows: list[tuple[str, str, float, float | None]]) -> None:
    if not rows:
        return
    print(f"\n=== the {len(rows)} longest tests (wall time, CPU time) ===")
    for suite, test, seconds, cpu in rows:
        print(f"{seconds:7.1f} s {cpu_text(cpu):>9}  {suite}  {test}")


def cpu_text(cpu: float | None) -> str:
    return "" if cpu is None else f"CPU {cpu:.0f} s"


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

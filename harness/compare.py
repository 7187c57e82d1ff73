"""`python -m harness compare OLD NEW [NEW ...]`: did a run get slower or faster than another, beyond noise?

Each NEW is compared with OLD, row by row: a row is a configuration (backend, strategy with its options and
levers, devices, nodes), its figures the medians over its kept trials (harness/reporting/trials.py). The test is a
two-level bootstrap of the ratio of the median step times: the kept trials resampled with replacement, then
each resampled trial's timed steps, so that the spread between processes (which on a shared host is larger
than the spread within one) counts. A row is marked as `asv compare` marks a benchmark: `+` (slower: worse)
when its median step time grew by more than --factor and the bootstrap's (1 - --alpha) interval of the ratio
lies above 1, `-` (faster: better) for the mirror case, `~` otherwise (no significant change), `x` when the rows
are not comparable; `?` (this suite's own) marks a row present in one run only. The exit status is 1 if any row
is slower, 2 on bad input.

Rows are compared only where the comparison means something: the same initial weights and batch sequence
(hashes), the same training recipe (the config fields of harness/reporting/comparison.py's COMPARABLE), framework
versions, device kind and effective precision. Other rows are flagged with the reason, not compared; `--accept
versions` (a framework upgrade) or `--accept devices` (another machine) compares across what the user means to
change.

Rows of two runs on different machines (results.json's provenance.machine: another CPU, vector instruction sets,
usable cores or GPUs) are marked `x` with the difference named, their figures shown but not judged: such a change
in speed says nothing about the code. Where a side's machine is unknown (a report written before it was recorded),
no difference is invented: a `+` or `-` stays, noting the machine is unknown.

Above each table, one line says where the two runs' code, host or machine differ (results.json's provenance:
another commit, uncommitted changes, another host or machine), or that a side's is unknown.
"""

from __future__ import annotations

import math

from common.results import Result, load_results_json
from harness.arguments import Parser
from harness.errors import UsageError
from harness.reporting import provenance
from harness.reporting.comparison import (
    ACCEPTABLE,
    SLOWER,
    Thresholds,
    Verdict,
    compare,
    legend,
    machine_of,
)
from harness.reporting.tables import milliseconds, table

DESCRIPTION = (
    "Compare benchmark runs: per configuration, the change in images/s and step time, with a bootstrap "
    "interval of the step-time ratio over the trials and their steps; exit status 1 if a row got slower "
    "than --factor, significantly."
)


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="report directories or results.json files: the first is OLD, each other one is compared "
        "with it",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=1.1,
        help="a row is slower (faster) when its median step time is more than FACTOR times OLD's "
        "(less than 1/FACTOR) and the test is significant (default 1.1)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.05, help="significance level of the test (default 0.05)"
    )
    p.add_argument(
        "--accuracy-tolerance",
        type=float,
        default=0.01,
        metavar="ABS",
        help="flag a row whose final test accuracy moved by more than ABS (default 0.01)",
    )
    p.add_argument(
        "--accept",
        default="",
        metavar="WHAT",
        help="compare rows that differ in this anyway (comma list): versions (framework versions: "
        "an upgrade), devices (device kind and names: another machine); default: none",
    )
    return [p]


# ------------------------------------------------------------------------ output


def change(old: float | None, new: float | None) -> str:
    return "—" if not old or new is None else f"{100 * (new / old - 1):+.1f}%"


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    ms = milliseconds  # the report's: 2340, not 2.34e+03
    body = [
        [
            v.mark,
            v.key[0],
            v.key[1],
            f"{v.key[2]}" + (f" on {v.key[3]} nodes" if v.key[3] > 1 else ""),
            ms(v.old_step),
            ms(v.new_step),
            change(v.old_step, v.new_step),
            "—" if v.old_images is None else f"{v.old_images:.1f}",
            "—" if v.new_images is None else f"{v.new_images:.1f}",
            change(v.old_images, v.new_images),
            "—" if v.interval is None else f"{v.interval[0]:.3f}–{v.interval[1]:.3f}",
            f"{v.samples[0]} / {v.samples[1]}",
            v.note,
        ]
        for v in verdicts
    ]
    return table(
        [
            "",
            "backend",
            "strategy",
            "devices",
            "step ms OLD",
            "step ms NEW",
            "step",
            "images/s OLD",
            "images/s NEW",
            "images/s",
            "step ratio interval",
            "samples",
            "note",
        ],
        body,
    )


def thresholds(args) -> Thresholds:
    """The flags' thresholds, checked: bad input is a UsageError."""
    if not (math.isfinite(args.factor) and args.factor >= 1):
        raise UsageError(f"--factor must be at least 1 (got {args.factor})")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (got {args.alpha})")
    if not (math.isfinite(args.accuracy_tolerance) and args.accuracy_tolerance >= 0):
        raise UsageError(
            f"--accuracy-tolerance must be a non-negative number (got {args.accuracy_tolerance})"
        )
    accept = {w for w in args.accept.split(",") if w}
    unknown = accept - set(ACCEPTABLE)
    if unknown:
        raise UsageError(
            f"--accept takes {' and/or '.join(ACCEPTABLE)} (got {','.join(sorted(unknown))})"
        )
    return Thresholds(args.factor, args.alpha, args.accuracy_tolerance, frozenset(accept))


def load(path: str) -> tuple[list[Result], dict]:
    """A run's results and its meta (provenance included, where recorded); bad input is a UsageError."""
    try:
        return load_results_json(path)
    except ValueError as e:
        raise UsageError(str(e)) from None


def main(args) -> int:
    """`python -m harness compare`, its flags parsed (cli.build_parser)."""
    if len(args.runs) < 2:
        raise UsageError("compare needs at least two runs: OLD NEW")
    limits = thresholds(args)
    old, old_meta = load(args.runs[0])
    slower = []
    for path in args.runs[1:]:
        new, new_meta = load(path)
        machines = (machine_of(old_meta), machine_of(new_meta))
        verdicts = compare(old, new, limits, machines)
        print(f"\n## {args.runs[0]} (OLD) -> {path} (NEW)\n")
        note = provenance.difference(old_meta.get("provenance"), new_meta.get("provenance"))
        if note:
            print(note + "\n")
        print("\n".join(verdict_table(verdicts)))
        slower += [(path, v) for v in verdicts if v.mark == SLOWER]
    print("\n" + legend(limits))
    for path, v in slower:
        print(
            f"REGRESSION: {v.key[0]} {v.key[1]} on {devices_cell_key(v.key)}: step time "
            f"{change(v.old_step, v.new_step)} (interval {v.interval[0]:.3f}–{v.interval[1]:.3f}) in {path}"
        )
    return 1 if slower else 0


def devices_cell_key(key: tuple) -> str:
    return f"{key[2]} device(s)" + (f" on {key[3]} nodes" if key[3] > 1 else "")

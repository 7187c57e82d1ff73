"""`python -m harness project DIR`: a finished run's measured pieces projected to 1..1024 devices with the model
of harness/reporting/scaling.py, checked against the run's own measurements (and those of the reports of the same
machine named by --with) and against a published table.

Writes projection.md and projection.png beside the report's report.md (each whole or not at all) and prints the
Markdown. Every figure in them is a projection unless a column says "measured". The document is
harness/reporting/projected.py's.
"""

from __future__ import annotations

import math
from pathlib import Path

from common.files import write_text_atomic
from common.results import load_results_json
from harness.arguments import Parser
from harness.errors import UsageError
from harness.reporting import scaling
from harness.reporting.projected import plot, render, run_pieces

DESCRIPTION = (
    "Project a finished run to 1..1024 devices: its measured step time, gradient bytes and allreduce "
    "figure through a ring / hierarchical allreduce model on interconnect profiles (the one the run "
    "measured and declared ones), checked against the run's own measurements and a published table. "
    "Writes projection.md and projection.png into the report directory."
)


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument("directory", metavar="DIR", help="a report directory (holding results.json)")
    p.add_argument(
        "--with",
        dest="others",
        action="append",
        default=[],
        metavar="DIR",
        help="another report of the same machine whose runs join DIR's (a later sweep at more devices, "
        "to check the model against); repeatable. The projection is written into DIR",
    )
    names = ", ".join(scaling.PROFILES)
    p.add_argument(
        "--profile",
        default=",".join(scaling.DEFAULT_PROFILES),
        metavar="NAME[,NAME]",
        help=f"declared interconnects to project on: {names} (the measured one is always shown)",
    )
    p.add_argument(
        "--max-devices",
        type=int,
        default=1024,
        metavar="N",
        help="project to the powers of two up to N (default: 1024)",
    )
    p.add_argument(
        "--faster",
        type=float,
        default=1.0,
        metavar="X",
        help="on the declared profiles, devices that compute X times faster than the run's (a GPU "
        "projected from a CPU run: what the communication would cost then); default 1: the run's own",
    )
    return [p]


def check_args(args) -> list[scaling.Profile]:
    if not (args.faster > 0 and math.isfinite(args.faster)):
        raise UsageError(f"--faster must be a positive number (got {args.faster})")
    if not 1 <= args.max_devices <= 1 << 20:
        raise UsageError(f"--max-devices must be 1 to {1 << 20} (got {args.max_devices})")
    names = [n.strip() for n in args.profile.split(",") if n.strip()]
    unknown = [n for n in names if n not in scaling.PROFILES]
    if unknown or not names:
        raise UsageError(
            f"--profile {args.profile}: unknown; choose from {', '.join(scaling.PROFILES)}"
        )
    return [scaling.PROFILES[n] for n in dict.fromkeys(names)]


def main(args) -> int:
    """`python -m harness project`, its flags parsed (cli.build_parser)."""
    profiles = check_args(args)
    directory = Path(args.directory)
    results, meta = readable(directory)
    joined = []
    for other in args.others:
        runs, other_meta = of_the_same_machine(Path(other), meta)
        results, joined = results + runs, joined + [other_meta]
    if not directory.is_dir():
        raise UsageError(
            f"{directory} is a file: the projection is written into the report directory"
        )
    items = run_pieces(results)
    if not items:
        raise UsageError(
            f"{directory}: no finished run has a step time and an allreduce figure to project "
            "(runs with --timed-steps 0 have none)"
        )
    counts = scaling.powers_of_two(args.max_devices)
    try:
        plotted = plot(items, profiles, counts, args.faster, directory / "projection.png")
        text = "\n".join(render(meta, items, profiles, counts, args.faster, plotted, joined))
        write_text_atomic(directory / "projection.md", text)
    except OSError as e:
        raise UsageError(f"cannot write the projection in {directory}: {e.strerror or e}") from None
    print(text)
    print(f"Projection: {directory / 'projection.md'}")
    return 0


def readable(directory: Path) -> tuple[list, dict]:
    """A report's runs and meta (common/results.py load_results_json), or its one-line error."""
    try:
        return load_results_json(directory)
    except ValueError as e:
        raise UsageError(str(e)) from None


def of_the_same_machine(directory: Path, meta: dict) -> tuple[list, dict]:
    """--with: the runs and meta of another report, which must come from DIR's machine and device kind (one model
    fits one host's figures)."""
    results, other = readable(directory)
    mine = (meta.get("device_kind"), (meta.get("provenance") or {}).get("machine"))
    if (other.get("device_kind"), (other.get("provenance") or {}).get("machine")) != mine:
        raise UsageError(
            f"--with {directory}: another machine or device kind than the report's; a projection fits one host"
        )
    return results, other

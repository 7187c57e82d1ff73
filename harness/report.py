"""`python -m harness report DIR`: a finished report re-rendered from its results.json (report.md and the plots,
after the report format changed), or its summary table exported as csv, json or md; with --reread-traces, its
--profile breakdowns read again from its traces first (after common/profiling.py's rules changed). The report
itself, staged and written whole, is harness/reporting/document.py's."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from common import profiling
from common.files import write_json_atomic, write_text_atomic
from common.results import Result, load_results_json, profile_problem
from harness.arguments import Parser
from harness.errors import UsageError
from harness.reporting import document, reasons
from harness.reporting.tables import summary_records, summary_table, with_scaling

DESCRIPTION = (
    "Re-render a report's report.md and plots from its results.json (after the report format changed), "
    "or, with --format, print its summary table as CSV, JSON or Markdown; with --reread-traces, read each "
    "--profile breakdown again from its trace first."
)
FORMATS = ("md", "csv", "json")


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument("directory", metavar="DIR", help="a report directory (holding results.json)")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="print the summary table in this format instead of re-rendering the report",
    )
    p.add_argument(
        "--reread-traces",
        action="store_true",
        help="read each run's --profile breakdown again from its trace in the report (after the rules that read "
        "a trace changed) and write it, with the figures made from it, into results.json before re-rendering",
    )
    return [p]


def export(results: list[Result], form: str) -> str:
    """The summary table as text: md (the report's table), csv (a header and a line per configuration) or json."""
    rows = with_scaling(results)
    if form == "md":
        return "\n".join(summary_table(rows)) + "\n"
    records = summary_records(rows)
    if form == "json":
        return json.dumps(records, indent=2) + "\n"
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=list(records[0]) if records else ["backend"], lineterminator="\n"
    )
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def rerender(directory: Path, results: list[Result], meta: dict) -> None:
    """report.md and the plots written anew beside results.json, which is left as it is (the raw numbers)."""
    write_text_atomic(
        directory / "report.md",
        document.render(
            results, meta, document.draw_plots(with_scaling(results), directory, meta.get("parity"))
        ),
    )


def reread_traces(directory: Path) -> tuple[int, int, list[str]]:
    """Every breakdown of the report (its runs' and parity's idioms') read again from its trace by this version's
    rules, with what is made from them (device busy, parity's breakdowns and reasons), into results.json (written
    whole or not at all); the rest of the file as it was. A report is never made worse by reading it again: a
    trace that is not there or does not read cleanly into finite figures leaves its stored breakdown as it was,
    and a line says why. (traces read, traces named, the lines of those kept)."""
    path = directory / "results.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    read, named, kept = 0, 0, []
    records = [(run_name(run), run) for run in doc["runs"]]
    records += [
        (f"idiom {i.get('idiom')} trial {i.get('trial')}", i)
        for i in (doc.get("parity") or {}).get("idioms") or []
        if isinstance(i, dict)
    ]
    reread = set()
    for name, record in records:
        profile = record.get("profile")
        if not (isinstance(profile, dict) and profile.get("trace")):
            continue
        named += 1
        try:
            problem = profile_problem(profile)
            if problem:
                raise profiling.TraceError(f"its stored profile is not one ({problem})")
            fresh = profiling.reread(profile, directory)
            problem = profile_problem(fresh)
            if problem:
                raise profiling.TraceError(problem)
        except profiling.TraceError as e:
            why = " ".join(str(e).split())  # one line
            kept.append(f"{name}: {profile['trace']}: {why}; its stored breakdown kept")
            continue
        record["profile"] = fresh
        reread.add(id(record))
        read += 1
    for run in doc["runs"]:
        if id(run) not in reread:
            continue  # its profile as stored, and so what is made of it
        # made anew from the profile just read (Result.from_dict's); a run without one is left without the field
        busy = Result.from_dict({**run, "device_busy": None}).device_busy
        if busy is not None or "device_busy" in run:
            run["device_busy"] = busy
    if isinstance(doc.get("parity"), dict):
        runs = [Result.from_dict(run) for run in doc["runs"]]
        kept += reasons.reread_breakdowns(doc["parity"], runs)
    write_json_atomic(path, doc)
    return read, named, kept


def run_name(run: dict) -> str:
    """A run of results.json as the report's lines name it: backend, strategy, devices (and its trial)."""
    result = Result.from_dict(run)
    c = result.config
    trial = run.get("trial")
    return f"{c.backend} {c.variant} x{c.devices}" + (f" trial {trial}" if trial else "")


def main(args) -> int:
    """`python -m harness report`, its flags parsed (cli.build_parser)."""
    directory = Path(args.directory)
    try:
        results, meta = load_results_json(directory)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.format:
        print(export(results, args.format), end="")
        return 0
    if not directory.is_dir():
        raise UsageError(
            f"{directory} is a file: re-rendering needs the report directory (or use --format)"
        )
    try:
        kept = []
        if args.reread_traces:
            read, named, kept = reread_traces(directory)
            print(f"Re-read {read} of {named} trace(s) into {directory / 'results.json'}")
            for line in kept:
                print(line, file=sys.stderr)
            results, meta = load_results_json(directory)
        rerender(directory, results, meta)
    except OSError as e:
        raise UsageError(f"cannot write the report in {directory}: {e.strerror or e}") from None
    print(f"Report: {directory / 'report.md'}")
    return 1 if kept else 0

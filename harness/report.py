"""`python -m harness report DIR`: a finished report re-rendered from its results.json (report.md and the plots,
after the report format changed), or its summary table exported as csv, json or md; with --reread-traces, its
--profile breakdowns read again from its traces first (after common/profiling.py's rules changed). The report
itself, staged and written whole, is harness/reporting/document.py's."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from common import profiling
from common.files import write_json_atomic, write_text_atomic
from common.results import Result, load_results_json
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


def reread_traces(directory: Path) -> int:
    """Every breakdown of the report (its runs' and parity's idioms') read again from its trace by this version's
    rules, with what is made from them (device busy, parity's breakdowns and reasons), into results.json; the
    rest of the file as it was. The number of traces read."""
    path = directory / "results.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    read = 0
    for record in [*doc["runs"], *((doc.get("parity") or {}).get("idioms") or [])]:
        profile = record.get("profile")
        if isinstance(profile, dict) and profile.get("trace"):
            record["profile"] = profiling.reread(profile, directory)
            read += record["profile"] is not profile
    for run in doc["runs"]:
        # made anew from the profile just read (Result.from_dict's); a run without one is left without the field
        busy = Result.from_dict({**run, "device_busy": None}).device_busy
        if busy is not None or "device_busy" in run:
            run["device_busy"] = busy
    if isinstance(doc.get("parity"), dict):
        runs = [Result.from_dict(run) for run in doc["runs"]]
        reasons.reread_breakdowns(doc["parity"], runs)
    write_json_atomic(path, doc)
    return read


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
        if args.reread_traces:
            print(f"Re-read {reread_traces(directory)} trace(s) into {directory / 'results.json'}")
            results, meta = load_results_json(directory)
        rerender(directory, results, meta)
    except OSError as e:
        raise UsageError(f"cannot write the report in {directory}: {e.strerror or e}") from None
    print(f"Report: {directory / 'report.md'}")
    return 0

"""`python -m harness report DIR`: a finished report re-rendered from its results.json (report.md and the plots,
after the report format changed), or its summary table exported as csv, json or md. The report itself, staged and
written whole, is harness/reporting/document.py's."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from common.files import write_text_atomic
from common.results import Result, load_results_json
from harness.arguments import Parser, UsageError
from harness.reporting import document
from harness.reporting.tables import summary_records, summary_table, with_scaling

DESCRIPTION = (
    "Re-render a report's report.md and plots from its results.json (after the report format changed), "
    "or, with --format, print its summary table as CSV, JSON or Markdown."
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
        rerender(directory, results, meta)
    except OSError as e:
        raise UsageError(f"cannot write the report in {directory}: {e.strerror or e}") from None
    print(f"Report: {directory / 'report.md'}")
    return 0

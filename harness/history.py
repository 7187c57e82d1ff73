"""`python -m harness history [DIR ...]`: each configuration's figures across many reports, in time order.

A DIR is a report folder (holding results.json) or a folder of them (reports/, the default). A configuration is a
row of `compare` (backend, strategy with its options and levers, devices, nodes) with the training recipe that makes
its figures comparable (compare's COMPARABLE fields and the device kind): a report that trains another recipe starts
a history of its own rather than a false step. For each, in the order the reports started: the suite commit that
made it, the median step time, images/s, time to target where the runs had one, and `compare`'s mark against the
report before it (`+` slower, `-` faster, `~` no significant change, `x` not comparable: asv's marks, at compare's
defaults). A slow drift over many commits shows as a line that climbs; a step beyond noise is marked where it
happened. A report made on another machine than the one before it (another CPU, vector instruction sets, usable
cores or GPUs: results.json's provenance.machine) is marked `x` with the difference named, as compare marks it: its
step says nothing about the code.

It writes history.md and a plot per configuration with at least two reports into --out (default history/), and
prints the Markdown. A folder that is not a readable report is skipped with one line on the standard error; where
none is readable, that is the one line of the error. A report that a later one resumed (`--resume`) is skipped too,
with its line: the resumed report holds its finished runs as they were, so they count once.
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from common.results import Result, load_results_json
from harness.arguments import Parser
from harness.errors import UsageError
from harness.reporting import comparison
from harness.reporting.comparison import Thresholds
from harness.reporting.tables import milliseconds, table
from harness.reporting.trials import Trials, group

DESCRIPTION = (
    "Show each configuration's step time, images/s and time to target across reports, in time order, with the "
    "suite commit of each and compare's mark (+ slower, - faster, ~ no change, x not comparable: another machine, "
    "say) against the "
    "report before it; writes history.md and a plot per configuration."
)


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument(
        "folders",
        nargs="*",
        default=["reports"],
        metavar="DIR",
        help="report folders, or folders of report folders (default: reports)",
    )
    p.add_argument(
        "--out",
        default="history",
        help="where history.md and the plots are written (default: history)",
    )
    return [p]


@dataclass
class Report:
    path: Path
    started: str
    commit: str
    results: list[Result]
    machine: dict | None = None  # provenance.machine (None: not recorded)
    resumed: str | None = None  # the name of the report folder this one resumed (None: none)


@dataclass
class Point:
    report: Report
    trials: Trials
    mark: str = ""  # compare's mark against the configuration's previous report ("" for the first)
    note: str = ""


def find_reports(folders: list[str], say) -> list[Report]:
    """The readable reports under `folders`, in the order they started; each folder that is not one is said."""
    reports, seen = [], set()
    for folder in map(Path, folders):
        if not folder.is_dir():
            say(f"skipped {folder}: not a folder")
            continue
        candidates = (
            [folder]
            if (folder / "results.json").exists()
            else sorted(p for p in folder.iterdir() if p.is_dir())
        )
        for path in candidates:
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                results, meta = load_results_json(path)
            except ValueError as e:
                say(f"skipped {path}: {e}")
                continue
            report = Report(
                path, meta["started"], commit_of(meta), results, comparison.machine_of(meta)
            )
            report.resumed = resumed_from(meta)
            reports.append(report)
    return sorted(superseded_dropped(reports, say), key=lambda r: (r.started, str(r.path)))


def resumed_from(meta: dict) -> str | None:
    """The name of the report folder a resumed report took up (its meta's `resumed.from`), or None."""
    resumed = meta.get("resumed")
    source = resumed.get("from") if isinstance(resumed, dict) else None
    return Path(source).name if isinstance(source, str) and source else None


def superseded_dropped(reports: list[Report], say) -> list[Report]:
    """The reports less those another one resumed: the resumed report holds their finished runs as they were, so
    counting both would count those runs twice. Each one dropped is said."""
    takers = {r.resumed: r for r in reports if r.resumed}
    kept = []
    for report in reports:
        taker = takers.get(report.path.name)
        if taker is not None and taker is not report:
            say(f"skipped {report.path}: {taker.path} resumed it and holds its finished runs")
            continue
        kept.append(report)
    return kept


def commit_of(meta: dict) -> str:
    """The suite commit that made a report, short, with a `+` for uncommitted changes; `?` where unknown."""
    provenance = meta.get("provenance") or {}
    commit = provenance.get("commit")
    if not commit:
        return "?"
    return commit[:7] + ("+" if provenance.get("uncommitted_changes") else "")


def series_key(t: Trials) -> tuple:
    """A history's configuration: compare's row and what makes two reports' figures comparable."""
    c = t.config
    return (*comparison.row_key(t), c.device_kind, *(getattr(c, f) for f in comparison.COMPARABLE))


def histories(reports: list[Report]) -> dict[tuple, list[Point]]:
    """Each configuration's points, in report order, each marked against the one before."""
    out: dict[tuple, list[Point]] = {}
    for report in reports:
        for trials in group(report.results):
            if not trials.kept:
                continue
            out.setdefault(series_key(trials), []).append(Point(report, trials))
    for points in out.values():
        for before, point in zip(points, points[1:]):
            machines = (before.report.machine, point.report.machine)
            verdict = comparison.judge(before.trials, point.trials, Thresholds(), machines)
            point.mark, point.note = verdict.mark, verdict.note
    return out


def step_of(t: Trials) -> float | None:
    samples = t.step_samples()
    return statistics.median(samples) if samples else None


def target_of(t: Trials) -> str:
    """The median time to target over every finished trial, as the report counts them (tables.targets): trials
    are not dropped for their convergence."""
    records = [r.target for r in t.runs if r.ok and r.target]
    reached = [record["train_s"] for record in records if record["reached"]]
    if not records:
        return "—"
    return f"{statistics.median(reached):.1f}" if reached else "not reached"


def energy_of(t: Trials) -> str:
    """The median joules per epoch of the trials that measured energy (the report's Energy section)."""
    measured = comparison.energy_per_epoch(t)
    return "—" if measured is None else f"{measured[1]:.4g}"


def title(key: tuple) -> str:
    """backend strategy, devices: the recipe (model, batch, training images, epochs)."""
    backend, variant, devices, nodes, kind = key[:5]
    recipe = dict(zip(comparison.COMPARABLE, key[5:]))
    where = f"{devices} {kind.upper()}" + (f" on {nodes} nodes" if nodes > 1 else "")
    images = "all" if recipe["train_size"] is None else f"{recipe['train_size']:,}"
    return (
        f"{backend} {variant}, {where}: {recipe['model']}, batch {recipe['batch_size']}, {images} images, "
        f"{recipe['epochs']} epoch(s)"
    )


def history_table(points: list[Point]) -> list[str]:
    body = [
        [
            p.report.path.name,
            p.report.started,
            p.report.commit,
            milliseconds(step_of(p.trials)),
            "—"
            if p.trials.median("images_per_s") is None
            else f"{p.trials.median('images_per_s'):.1f}",
            target_of(p.trials),
            energy_of(p.trials),
            p.mark,
            p.note,
        ]
        for p in points
    ]
    header = [
        "report",
        "started",
        "commit",
        "step ms",
        "images/s",
        "time to target s",
        "J/epoch",
        "",
        "note",
    ]
    return table(header, body)


def document(series: dict[tuple, list[Point]], plotted: dict[tuple, str]) -> str:
    """A section per configuration seen in several reports; those seen in one, listed after them."""
    L = ["# History", "", comparison.legend(Thresholds()), ""]
    ordered = sorted(series.items(), key=lambda kv: title(kv[0]))
    for key, points in ordered:
        if len(points) > 1:
            L += [f"## {title(key)}", ""] + history_table(points) + [""]
            L += [f"![{title(key)}]({plotted[key]})", ""] if key in plotted else []
    once = [
        f"- {title(key)}: {points[0].report.path.name}"
        for key, points in ordered
        if len(points) == 1
    ]
    if once:
        L += ["## In one report only", ""] + once + [""]
    return "\n".join(L)


def plot(points: list[Point], name: str, path: Path) -> None:
    from harness.reporting.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    steps = [1e3 * (step_of(p.trials) or float("nan")) for p in points]
    ax.plot(range(len(points)), steps, marker="o")
    for i, p in enumerate(points):
        if p.mark in (comparison.SLOWER, comparison.FASTER):
            ax.annotate(
                p.mark, (i, steps[i]), textcoords="offset points", xytext=(0, 8), ha="center"
            )
    ax.set_xticks(range(len(points)), [p.report.commit for p in points], rotation=45, fontsize=7)
    ax.set_xlabel("report (suite commit), in time order")
    ax.set_ylabel("median step ms")
    ax.set_title(name, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def file_name(key: tuple) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", title(key)).strip("-") + ".png"


def main(args) -> int:
    """`python -m harness history`, its flags parsed (cli.build_parser)."""
    skipped: list[str] = []
    reports = find_reports(args.folders, skipped.append)
    if not reports:  # one line: the first folder skipped says why
        why = f" ({skipped[0].removeprefix('skipped ')}" if skipped else ""
        more = f"; {len(skipped) - 1} more skipped" if len(skipped) > 1 else ""
        raise UsageError(
            f"no readable report in {', '.join(args.folders)}{why}{more}{')' if why else ''}"
        )
    for line in skipped:
        print(line, file=sys.stderr)
    series = histories(reports)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        plotted = {}
        for key, points in series.items():
            if len(points) > 1:
                plot(points, title(key), out / file_name(key))
                plotted[key] = file_name(key)
        text = document(series, plotted)
        (out / "history.md").write_text(text + "\n")
    except OSError as e:
        raise UsageError(
            f"--out {out}: cannot be written ({e.strerror or type(e).__name__})"
        ) from None
    print(text)
    print(f"\nHistory: {out / 'history.md'}", file=sys.stderr)
    return 0

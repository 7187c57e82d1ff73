"""One benchmark session (session/__init__.py): plan, stage, check, run, report. The runs themselves are carried
out one at a time by runs.py; --dry-run's lines are dryrun.py's."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from common.config import RunConfig
from common.files import write_json_atomic
from harness.checking import workers
from harness.errors import UsageError
from harness.planning.plan import Devices, Plan, build_plan
from harness.planning.request import RunRequest
from harness.processes import disk, interrupts, runner
from harness.reporting import document, leftovers, provenance, tables
from harness.session import resume
from harness.session.dryrun import best_lines, dry_run
from harness.session.runs import Finished, execute, not_run, stage_kept


@dataclass
class Session:
    """What a session's work runs with: the plan, the request, the console, the report's meta (the work may add to
    it: parity's figures), the staging folder it writes in, and the report it resumes (None: a fresh one)."""

    plan: Plan
    request: RunRequest
    console: runner.Console
    meta: dict
    workdir: Path
    earlier: resume.Earlier | None = None


class Work(Protocol):
    """What a session runs between its plan and its report: run's planned runs (PlannedRuns), or parity's trials
    (session/paired.py's Trials)."""

    def reachable(self, plan: Plan) -> list[tuple[RunConfig, int]]:
        """Every (config, trial) it may run: each finished run of a resumed report must be one of them."""

    def nothing_left(self, earlier: resume.Earlier, plan: Plan, request: RunRequest) -> bool:
        """Whether the resumed report finished all it would run: then nothing is resumed and no report written."""

    def carry_out(self, session: Session) -> list[dict]:
        """The work done: the report's runs."""


@dataclass(frozen=True)
class PlannedRuns:
    """run's work: the equivalence check, then every planned run, each trial of it (run_all)."""

    def reachable(self, plan: Plan) -> list[tuple[RunConfig, int]]:
        return plan.runs

    def nothing_left(self, earlier: resume.Earlier, plan: Plan, request: RunRequest) -> bool:
        return resume.nothing_left(earlier, plan.runs, request.each_run.check)

    def carry_out(self, session: Session) -> list[dict]:
        return run_all(session)


def run_benchmark(
    request: RunRequest,
    argv: list[str],
    work: Work = PlannedRuns(),
    earlier: resume.Earlier | None = None,
) -> int:
    """Plan, do the work, report. With `earlier` (--resume), its finished runs and check are kept (resume.py), if
    every one is a run the work may run (`work.reachable`). One resume of a report at a time
    (resume.one_at_a_time); a report with nothing left to run is not resumed."""
    if earlier is None:
        return benchmark(request, argv, work)
    with resume.one_at_a_time(earlier.folder):
        plan = build_plan(request)
        resume.check_configurations(earlier, work.reachable(plan))
        if work.nothing_left(earlier, plan, request):
            print(
                f"--resume {earlier.folder}: every run it plans finished there: nothing to resume, "
                "no report written",
                file=sys.stderr,
            )
            return 0
        return benchmark(request, argv, work, earlier, plan)


def benchmark(
    request: RunRequest,
    argv: list[str],
    work: Work,
    earlier: resume.Earlier | None = None,
    plan: Plan | None = None,
) -> int:
    plan = plan or build_plan(request)
    if request.output.dry_run:
        print("\n".join(dry_run(plan, request)))
        return 0
    console = runner.Console(quiet=request.output.quiet)
    meta = {
        "command": "python -m harness " + " ".join(shlex.quote(a) for a in argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "preset": plan.preset,
        "device_kind": plan.device_kind,
        "gpus": plan.gpus,
        "detection": plan.detection,
        "data_source": plan.data_source,
        "backends": sorted(plan.backends),
        "topology": plan.topology.how,
        "provenance": provenance.record(gpus=plan.gpus),  # the code and host as the run starts
        **({"best": plan.best} if plan.best else {}),
        **(
            {"resumed": {"from": str(earlier.folder), "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}}
            if earlier
            else {}
        ),
    }
    for line in leftovers.keep_left_behind(Path(request.output.out), document.write):
        console.say(line)
    with create_staging(request.output.out, sorted(plan.backends), meta) as staging:
        results = work.carry_out(Session(plan, request, console, meta, staging.path, earlier))
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        interrupts.finishing()  # from here on a signal must not lose the results: it only sets the exit status
        final = save_report(staging, results, meta)
    console.say(
        "\n" + "\n".join(tables.summary_table(tables.with_scaling(tables.as_results(results))))
    )
    if final is None:
        return interrupts.exit_status() or 1
    console.say(f"\nReport: {final / 'report.md'}")
    # the standard output holds this one line, for `dir=$(python -m harness ...)` and tools
    print(json.dumps(summary_line(final, results)) if request.output.json else final)
    bad = [r for r in results if r["status"] not in ("ok", "unavailable")]
    return interrupts.exit_status() or (1 if bad else 0)


def summary_line(report: Path, results: list[dict]) -> dict:
    """--json: the report's folder and each configuration's summary figures (`harness report --format json`'s)."""
    rows = tables.with_scaling(tables.as_results(results))
    return {"report": str(report), "runs": tables.summary_records(rows)}


def create_staging(out: str, backends: list[str], meta: dict) -> document.Staging:
    """The report's staging directory, with its owner and the run's header, made before any work starts: an
    --out that cannot hold a report (under a file, read-only, full, a name too long) fails now, in one line,
    not after hours of training, and leaves nothing behind."""
    staging = document.Staging(Path(out), backends)
    try:
        staging.create()
        staging.save_meta(meta)
    except OSError as e:
        if staging.path is not None:
            shutil.rmtree(staging.path, ignore_errors=True)
        raise UsageError(f"--out {out}: {disk.not_written(out, e)}") from None
    return staging


def run_all(session: Session) -> list[dict]:
    """The equivalence check, then every run. An interrupt (Ctrl-C, SIGTERM, SIGHUP) at any point ends
    them: the runs that finished keep their results, the others are reported as interrupted. With a resumed
    report (--resume): its finished check and runs are kept."""
    plan, console, meta, workdir = session.plan, session.console, session.meta, session.workdir
    request, earlier = session.request, session.earlier
    results = [runner.not_run_result(cfg, "unavailable", reason) for cfg, reason in plan.not_run]
    finished = Finished(workdir)
    try:
        # Printed even with --quiet: which devices ran is what a result means, and it is one line.
        console.say(Devices(plan.device_kind, plan.gpus, plan.detection).line)
        if plan.topology.how:
            console.say(f"Nodes: {plan.topology.how}")
        if not plan.topology.loopback and plan.topology.node_rank:
            console.say(
                f"This host is node {plan.topology.node_rank}: node 0's host writes the run's report; this "
                "one keeps its own logs and per-node results"
            )
        cfg0 = (plan.configs or [c for c, _ in plan.not_run])[0]
        console.say(
            f"Preset: {plan.preset}: {cfg0.model}, {cfg0.epochs} epoch(s), "
            f"train {cfg0.train_size or 'all'} / test {cfg0.test_size or 'all'} images; "
            f"{len(plan.runs)} run(s)"
            + (f" ({plan.repeat} trials each)" if plan.repeat > 1 else "")
        )
        for line in best_lines(plan):
            console.say(line)
        stage_kept(plan, earlier, workdir, console.say)
        if request.each_run.check and earlier and earlier.equivalence:
            meta["equivalence"] = earlier.equivalence
            save_meta(workdir, meta)
        elif request.each_run.check:
            # replaced by the table if the check finishes
            meta["equivalence"] = {"interrupted": True}
            meta["equivalence"] = workers.equivalence(plan, console.say, workdir / "logs")
            save_meta(workdir, meta)
        execute(plan, workdir, console, finished, earlier)
    except KeyboardInterrupt as e:
        by = str(e) or "the user"
        console.say(
            f"Interrupted ({str(e) or 'SIGINT'}): writing the report with the runs finished so far"
        )
        # execute() keeps one result per config, in order: the first one left was running (if it had started),
        # the rest never started
        left = plan.runs[len(finished.results) :]
        finished.results += [
            (earlier.kept(cfg, trial) if earlier else None)
            or not_run(
                cfg, trial, "interrupted", interrupted_why(by, running=finished.running and i == 0)
            )
            for i, (cfg, trial) in enumerate(left)
        ]
    return results + finished.results


def save_meta(workdir: Path, meta: dict) -> None:
    """The header again, with the check that finished: a killed harness's report keeps it too."""
    try:
        write_json_atomic(workdir / leftovers.META, meta)
    except OSError:
        pass  # a full disk: the check is in the report written at the end


def interrupted_why(by: str, running: bool) -> str:
    """What a run the interrupt ended says: stopped while it ran, or never started."""
    return (
        f"interrupted by {by}"
        if running
        else f"not started: the harness was interrupted by {by} first"
    )


def save_report(staging: document.Staging, results: list[dict], meta: dict) -> Path | None:
    """The report's directory; None if it could not be written (a full disk, say), after one line
    saying where the results were kept instead."""
    try:
        return staging.commit(results, meta)
    except OSError as e:
        kept = staging.rescue(results, meta)
        print(
            f"harness: error: could not write the report in {staging.out}: {e.strerror or e} "
            f"({disk.free_at(staging.out)} free there); the results are kept in {kept}",
            file=sys.stderr,
        )
        return None

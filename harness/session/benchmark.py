"""One benchmark session (session/__init__.py): plan, stage, check, run, report."""

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
from harness.processes import devices, disk, envs, interrupts, runner
from harness.reporting import document, leftovers, provenance, tables
from harness.session import resume


def backend_python(name: str, plan: Plan, say) -> str:
    if name in plan.pythons:
        return plan.pythons[name]
    return str(envs.ensure_backend(name, plan.backends[name].requirements, say=say))


class Finished:
    """The runs that finished, in plan order (`results`), and whether the one after them had started
    (`running`): what the rows of an interrupt say. A run is kept, and `running` cleared, in one step that a stop
    signal waits for (`keep`, which runner.run calls before it announces the run). With a staging folder
    (`workdir`), each is on disk as it is kept, and the run that starts is too, as the interrupted row it becomes
    if the harness is killed (reporting/leftovers.py)."""

    def __init__(self, workdir: Path | None = None):
        self.results: list[dict] = []
        self.running = False
        self.workdir = workdir

    def start(self, cfg=None, trial: int | None = None) -> None:
        self.running = True
        if self.workdir is not None and cfg is not None:
            row = not_run(
                cfg, trial, "interrupted", f"interrupted: {leftovers.KILLED} while it ran"
            )
            try:
                leftovers.stage_running(self.workdir, row)
            except OSError:
                pass  # (a full disk: the run fails on its own config's write, in one line)

    def keep(self, result: dict, staged: bool = False) -> None:
        with interrupts.held():
            self.results.append(result)
            self.running = False
            if self.workdir is not None and not staged:
                try:
                    leftovers.stage_record(self.workdir, len(self.results) - 1, result)
                except OSError:
                    pass  # a full disk: the run is kept all the same, for the report written at the end


def execute(
    plan: Plan,
    workdir: Path,
    console: runner.Console,
    finished: Finished,
    earlier: resume.Earlier | None = None,
) -> None:
    """Run the planned runs (plan.runs: each config, and each trial with --repeat) in order, keeping each one's
    result in `finished` as it ends, before it is announced; never lets one failure stop the others. An interrupt
    propagates: `finished` then holds the runs that finished, and plan.runs[len(finished.results):] are the ones
    that did not (the first of them running if `finished.running`). With `earlier` (--resume), a run that
    finished there is kept, not run again (its record already staged: stage_kept)."""
    pythons = Pythons(plan, console.say)
    for cfg, trial in plan.runs:
        kept = earlier.kept(cfg, trial) if earlier else None
        if kept is not None:
            finished.keep(kept, staged=True)
        else:
            finished.start(cfg, trial)
            run_one(cfg, trial, pythons, workdir, console, keep=finished.keep)


def stage_kept(plan: Plan, earlier: resume.Earlier | None, workdir: Path, say) -> None:
    """A resume's kept runs staged as finished ones, before anything else runs: their logs, MLPerf logs and traces
    copied, then their records written at once (leftovers.stage_records), so that a kill at any instant leaves a
    folder whose resume keeps them: the one resumed (before they are staged) or this one's -killed report (after);
    each one said."""
    if earlier is None:
        return
    kept = {i: (cfg, trial, earlier.kept(cfg, trial)) for i, (cfg, trial) in enumerate(plan.runs)}
    kept = {i: run for i, run in kept.items() if run[2] is not None}
    if not kept:
        return
    problems = {
        i: resume.copy_records(record, earlier, workdir) for i, (*_, record) in kept.items()
    }
    try:
        leftovers.stage_records(workdir, {i: record for i, (*_, record) in kept.items()})
    except OSError as e:
        say(
            f"--resume: the kept runs could not be staged ({e.strerror or e}): were the harness killed now, "
            f"resume {earlier.folder} again"
        )
    for i, (cfg, trial, _) in kept.items():
        problem = problems[i]
        say(
            f"[{runner.label(cfg)}{f' trial {trial}' if trial else ''}] kept from {earlier.folder}: finished there"
            + (f" ({problem})" if problem else "")
        )


def kept_run(
    cfg, trial: int | None, earlier: resume.Earlier | None, workdir: Path, say, keep=None
) -> dict | None:
    """The run's record from the report resumed, its log and trace copied into this one, if it finished there;
    handed to `keep` (if given) before it is said, the two held against a stop signal."""
    kept = earlier.kept(cfg, trial) if earlier else None
    if kept is not None:
        problem = resume.copy_records(kept, earlier, workdir)
        with interrupts.held():
            if keep is not None:
                keep(kept)
            say(
                f"[{runner.label(cfg)}{f' trial {trial}' if trial else ''}] kept from {earlier.folder}: finished there"
                + (f" ({problem})" if problem else "")
            )
    return kept


class Pythons:
    """Each backend's interpreter, its environment built on first use; a build that failed is not retried."""

    def __init__(self, plan: Plan, say):
        self.plan, self.say = plan, say
        self.known: dict[str, str | envs.EnvError] = {}

    def __call__(self, name: str) -> str | envs.EnvError:
        if name not in self.known:
            try:
                self.known[name] = backend_python(name, self.plan, self.say)
            except envs.EnvError as e:
                self.known[name] = e
        return self.known[name]


def run_one(
    cfg, trial: int | None, pythons: Pythons, workdir: Path, console: runner.Console, keep=None
) -> dict:
    """One planned run's result: the worker's, or a failed row if its environment could not be built; handed to
    `keep` (if given) before the run is announced, with no stop signal between the two (runner.run)."""
    python = pythons(cfg.backend)
    if isinstance(python, Exception):
        result = not_run(cfg, trial, "failed", f"environment setup failed: {python}")
        return runner.ended(cfg, result, console, keep)
    return runner.run(cfg, python, workdir, console, trial, keep=keep)


def not_run(cfg, trial: int | None, status: str, reason: str) -> dict:
    result = runner.not_run_result(cfg, status, reason)
    return result if trial is None else {**result, "trial": trial}


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


def dry_run(plan: Plan, request: RunRequest) -> list[str]:
    """--dry-run: the devices, every run in the order it would start, every refusal with its reason, and the
    environments each backend would use (built on first use)."""
    lines = [
        "Dry run: nothing is trained and no environment is built.",
        Devices(plan.device_kind, plan.gpus, plan.detection).line,
    ]
    if plan.topology.how:
        lines.append(f"Nodes: {plan.topology.how}")
    lines.append(f"Preset: {plan.preset}")
    lines.append(f"Would run {len(plan.runs)} run(s), in this order:")
    for cfg, trial in plan.runs:
        lines.append(f"  {run_line(cfg, trial)}")
    if plan.not_run:
        lines.append("Would not run:")
        lines += [f"  {runner.label(cfg)}: {reason}" for cfg, reason in plan.not_run]
    lines += best_lines(plan)
    if request.each_run.check:
        lines.append(
            "Before them, the equivalence check of these configurations (--no-check skips it)."
        )
    for name in sorted(plan.backends):
        lines.append(f"Environment of {name}: {environment_line(name, plan)}")
    return lines


def best_lines(plan: Plan) -> list[str]:
    """--best: what it switched on for each backend, or that its best is its default (one row), and why."""
    if not plan.best:
        return []
    return ["--best (each backend.toml's [best]):"] + [f"  {note}" for note in plan.best.values()]


def run_line(cfg, trial: int | None) -> str:
    target = f", stop at test accuracy {cfg.target_accuracy:g}" if cfg.target_accuracy else ""
    return (
        f"{runner.label(cfg)}{f' trial {trial}' if trial else ''}: {cfg.model}, batch {cfg.batch_size}, "
        f"lr {cfg.lr:g}, {cfg.epochs} epoch(s){target}, train {cfg.train_size or 'all'} / test "
        f"{cfg.test_size or 'all'} images"
    )


def environment_line(name: str, plan: Plan) -> str:
    if name in plan.pythons:
        return f"{plan.pythons[name]} (--python)"
    requirements = envs.requirements_for(plan.backends[name].requirements, devices.driver_version())
    where = (envs.VENVS / name).relative_to(envs.ROOT)
    state = "ready" if envs.is_current(name, requirements) else "would be built on first use"
    return f"{where} from {requirements.relative_to(envs.ROOT)} ({state})"


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

"""The planned runs of a session, one at a time (session/__init__.py): each backend's interpreter, its environment
built on first use (`Pythons`); one run's result, the worker's or a failed row (`run_one`); every run in plan order
(`execute`), each kept as it ends, before it is announced, in `Finished`, which says what an interrupt's rows are;
and a resumed report's finished runs kept instead of run again (`stage_kept`, `kept_run`). Run's work and parity's
both run their runs through here."""

from __future__ import annotations

from pathlib import Path

from harness.planning.plan import Plan
from harness.processes import envs, interrupts, runner
from harness.reporting import leftovers
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

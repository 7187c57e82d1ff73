"""Parity's trials, the work of a `python -m harness parity` session: every strategy beside its framework's idiom
(session/idioms.py) on one device, in interleaved trials (the order reversed every other trial); after the first
`--repeat`, the sequential rule adds a trial of each side for every strategy still undecided, up to `--max-trials`;
then the figures: per strategy its median step over its idiom's, the two-level bootstrap interval `compare` uses
at 1 - ALPHA / looks, and the verdict read off it."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from common.config import RunConfig
from common.results import Result
from harness.planning.plan import Devices, Plan
from harness.processes import interrupts, runner
from harness.reporting.comparison import ratio_interval
from harness.reporting.reasons import breakdown_reason, profiled_pair
from harness.reporting.tables import as_results
from harness.session import benchmark, resume
from harness.session.idioms import (
    IdiomRun,
    announce,
    failed_idiom,
    idiom_of,
    kept_idiom,
    run_idiom,
)
from harness.session.runs import Pythons, kept_run, not_run, run_one

LIMIT = 1.10  # the most a strategy's step may cost over its idiom's


# Above this ratio a strategy's row says where its step loses time to its idiom's (the --profile breakdowns of
# both), if no measured reason is known (harness/reporting/reasons.py).
EXPLAINED = 1.05


ALPHA = 0.05  # the interval's: 95%


# Where a strategy is slower than LIMIT for a reason the suite chooses or the framework imposes, measured:
# (backend, strategy) -> the reason and its measured cost. The report prints it beside the row.
KNOWN_COSTS: dict[tuple[str, str], str] = {}


def schedule(plan: Plan) -> list[tuple[int, RunConfig | IdiomRun]]:
    """The first `--repeat` trials of every side, interleaved (round())."""
    return [run for trial in range(1, plan.repeat + 1) for run in round_of(plan.configs, trial)]


def round_of(configs: list[RunConfig], trial: int) -> list[tuple[int, RunConfig | IdiomRun]]:
    """One trial of each of `configs` and of their idioms: per backend, its idioms then its strategies, the
    order reversed every other trial. The first trial of each side records its --profile steps (the breakdowns a
    row's reason is read from); the others do not."""
    if trial > 1:
        configs = [dataclasses.replace(c, profile=0) for c in configs]
    runs = []
    for backend in sorted({c.backend for c in configs}):
        mine = [c for c in configs if c.backend == backend]
        idioms = {idiom_of(c): IdiomRun(idiom_of(c), c) for c in mine}
        sides = [*idioms.values(), *mine]
        runs += [(trial, side) for side in (sides if trial % 2 else sides[::-1])]
    return runs


def looks(repeat: int, max_trials: int) -> int:
    """How often the sequential rule may read the intervals: after the first `repeat` trials, then after each
    added one."""
    return max(1, max_trials - repeat + 1)


def undecided(figures: dict, configs: list[RunConfig]) -> list[RunConfig]:
    """The strategies whose interval is not clear of the lines yet ("inconclusive"); one without an interval (a
    side that finished no trial) is not retried."""
    open_rows = {
        (r["backend"], r["strategy"])
        for r in figures["rows"]
        if r["verdict"].startswith("inconclusive")
    }
    return [c for c in configs if (c.backend, c.variant) in open_rows]


@dataclass(frozen=True)
class Trials:
    """Parity's work in a benchmark session (benchmark.Work): the schedule's trials, then the sequential rule's,
    up to `max_trials` a side, then the figures into the report's meta (and printed)."""

    max_trials: int

    def reachable(self, plan: Plan) -> list[tuple[RunConfig, int]]:
        """Every strategy trial the sequential rule may run, up to its cap, as each trial's config has it."""
        return [
            (side, trial)
            for trial in range(1, self.max_trials + 1)
            for _, side in round_of(plan.configs, trial)
            if isinstance(side, RunConfig)
        ]

    def nothing_left(self, earlier: resume.Earlier, plan: Plan, request) -> bool:
        """Never known before the rule reads the trials again: a resumed parity report always runs."""
        return False

    def carry_out(self, session: benchmark.Session) -> list[dict]:
        """The schedule, then the parity figures into the session's meta (and printed). An interrupt ends it; the
        figures are made from what finished. With a resumed report, each trial that finished there, a strategy's
        or an idiom's, is kept, not run again: the rule reads the same trials as it did there and so continues
        where it was cut off."""
        plan, console = session.plan, session.console
        results = [
            runner.not_run_result(cfg, "unavailable", reason) for cfg, reason in plan.not_run
        ]
        finished, idioms = [], []
        runs = schedule(plan)
        sides = Sides(Pythons(plan, console.say), session, finished, idioms)
        console.say(Devices(plan.device_kind, plan.gpus, plan.detection).line)
        console.say(
            f"Parity: {len(plan.configs)} strategies beside their idioms, {plan.repeat} interleaved trials, "
            f"{plan.configs[0].timed_steps if plan.configs else 0} timed steps each; {len(runs)} runs"
        )
        alpha = ALPHA / looks(plan.repeat, self.max_trials)
        trial, started = plan.repeat, 0
        try:
            while runs:
                # the strategies' runs before this round: an interrupt leaves the rest of the round not run
                started = len(finished)
                sides.run(runs)
                left = undecided(figures(finished, idioms, alpha, plan.repeat), plan.configs)
                if not left or trial >= self.max_trials:
                    break
                trial += 1
                console.say(f"Parity: trial {trial} for {len(left)} strategies still undecided")
                runs = round_of(left, trial)
        except KeyboardInterrupt as e:
            console.say(
                f"Interrupted ({str(e) or 'SIGINT'}): the parity figures of the runs finished"
            )
            done = len(finished) - started
            finished += [
                not_run(side, trial, "interrupted", f"interrupted by {str(e) or 'the user'}")
                for trial, side in runs
                if isinstance(side, RunConfig)
            ][done:]
        session.meta["parity"] = {
            **figures(finished, idioms, alpha, plan.repeat),
            "repeat": plan.repeat,
            "max_trials": self.max_trials,
        }
        for line in table(session.meta["parity"]["rows"]):
            console.say(line)
        return results + finished


@dataclass
class Sides:
    """Where a round's sides run and land: a strategy's run into `finished`, an idiom's record into `idioms`; with
    the session's resumed report, those that finished there kept instead."""

    pythons: Pythons
    session: benchmark.Session
    finished: list
    idioms: list

    def run(self, runs: list[tuple[int, RunConfig | IdiomRun]]) -> None:
        """Each (trial, side) in turn."""
        for trial, side in runs:
            if isinstance(side, RunConfig):
                self.strategy(side, trial)
            else:
                self.idiom(side, trial)

    def strategy(self, cfg: RunConfig, trial: int) -> None:
        # each run kept in `finished` before it is announced, the two held against a stop signal
        s = self.session
        kept = kept_run(cfg, trial, s.earlier, s.workdir, s.console.say, keep=self.finished.append)
        if kept is None:
            run_one(cfg, trial, self.pythons, s.workdir, s.console, keep=self.finished.append)

    def idiom(self, job: IdiomRun, trial: int) -> None:
        s = self.session
        kept = kept_idiom(job, trial, s.earlier, s.workdir, s.console.say)
        if kept is not None:
            self.idioms.append(kept)
            return
        python = self.pythons(job.cfg.backend)
        if isinstance(python, Exception):
            self.idioms.append(failed_idiom(job, trial, f"environment setup failed: {python}"))
            return
        record = run_idiom(job, trial, python, s.workdir)
        with interrupts.held():
            self.idioms.append(record)
            announce(s.console, record)


def figures(results: list[dict], idioms: list[dict], alpha: float = ALPHA, repeat: int = 1) -> dict:
    """What results.json keeps under "parity": the limit, every idiom trial, and a row per strategy, its
    interval at 1 - alpha; a strategy with fewer than `repeat` trials kept on either side gets no verdict."""
    rows = []
    by_strategy: dict[tuple[str, str], list[Result]] = {}
    for r in as_results(results):
        by_strategy.setdefault((r.config.backend, r.config.variant), []).append(r)
    for (backend, variant), trials in by_strategy.items():
        idiom = idiom_of(trials[0].config).name
        rows.append(
            row(
                backend,
                variant,
                idiom,
                trials,
                [i for i in idioms if i["idiom"] == idiom],
                alpha,
                repeat,
            )
        )
    return {"limit": LIMIT, "alpha": alpha, "rows": rows, "idioms": idioms}


def step_trials(trials: list[Result]) -> list[list[float]]:
    return [
        list(r.step_time.samples_s)
        for r in trials
        if r.ok and r.step_time and r.step_time.samples_s
    ]


def row(
    backend: str,
    variant: str,
    idiom: str,
    suite: list[Result],
    idioms: list[dict],
    alpha: float = ALPHA,
    repeat: int = 1,
) -> dict:
    """One strategy against its idiom: medians, the ratio, its interval, the verdict, a known reason. The verdict
    needs the trials the sequential rule's first look asks for: `repeat` kept of each side (a run cut off, or
    trials that failed, leave fewer: the row then says so, its ratio and interval shown but not read)."""
    mine, theirs = step_trials(suite), [i["steps_s"] for i in idioms if i["status"] == "ok"]
    frameworks = sorted({i["framework"] for i in idioms if i["status"] == "ok"})
    out = {
        "backend": backend,
        "strategy": variant,
        "idiom": idiom,
        "framework": frameworks[0] if frameworks else None,
        "trials": [len(mine), len(theirs)],
        "reason": KNOWN_COSTS.get((backend, variant.split("[")[0])),
    }
    if not mine or not theirs:
        why = "the strategy" if not mine else "the idiom"
        return {**out, "verdict": f"not measured: {why} finished no trial"}
    suite_step = statistics.median(s for t in mine for s in t)
    idiom_step = statistics.median(s for t in theirs for s in t)
    low, high = ratio_interval(theirs, mine, alpha)
    kept = min(len(mine), len(theirs))
    breakdowns = profiled_pair(suite, idioms, suite_step, idiom_step)
    if out["reason"] is None and breakdowns and suite_step / idiom_step > EXPLAINED:
        out["reason"] = breakdown_reason(*breakdowns)
    return {
        **out,
        "suite_step_s": suite_step,
        "idiom_step_s": idiom_step,
        "ratio": suite_step / idiom_step,
        "interval": [low, high],
        "verdict": verdict(low, high) if kept >= repeat else f"too few trials ({kept} of {repeat})",
        "breakdown": breakdowns and {"strategy": breakdowns[0], "idiom": breakdowns[1]},
    }


def verdict(low: float, high: float) -> str:
    """Read off the interval, never the point: a noisy machine gives "inconclusive", not a wrong answer."""
    if high < 1:
        return "faster than the idiom"
    if high <= LIMIT:
        return f"at parity (within {LIMIT:.2f})"
    if low > LIMIT:
        return f"slower than {LIMIT:.2f}"
    return "inconclusive: more trials narrow the interval"


def table(rows: list[dict]) -> list[str]:
    """The parity table as plain lines, for the console."""
    lines = ["", "Speed parity (strategy step / idiom step, one device):"]
    for r in rows:
        if "ratio" not in r:
            lines.append(f"  {r['backend']:6} {r['strategy']:14} vs {r['idiom']:15} {r['verdict']}")
            continue
        low, high = r["interval"]
        lines.append(
            f"  {r['backend']:6} {r['strategy']:14} vs {r['idiom']:15} {r['ratio']:.2f} "
            f"[{low:.2f}, {high:.2f}]  {r['verdict']}"
        )
    return lines

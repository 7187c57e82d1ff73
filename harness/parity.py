"""`python -m harness parity`: is each strategy as fast as its framework's own idiom?

Each backend's strategies run on one device beside a short training loop written the way that framework's own
examples write it (benchmarks/idioms/), on the same ResNet-18, canonical weights, batches, batch size,
learning rate and threads. Every side runs `--repeat` times in fresh processes, interleaved (the order
reversed every other trial, so slow drifts of the machine's load hit both sides alike), and times the same
steps the same way: one warm-up step, then each step alone, its batch put before its timer starts.

The figure of a strategy is its median step time over its idiom's: 1.00 is parity, 1.10 is 10% slower. Its
interval is the two-level bootstrap `compare` uses (trials drawn, then each trial's steps). The trials are
sequential: after the first `--repeat`, a strategy whose interval still straddles LIMIT (or 1) gets one more trial
of each side, and again, until every interval is clear of the lines or `--max-trials` is reached; each look's
interval is at 1 - ALPHA / looks (Bonferroni over the looks the rule may take), so that stopping when an interval
clears a line does not make a false verdict likelier than ALPHA. The report's
"Speed parity" section and plot give them, with the reason for each strategy slower than LIMIT where one
is known and measured; results.json holds the figures under "parity".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from common import caches, manifest, sysinfo
from common import weights as weightslib
from common.config import MAX_PROFILE_STEPS, RunConfig
from common.profiling import TRACES_ENV
from common.results import Result, profile_problem
from harness import arguments
from harness.arguments import Parser, request_of
from harness.errors import UsageError
from harness.planning.plan import MAX_REPEAT, Devices, Plan, choose_devices, parse_gpus
from harness.planning.presets import PRESETS
from harness.planning.request import RunRequest
from harness.processes import envs, interrupts, runner
from harness.reporting import provenance
from harness.reporting.comparison import ratio_interval
from harness.reporting.reasons import breakdown_reason, profiled_pair
from harness.reporting.tables import as_results
from harness.session import benchmark, resume

LIMIT = 1.10  # the most a strategy's step may cost over its idiom's
# Above this ratio a strategy's row says where its step loses time to its idiom's (the --profile breakdowns of
# both), if no measured reason is known (harness/reporting/reasons.py).
EXPLAINED = 1.05
ALPHA = 0.05  # the interval's: 95%
# Interleaved trials per side: with fewer, a bootstrap interval of a median means little.
DEFAULT_REPEAT = 6
# The sequential rule's cap: an undecided strategy gets at most this many trials per side.
DEFAULT_MAX_TRIALS = 12
# Steps each side's first trial records with its framework's profiler (the breakdowns of a row's reason).
DEFAULT_PROFILE = 3
DEFAULT_TIMED_STEPS = 20
# The most steps a trial times (each a fresh process runs them all, twice a side a trial): beyond, a typo.
MAX_TIMED_STEPS = 10_000
SUITE_STEPS = 2  # the suite run's one training epoch: its steps are not what parity times

# Where a strategy is slower than LIMIT for a reason the suite chooses or the framework imposes, measured:
# (backend, strategy) -> the reason and its measured cost. The report prints it beside the row.
KNOWN_COSTS: dict[tuple[str, str], str] = {}

DESCRIPTION = (
    "Time each backend's strategies on one device against a short training loop written as the framework's "
    "own examples write it (benchmarks/idioms/), on the same model, weights, batches and threads, in "
    f"interleaved trials; report each strategy's step time over its idiom's with a 95% interval "
    f"(at most {LIMIT:.2f}, or the measured reason). Writes a report with a 'Speed parity' section."
)


# ------------------------------------------------------------------------ the idioms


@dataclass(frozen=True)
class Idiom:
    """A framework's idiomatic loop: its name in the report, its module, the environment it needs."""

    name: str
    module: str
    env: tuple[tuple[str, str], ...] = ()


def idiom_of(cfg: RunConfig) -> Idiom:
    """The loop a strategy is measured against: its framework's idiom, named and run as the strategy's backend.toml
    declares (Keras's ddp against Keras on torch, its distribution against Keras on jax)."""
    declared = manifest.load(cfg.backend).strategies[cfg.strategy]
    return Idiom(declared.idiom, f"benchmarks.idioms.{cfg.backend}", declared.idiom_env)


@dataclass(frozen=True)
class IdiomRun:
    """One trial of an idiom, with the run config whose weights, batches and threads it takes."""

    idiom: Idiom
    cfg: RunConfig


class IdiomFailed(Exception):
    """An idiom's process failed, or wrote a result that is not one; the message says why."""


def run_idiom(job: IdiomRun, trial: int, python: str, workdir: Path) -> dict:
    """One idiom trial's record: its step seconds (status ok), or the reason it has none (status failed)."""
    record = {"idiom": job.idiom.name, "backend": job.cfg.backend, "trial": trial}
    try:
        return {**record, "status": "ok", **measure_idiom(job, trial, python, workdir)}
    except IdiomFailed as e:
        return {**record, "status": "failed", "error": str(e)}


def measure_idiom(job: IdiomRun, trial: int, python: str, workdir: Path) -> dict:
    name = job.idiom.name.replace(" ", "-")
    folder = workdir / "idioms"
    config, result = (
        folder / f"{name}-trial{trial}.json",
        folder / f"{name}-trial{trial}.result.json",
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        job.cfg.save(config)
    except OSError as e:
        raise IdiomFailed(f"cannot write its config: {e.strerror or e}") from None
    cmd = [python, "-m", job.idiom.module, "--config", str(config), "--result", str(result)]
    # the strategies' rule for compile caches: cold, or the shared folder
    env = caches.apply(
        idiom_env(job), job.cfg.compile_cache, folder / f"{name}-trial{trial}.caches"
    )
    traces = f"idiom-{name}-trial{trial}"
    if job.cfg.profile:
        env[TRACES_ENV] = str(workdir / runner.TRACES / traces)
    try:
        code, output = runner.launch(
            cmd,
            env,
            workdir / "logs" / f"idiom-{name}-trial{trial}.log",
            job.cfg.timeout,
        )
    except OSError as e:
        raise IdiomFailed(f"could not start {python}: {e}") from None
    if code != 0:
        ended = f"timed out after {job.cfg.timeout:g} s" if code is None else f"exited {code}"
        raise IdiomFailed(f"{ended}: {''.join(output[-3:]).strip()[-400:]}")
    record = checked_result(result, job.cfg)
    return {
        **record,
        "profile": runner.in_report(record["profile"], workdir, traces),
    }


def idiom_env(job: IdiomRun) -> dict:
    """The worker's environment, with the run's threads where torch and MXNet read them (at their import):
    --threads, else every usable core, as the suite's one-process runs take (MXNet's own default is fewer)."""
    threads = str(job.cfg.threads or sysinfo.usable_cpus())
    return envs.worker_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=threads, **dict(job.idiom.env))


def checked_result(path: Path, cfg: RunConfig) -> dict:
    """The idiom's result file, read as untrusted input: its framework, warm-up and step seconds, checked
    against the run it stands beside (the same initial weights, as many steps)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise IdiomFailed(f"its result {path.name} cannot be read: {e}") from None
    steps = doc.get("steps_s") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or len(steps) != cfg.timed_steps or not all(map(seconds, steps)):
        raise IdiomFailed(f"its result holds no {cfg.timed_steps} step times (steps_s)")
    if doc.get("weights_hash") != weightslib.fingerprint(weightslib.for_run(cfg)):
        raise IdiomFailed("it did not start from the run's canonical weights (weights_hash)")
    if not isinstance(doc.get("framework"), str) or not seconds(doc.get("warmup_s")):
        raise IdiomFailed("its result lacks its framework or warm-up time")
    profile = doc.get("profile")
    problem = profile_problem(profile) if isinstance(profile, dict) else "not an object"
    if profile is not None and problem:
        # the timed steps stand; a profile that is not one is dropped, with the reason
        profile = {"error": f"its profile is not one: {problem}"}
    return {
        "framework": doc["framework"][:80],
        "warmup_s": doc["warmup_s"],
        "steps_s": steps,
        "profile": profile,
    }


def seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


# ------------------------------------------------------------------------ the schedule


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


def reachable(plan: Plan, max_trials: int) -> list[tuple[RunConfig, int]]:
    """Every strategy trial the sequential rule may run, up to its cap, as each trial's config has it."""
    return [
        (side, trial)
        for trial in range(1, max_trials + 1)
        for _, side in round_of(plan.configs, trial)
        if isinstance(side, RunConfig)
    ]


def carry_out(
    plan: Plan,
    request: RunRequest,
    console: runner.Console,
    meta: dict,
    workdir: Path,
    max_trials: int = DEFAULT_MAX_TRIALS,
    earlier: resume.Earlier | None = None,
) -> list[dict]:
    """benchmark.run_benchmark's `carry_out` (with parity's --max-trials): the schedule, then the parity figures
    into `meta` (and printed). An interrupt ends it; the figures are made from what finished. With `earlier`
    (--resume), each trial that finished there, a strategy's or an idiom's, is kept, not run again: the rule
    reads the same trials as it did there and so continues where it was cut off."""
    results = [runner.not_run_result(cfg, "unavailable", reason) for cfg, reason in plan.not_run]
    finished, idioms = [], []
    runs = schedule(plan)
    pythons = benchmark.Pythons(plan, console.say)
    console.say(Devices(plan.device_kind, plan.gpus, plan.detection).line)
    console.say(
        f"Parity: {len(plan.configs)} strategies beside their idioms, {plan.repeat} interleaved trials, "
        f"{plan.configs[0].timed_steps if plan.configs else 0} timed steps each; {len(runs)} runs"
    )
    alpha = ALPHA / looks(plan.repeat, max_trials)
    trial, started = plan.repeat, 0
    try:
        while runs:
            # the strategies' runs before this round: an interrupt leaves the rest of the round not run
            started = len(finished)
            run_sides(runs, pythons, workdir, console, finished, idioms, earlier)
            left = undecided(figures(finished, idioms, alpha, plan.repeat), plan.configs)
            if not left or trial >= max_trials:
                break
            trial += 1
            console.say(f"Parity: trial {trial} for {len(left)} strategies still undecided")
            runs = round_of(left, trial)
    except KeyboardInterrupt as e:
        console.say(f"Interrupted ({str(e) or 'SIGINT'}): the parity figures of the runs finished")
        done = len(finished) - started
        finished += [
            benchmark.not_run(side, trial, "interrupted", f"interrupted by {str(e) or 'the user'}")
            for trial, side in runs
            if isinstance(side, RunConfig)
        ][done:]
    meta["parity"] = {
        **figures(finished, idioms, alpha, plan.repeat),
        "repeat": plan.repeat,
        "max_trials": max_trials,
    }
    for line in table(meta["parity"]["rows"]):
        console.say(line)
    return results + finished


def run_sides(
    runs,
    pythons,
    workdir: Path,
    console: runner.Console,
    finished: list,
    idioms: list,
    earlier: resume.Earlier | None = None,
) -> None:
    """Each (trial, side) in turn: a strategy's run into `finished`, an idiom's record into `idioms`; with
    `earlier`, those that finished there kept instead."""
    for trial, side in runs:
        if isinstance(side, RunConfig):
            # each run kept in `finished` before it is announced, the two held against a stop signal
            kept = benchmark.kept_run(
                side, trial, earlier, workdir, console.say, keep=finished.append
            )
            if kept is None:
                benchmark.run_one(side, trial, pythons, workdir, console, keep=finished.append)
            continue
        kept = kept_idiom(side, trial, earlier, workdir, console.say)
        if kept is not None:
            idioms.append(kept)
            continue
        python = pythons(side.cfg.backend)
        if isinstance(python, Exception):
            idioms.append(failed_idiom(side, trial, f"environment setup failed: {python}"))
        else:
            record = run_idiom(side, trial, python, workdir)
            with interrupts.held():
                idioms.append(record)
                announce(console, record)


def kept_idiom(
    job: IdiomRun, trial: int, earlier: resume.Earlier | None, workdir: Path, say
) -> dict | None:
    """The idiom's trial from the report resumed, its log and trace copied into this one, if it finished there
    with the step times this run's trial would have (read as untrusted input: otherwise it runs again)."""
    record = earlier.kept_idiom(job.idiom.name, job.cfg.backend, trial) if earlier else None
    if record is None or not finished_steps(record, job.cfg):
        return None
    name = job.idiom.name.replace(" ", "-")
    problem = resume.copy_records(
        {"log": f"logs/idiom-{name}-trial{trial}.log", "profile": record.get("profile")},
        earlier,
        workdir,
    )
    say(
        f"idiom {job.idiom.name} trial {trial} kept from {earlier.folder}: finished there"
        + (f" ({problem})" if problem else "")
    )
    return record


def finished_steps(record: dict, cfg: RunConfig) -> bool:
    steps = record.get("steps_s")
    return (
        isinstance(steps, list)
        and len(steps) == cfg.timed_steps
        and all(map(seconds, steps))
        and isinstance(record.get("framework"), str)
    )


def failed_idiom(job: IdiomRun, trial: int, error: str) -> dict:
    return {
        "idiom": job.idiom.name,
        "backend": job.cfg.backend,
        "trial": trial,
        "status": "failed",
        "error": error,
    }


def announce(console: runner.Console, record: dict) -> dict:
    if record["status"] == "ok":
        step = statistics.median(record["steps_s"])
        console.say(
            f"idiom {record['idiom']} trial {record['trial']}: median step {step * 1000:.1f} ms"
        )
    else:
        console.say(f"idiom {record['idiom']} trial {record['trial']}: failed: {record['error']}")
    return record


# ------------------------------------------------------------------------ the figures


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


# ------------------------------------------------------------------------ the command line


def parents() -> list[Parser]:
    return [
        arguments.backends_flags(),
        arguments.devices_flags(
            "1", "data-parallel devices: 1, the idioms' loops (the only count)"
        ),
        arguments.training_flags(
            None,
            "SGD learning rate (default: the preset's, 0.05 on the CPU, 0.1 on a GPU)",
            None,
            "batch (default: the preset's per-device batch, 32 on the CPU, 256 on a GPU)",
            "initial weights (see run's --help)",
        ),
        arguments.data_flags(),
        arguments.python_flags(),
        arguments.timeout_flags(arguments.DEFAULT_TIMEOUT, "seconds before one process is killed"),
        arguments.threads_flags(),
        parity_flags(),
    ]


def parity_flags() -> Parser:
    p = Parser(add_help=False)
    p.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        metavar="K",
        help="interleaved trials of every strategy and idiom, each a fresh process, 1 to "
        f"{MAX_REPEAT} (default {DEFAULT_REPEAT}); a strategy with fewer kept (a run cut off, failed trials) "
        "gets no verdict",
    )
    p.add_argument(
        "--max-trials",
        type=int,
        default=DEFAULT_MAX_TRIALS,
        metavar="M",
        help="a strategy whose interval still straddles a line after --repeat trials gets one more trial of "
        f"each side at a time, up to M, at most {MAX_REPEAT} (default %(default)s; equal to --repeat: no "
        "more). Every look's interval is widened so that looking again is paid for (docs/parity.md)",
    )
    p.add_argument(
        "--timed-steps",
        type=int,
        default=DEFAULT_TIMED_STEPS,
        help=f"steps timed one by one in each trial, 3 to {MAX_TIMED_STEPS} (default {DEFAULT_TIMED_STEPS})",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=DEFAULT_PROFILE,
        metavar="N",
        help="record N more steps of each side's first trial with its framework's profiler, after the timed "
        f"ones, 0 to {MAX_PROFILE_STEPS}: a strategy slower than its idiom by more than 5%% is explained from "
        "the two breakdowns (default %(default)s; 0: none)",
    )
    p.add_argument(
        "--option",
        action="append",
        type=arguments.nonempty,
        default=[],
        metavar="NAME=VALUE[,VALUE]",
        help="a backend-specific option (see `list`); several values are measured one variant each",
    )
    p.add_argument(
        "--out",
        type=arguments.absolute_path,
        default="reports",
        help="the report goes to OUT/<run-id>/",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar, only a line per finished run"
    )
    p.add_argument(
        "--resume",
        type=arguments.absolute_path,
        metavar="REPORT_DIR",
        help="take up a parity report again: its own command is planned again, every trial that finished there "
        "(a strategy's or an idiom's) is kept, and the sequential rule continues from them (give no other flag)",
    )
    return p


def run_flags_defaults() -> dict:
    """run's flags that parity does not take, at their defaults: the plan is run's plan."""
    return vars(Parser(parents=arguments.run_parents()).parse_args([]))


def settle(args) -> RunRequest:
    """parity's flags, completed into run's request: one device, one short epoch, timed steps, no equivalence
    check."""
    if parse_gpus(args.gpus) != [1]:
        raise UsageError(f"--gpus {args.gpus}: parity measures one-device loops: --gpus 1")
    if not 3 <= args.timed_steps <= MAX_TIMED_STEPS:
        raise UsageError(
            f"--timed-steps must be at least 3 for an interval and at most {MAX_TIMED_STEPS} "
            f"(got {args.timed_steps})"
        )
    if not 0 <= args.profile <= MAX_PROFILE_STEPS:
        raise UsageError(
            f"--profile must be between 0 and {MAX_PROFILE_STEPS} steps (got {args.profile})"
        )
    for flag, value in (("--repeat", args.repeat), ("--max-trials", args.max_trials)):
        if not 1 <= value <= MAX_REPEAT:
            raise UsageError(f"{flag} must be between 1 and {MAX_REPEAT} (got {value})")
    if args.max_trials < args.repeat:
        raise UsageError(
            f"--max-trials {args.max_trials} is fewer than the --repeat {args.repeat} trials every side runs"
        )
    request = request_of(RunRequest, args, defaults=run_flags_defaults())
    kind = choose_devices(request.device).kind
    batch = args.batch_size or PRESETS["d2l" if kind == "gpu" else "quick"].batch(1)
    return dataclasses.replace(
        request,
        epochs=1,
        check=False,
        train_size=request.train_size or SUITE_STEPS * batch,
        test_size=request.test_size or batch,
    )


def main(args) -> int:
    """`python -m harness parity`, its flags parsed (cli.build_parser); with --resume, the report's own command."""
    if args.resume:
        return resume_main(args)
    parity_run = functools.partial(carry_out, max_trials=args.max_trials)
    return benchmark.run_benchmark(settle(args), args.argv, carry_out=parity_run)


def resume_main(args) -> int:
    """--resume REPORT_DIR (with --quiet at most): the parity report's command, planned again, its finished trials
    kept."""
    resume.only_flag(args.argv, "parity", args.resume)
    earlier = resume.read(args.resume, "parity")
    flags = resume.parse(earlier, Parser(parents=parents()), earlier.argv[1:], args)
    if flags.resume:
        raise UsageError(f"--resume {args.resume}: its own command resumed another report")
    for line in resume.check_code(earlier, provenance.record()):
        print(line, file=sys.stderr)
    request = dataclasses.replace(settle(flags), quiet=args.quiet or flags.quiet)
    return benchmark.run_benchmark(
        request,
        earlier.argv,
        carry_out=functools.partial(carry_out, max_trials=flags.max_trials),
        earlier=earlier,
        reachable=functools.partial(reachable, max_trials=flags.max_trials),
    )

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

import sys

from common.config import MAX_PROFILE_STEPS
from common.flags import absolute_path
from harness.arguments import Parser, defaults_of, flags_of, request_of
from harness.errors import UsageError
from harness.planning.plan import MAX_REPEAT, choose_devices, parse_gpus
from harness.planning.presets import PRESETS
from harness.planning.request import (
    DataRequest,
    DevicesRequest,
    EachRun,
    OutputRequest,
    RecipeRequest,
    RunRequest,
    WhatRuns,
)
from harness.reporting import provenance
from harness.session import benchmark, resume
from harness.session.paired import LIMIT, Trials

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


DESCRIPTION = (
    "Time each backend's strategies on one device against a short training loop written as the framework's "
    "own examples write it (benchmarks/idioms/), on the same model, weights, batches and threads, in "
    f"interleaved trials; report each strategy's step time over its idiom's with a 95% interval "
    f"(at most {LIMIT:.2f}, or the measured reason). Writes a report with a 'Speed parity' section."
)


def parents() -> list[Parser]:
    return [
        flags_of(WhatRuns, "backend", "strategy", "python"),
        flags_of(
            DevicesRequest,
            gpus={
                "default": "1",
                "help": "data-parallel devices: 1, the idioms' loops (the only count)",
            },
        ),
        flags_of(
            RecipeRequest,
            "batch_size",
            "lr",
            "seed",
            "init",
            lr={"help": "SGD learning rate (default: the preset's, 0.05 on the CPU, 0.1 on a GPU)"},
            batch_size={
                "help": "batch (default: the preset's per-device batch, 32 on the CPU, 256 on a GPU)"
            },
            init={"help": "initial weights (see run's --help)", "default": "d2l"},
        ),
        flags_of(DataRequest, "dataset", "data_dir", "image_size"),
        flags_of(
            EachRun,
            "timeout",
            "threads",
            timeout={"help": "seconds before one process is killed"},
        ),
        *parity_flags(),
    ]


def parity_flags() -> list[Parser]:
    """run's flags that parity takes with its own defaults and words, and the two of its own."""
    own = Parser(add_help=False)
    own.add_argument(
        "--max-trials",
        type=int,
        default=DEFAULT_MAX_TRIALS,
        metavar="M",
        help="a strategy whose interval still straddles a line after --repeat trials gets one more trial of "
        f"each side at a time, up to M, at most {MAX_REPEAT} (default %(default)s; equal to --repeat: no "
        "more). Every look's interval is widened so that looking again is paid for (docs/parity.md)",
    )
    own.add_argument(
        "--resume",
        type=absolute_path,
        metavar="REPORT_DIR",
        help="take up a parity report again: its own command is planned again, every trial that finished there "
        "(a strategy's or an idiom's) is kept, and the sequential rule continues from them (give no other flag)",
    )
    return [
        flags_of(
            EachRun,
            "repeat",
            "profile",
            repeat={
                "default": DEFAULT_REPEAT,
                "help": "interleaved trials of every strategy and idiom, each a fresh process, 1 to "
                f"{MAX_REPEAT} (default {DEFAULT_REPEAT}); a strategy with fewer kept (a run cut off, failed "
                "trials) gets no verdict",
            },
            profile={
                "default": DEFAULT_PROFILE,
                "help": "record N more steps of each side's first trial with its framework's profiler, after "
                f"the timed ones, 0 to {MAX_PROFILE_STEPS}: a strategy slower than its idiom by more than 5%% is "
                "explained from the two breakdowns (default %(default)s; 0: none)",
            },
        ),
        flags_of(
            RecipeRequest,
            "timed_steps",
            timed_steps={
                "default": DEFAULT_TIMED_STEPS,
                "help": f"steps timed one by one in each trial, 3 to {MAX_TIMED_STEPS} "
                f"(default {DEFAULT_TIMED_STEPS})",
            },
        ),
        flags_of(
            WhatRuns,
            "option",
            option={
                "help": "a backend-specific option (see `list`); several values are measured one variant each"
            },
        ),
        flags_of(OutputRequest, "out", "quiet", out={"help": "the report goes to OUT/<run-id>/"}),
        own,
    ]


def run_flags_defaults() -> dict:
    """run's flags that parity does not take, at their defaults: the plan is run's plan."""
    return defaults_of(RunRequest)


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
    kind = choose_devices(request.devices.device).kind
    batch = args.batch_size or PRESETS["d2l" if kind == "gpu" else "quick"].batch(1)
    return request.replaced(
        epochs=1,
        check=False,
        train_size=request.data.train_size or SUITE_STEPS * batch,
        test_size=request.data.test_size or batch,
    )


def main(args) -> int:
    """`python -m harness parity`, its flags parsed (cli.build_parser); with --resume, the report's own command."""
    if args.resume:
        return resume_main(args)
    return benchmark.run_benchmark(settle(args), args.argv, Trials(args.max_trials))


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
    request = settle(flags).replaced(quiet=args.quiet or flags.quiet)
    return benchmark.run_benchmark(request, earlier.argv, Trials(flags.max_trials), earlier)

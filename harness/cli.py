"""`python -m harness`: the command line. Each subcommand (run, check, parity, test, list, compare, history, report,
project) is its module's function (`main`), chosen by the parser (`set_defaults(func=...)`): harness/run.py, check.py,
parity.py, testing.py, compare.py, history.py, report.py, projection.py.

Without a subcommand the flags are `run`'s: `python -m harness --backend jax --gpus 2` is
`python -m harness run --backend jax --gpus 2`. Parsing and planning are harness/planning/plan.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from harness import arguments, check, compare, history, parity, projection, report, run, testing
from harness.arguments import HelpFormatter, Parser
from harness.errors import UsageError
from harness.planning import plan
from harness.planning.plan import Devices, Plan, parse_pythons
from harness.planning.request import RunRequest
from harness.processes import interrupts

# The names tests and tools reach through this module (the benchmark's entry points; the plan's are
# harness/planning/plan.py's).
__all__ = [
    "COMMANDS",
    "UsageError",
    "build_parser",
    "build_plan",
    "choose_devices",
    "main",
    "parse_pythons",
    "request",
]

COMMANDS = ("run", "check", "parity", "test", "list", "compare", "history", "report", "project")

EPILOG = (
    "`python -m harness COMMAND --help` shows a subcommand's flags. Examples: "
    "`python -m harness --backend torch --gpus 2`, `python -m harness --backend all --gpus 1,2 --strategy "
    "ddp,pmap`, `python -m harness check --gpus 2`, `python -m harness test --backend none -- -k cli`."
)
DEFAULT_RULE = (
    "the first argument, if any. With no subcommand the command is run, and the flags above are "
    "run's: `python -m harness --backend jax --gpus 2` is `python -m harness run --backend jax --gpus 2`"
)


@dataclass(frozen=True)
class Stoppable:
    """A command that starts workers, run with SIGTERM and SIGHUP stopping it the way Ctrl-C does
    (harness/processes/interrupts.py). An interrupt that reaches here came while planning, before anything ran:
    nothing to report. (A dataclass, so that the same command wrapped twice is equal: `run`'s parsed flags equal
    the bare ones.)"""

    command: Callable[..., int]

    def __call__(self, args) -> int:
        with interrupts.handled():
            try:
                return self.command(args)
            except KeyboardInterrupt:
                print("harness: interrupted", file=sys.stderr)
                return interrupts.exit_status() or 130


def build_parser() -> Parser:
    """The command line: run's flags at the top (no subcommand means run), and the subcommands, each with the
    function that carries it out as `func`."""
    p = Parser(
        prog="python -m harness",
        description=arguments.RUN_DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        parents=arguments.run_parents(),
    )
    p.set_defaults(func=Stoppable(run.main))
    sub = p.add_subparsers(
        dest="command",
        title="subcommands",
        metavar="{" + ",".join(COMMANDS) + "}",
        description=DEFAULT_RULE,
    )

    def add(name: str, func, parents: list[Parser], help: str, description: str) -> None:
        command = sub.add_parser(
            name, parents=parents, formatter_class=HelpFormatter, help=help, description=description
        )
        command.set_defaults(func=func)

    add(
        "run",
        Stoppable(run.main),
        arguments.run_parents(),
        "train, time and report (the default)",
        arguments.RUN_DESCRIPTION,
    )
    add(
        "check",
        Stoppable(check.main),
        check.parents(),
        "the equivalence table: the backends compute the same thing",
        check.DESCRIPTION,
    )
    add(
        "parity",
        Stoppable(parity.main),
        parity.parents(),
        "each strategy's speed against its framework's own idiom, on one device",
        parity.DESCRIPTION,
    )
    add(
        "test",
        Stoppable(testing.main),
        testing.parents(),
        "the test suite, each backend's inside its environment",
        testing.DESCRIPTION,
    )
    add(
        "list",
        Stoppable(run.list_main),
        arguments.list_parents(),
        "show the backends, strategies and devices (as --list)",
        "Show the devices that would run, and every backend's strategies, options and levers.",
    )
    add(
        "compare",
        compare.main,
        compare.parents(),
        "compare runs: the change per configuration, significance, exit 1 on a regression",
        compare.DESCRIPTION,
    )
    add(
        "history",
        history.main,
        history.parents(),
        "each configuration's figures across reports, in time order, with each change beyond noise marked",
        history.DESCRIPTION,
    )
    add(
        "report",
        report.main,
        report.parents(),
        "re-render a report from its results.json, or export its summary table",
        report.DESCRIPTION,
    )
    add(
        "project",
        projection.main,
        projection.parents(),
        "project a finished run to 1..1024 devices with a stated communication model",
        projection.DESCRIPTION,
    )
    return p


def request(args) -> RunRequest:
    """The request of a parsed run command line."""
    return arguments.request_of(RunRequest, args)


def build_plan(args) -> Plan:
    """The plan of a parsed run command line (its request made here, at the door)."""
    return plan.build_plan(request(args))


def choose_devices(args) -> Devices:
    """The devices of a parsed command line's --device."""
    return plan.choose_devices(args.device)


def parse(argv: list[str]):
    """The parsed command line; a subcommand is the first argument or none (`--backend torch test` is refused,
    not read as `test` with run's flags dropped). `args.argv` keeps the words parsed: run's report quotes them."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is not None and argv[:1] != [args.command]:
        raise UsageError(
            f"the subcommand {args.command} must come first: python -m harness {args.command} ... "
            "(see --help)"
        )
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = argv
    return args


def entry() -> None:
    """The `dpbench` command that `pip install -e .` puts on PATH: `python -m harness`, run from the checkout the
    install points at. A copy installed without -e has no checkout (no backends' environments, requirement files
    or idioms beside it): it refuses in one line."""
    from harness.processes import envs

    if not (envs.ROOT / "pyproject.toml").is_file() or not (envs.ROOT / "backends").is_dir():
        print(
            "dpbench: error: this copy was installed without -e, apart from its checkout; install it with "
            "`pip install -e .` in the checkout (the backends' environments and files live there)",
            file=sys.stderr,
        )
        sys.exit(2)
    envs.bootstrap(sys.argv[1:])
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        return args.func(args)
    except UsageError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2

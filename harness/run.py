"""`python -m harness run`, the default command: every planned (backend, strategy, devices) run in turn, the
equivalence check first, then the report; and `list` (run's --list), what would run.

Parsing and planning are harness/planning/plan.py's; the command line, harness/cli.py's.
"""

from __future__ import annotations

import sys

from common import manifest
from harness import arguments
from harness.arguments import Parser, request_of
from harness.errors import UsageError
from harness.planning.plan import Devices, choose_devices
from harness.planning.request import RunRequest
from harness.reporting import provenance
from harness.session import resume
from harness.session.benchmark import run_benchmark


def main(args) -> int:
    """`python -m harness run` (or no subcommand), its flags parsed (cli.parse); with --list, `list`; with --resume,
    the report's own command again."""
    if args.list:
        return list_main(args)
    if args.resume:
        return resume_main(args)
    return run_benchmark(request_of(RunRequest, args), args.argv)


def resume_main(args) -> int:
    """--resume REPORT_DIR (with --quiet and --python at most): the report's command, planned again, its finished
    runs kept."""
    resume.only_flag(args.argv, "run", args.resume)
    earlier = resume.read(args.resume)
    with resume.one_at_a_time(earlier.folder):  # refused before anything is said
        words = earlier.argv[1:] if earlier.argv[:1] == ["run"] else earlier.argv
        flags = resume.parse(earlier, Parser(parents=arguments.run_parents()), words, args)
        if flags.resume:
            raise UsageError(f"--resume {args.resume}: its own command resumed another report")
        for line in resume.check_code(earlier, provenance.record()):
            print(line, file=sys.stderr)
        request = request_of(RunRequest, flags).replaced(quiet=args.quiet or flags.quiet)
        return run_benchmark(request, earlier.argv, earlier=earlier)


def list_main(args) -> int:
    """`python -m harness list`: the devices that would run, and every backend's strategies, options and levers."""
    print_listing(choose_devices(args.device))
    return 0


def print_listing(devices: Devices) -> None:
    print(devices.line)
    for b in map(manifest.load, manifest.known()):
        for s in b.strategies.values():
            needs = f" [needs {s.requires}]" if s.requires else ""
            nodes = f" [--nodes: {s.engine}]" if s.engine else " [one process]"
            named = " [runs when --strategy names it]" if s.variant else ""
            print(f"  {b.name:6} {s.name:8} {s.summary}{needs}{nodes}{named}")
        for name, reason in b.strategies_refused.items():
            print(f"  {b.name:6} {name:8} refused: {reason}")
        for o in b.options.values():
            where = f" ({', '.join(o.strategies)})" if o.strategies else ""
            print(
                f"  {b.name:6} --option {o.name}={'|'.join(o.values)} (default {o.default}){where}: {o.summary}"
            )
        for lever in b.levers.values():
            flag = (
                "--"
                + lever.name.replace("_", "-")
                + (f" {'|'.join(lever.values)}" if lever.values else "")
            )
            what = lever.summary or ""
            if lever.refused:
                what += (
                    "; " if what else ""
                ) + f"refused{' otherwise' if lever.values else ''}: {lever.refused}"
            print(f"  {b.name:6} {flag}: {what}")

"""What a user sees of the command line, kept whole: every flag of every subcommand (its names, default, choices,
type, metavar and help), every preset's dry run, and the refusals of bad input, word for word. The record,
tests/harness/unchanged.json, was written before the flags were declared where their settings are; a change to
the structure below the door must leave it as it is (results.json's keys are test_schema.py's, the report's
test_report.py's). After a deliberate change a user should see: python3 -m tests.harness.test_unchanged"""

from __future__ import annotations

import argparse
import json
import re
import sys

import pytest

from tests.harness.helpers import ROOT, harness_in_process

RECORD = ROOT / "tests" / "harness" / "unchanged.json"

CPU = ("--device", "cpu")
PRESETS = ("auto", "d2l", "quick", "resnet50", "resnet50-quick", "d2l-target", "lenet-target")
DRY_RUNS = [
    *[("--preset", preset, *CPU, "--dry-run") for preset in PRESETS],
    ("--backend", "torch,jax", "--best", *CPU, "--dry-run"),
    (
        "--backend",
        "torch",
        "--compile",
        "--channels-last",
        "--precision",
        "bf16",
        *CPU,
        "--dry-run",
    ),
    (
        "--backend",
        "all",
        "--resident-data",
        "--prefetch",
        "0",
        "--gpus",
        "1,2,4",
        *CPU,
        "--dry-run",
    ),
    ("--backend", "mxnet", "--option", "hybridize=on,off", "--nodes", "2", *CPU, "--dry-run"),
    (
        "--backend",
        "jax",
        "--strategy",
        "pmap",
        "--epochs",
        "3",
        "--lr",
        "0.2",
        "--batch-size",
        "48",
        *CPU,
        "--dry-run",
    ),
    (
        "--backend",
        "keras",
        "--bn",
        "sync",
        "--repeat",
        "3",
        "--target-accuracy",
        "0.5",
        *CPU,
        "--dry-run",
    ),
]
REFUSALS = [
    ("--prefetch", "99", *CPU, "--dry-run"),
    ("--best", "--compile-mode", "default", *CPU, "--dry-run"),
    ("--precision", "tf32", *CPU, "--dry-run"),
    ("--compile-mode", "max-autotune", *CPU, "--dry-run"),
    ("--compile", "--compile-mode", "reduce-overhead", *CPU, "--dry-run"),
    ("--bn", "both", *CPU, "--dry-run"),
    ("--gpus", "0", *CPU, "--dry-run"),
    ("--epochs", "-1", *CPU, "--dry-run"),
    ("--lr", "-1", *CPU, "--dry-run"),
    ("--seed", "-1", *CPU, "--dry-run"),
    ("--strategy", "nope", *CPU, "--dry-run"),
    ("--backend", "nope", *CPU, "--dry-run"),
    ("--batch-size", "3", "--gpus", "2", *CPU, "--dry-run"),
    ("--target-accuracy", "2", *CPU, "--dry-run"),
    ("--profile", "99", *CPU, "--dry-run"),
    ("--repeat", "0", *CPU, "--dry-run"),
    ("--threads", "0", *CPU, "--dry-run"),
    ("--timeout", "0", *CPU, "--dry-run"),
    ("--backend", "torch", "--option", "nope=1", *CPU, "--dry-run"),
    ("--node-rank", "1", *CPU, "--dry-run"),
    ("check", "--bn", "both", *CPU),
    ("check", "--steps", "0", *CPU),
    ("check", "--model", "vgg", *CPU),
    ("check", "--batch-size", "15", "--gpus", "2", *CPU),
    ("check", "--steps", "5000", *CPU),
    ("check", "--lr", "0", *CPU),
    ("check", "--model", "resnet50", "--dataset", "fashion-mnist", *CPU),
    ("parity", "--repeat", "0", *CPU),
    ("parity", "--timed-steps", "2", *CPU),
]
COMMANDS = ("run", "check", "parity", "test", "list", "compare", "history", "report", "project")


def flags_of(parser: argparse.ArgumentParser) -> dict:
    """Every flag of `parser` as a user meets it in --help and in use, by its first name."""
    return {
        action.option_strings[0]: {
            "names": action.option_strings,
            "default": action.default if action.default is not argparse.SUPPRESS else "SUPPRESS",
            "choices": list(action.choices) if action.choices else None,
            "type": getattr(action.type, "__name__", None),
            "metavar": action.metavar,
            "nargs": action.nargs,
            "help": action.help,
            "action": type(action).__name__,
        }
        for action in parser._actions
        if action.option_strings
    }


def every_flag() -> dict:
    from harness import cli

    top = cli.build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {
        "python -m harness": flags_of(top),
        **{name: flags_of(commands.choices[name]) for name in COMMANDS},
    }


def seen(args: tuple[str, ...]) -> dict:
    """What `python -m harness ARGS` says: its exit status and its words, with what depends on this checkout's
    environments (built or not) left out."""
    done = harness_in_process(*args)
    out = "\n".join(
        line for line in done.stdout.splitlines() if not line.startswith("Environment of ")
    )
    return {"status": done.returncode, "stdout": out, "stderr": done.stderr}


def what_users_see() -> dict:
    return {
        "flags": every_flag(),
        "commands": {" ".join(args): seen(args) for args in DRY_RUNS + REFUSALS},
    }


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def test_every_flag_of_every_command_is_as_recorded(record):
    assert every_flag() == record["flags"]


@pytest.mark.parametrize("args", DRY_RUNS + REFUSALS, ids=" ".join)
def test_every_dry_run_and_refusal_says_what_it_said(record, args):
    assert seen(args) == record["commands"][" ".join(args)]


def test_a_refusal_is_one_line_with_exit_status_2(record):
    """The record itself holds no traceback: each refusal is one line, status 2 (the record is worth keeping)."""
    for args in REFUSALS:
        said = record["commands"][" ".join(args)]
        assert said["status"] == 2 and re.fullmatch(r"harness: error: [^\n]+\n", said["stderr"]), (
            args
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    RECORD.write_text(json.dumps(what_users_see(), indent=1, sort_keys=True) + "\n")

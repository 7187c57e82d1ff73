"""The command line's door: the one-line-error parser, the flag groups a command is made of, and the typed
request a parsed command line becomes.

Every flag is declared once, on the field of the setting it asks for (common/flags.py): the run's request groups
(harness/planning/request.py), the levers (common/levers.py), the nodes (harness/nodes/nodes.py). `flags_of` makes a
group of a dataclass's fields' flags, each call a fresh parser: a command that takes a flag with another default or
words (`check` compares 1,2 devices by default, `run` chooses from the hardware) says so in the call.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from common import flags as flaglib
from common.levers import Levers
from harness.errors import UsageError
from harness.nodes.nodes import NodeRequest
from harness.planning.request import (
    DataRequest,
    DevicesRequest,
    EachRun,
    OutputRequest,
    RecipeRequest,
    WhatRuns,
)


def request_of(cls, args, defaults: dict | None = None):
    """The typed request `cls` (a dataclass) of a parsed command line: each of its fields from the flag of that
    name, else from `defaults` (the flags a command settles for itself); a field that is itself a dataclass (a
    group of flags) is made the same way. The one place a Namespace becomes a request: below the commands nothing
    reads one."""
    return built(cls, {**(defaults or {}), **vars(args)})


def built(cls, given: dict):
    """`cls` made of the values in `given`, by field name; its dataclass fields made the same way."""
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            f.name: built(hints[f.name], given)
            if dataclasses.is_dataclass(hints[f.name])
            else given[f.name]
            for f in dataclasses.fields(cls)
        }
    )


def defaults_of(*classes) -> dict:
    """{field: the value its flag gives when not given} of every flagged field of `classes` (and of their
    groups): the flags a command does not take, settled as run's defaults."""
    out = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                out.update(defaults_of(hints[f.name]))
            elif "flag" in f.metadata:
                out[f.name] = flaglib.default_of(f)
    return out


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(f"{message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where the help text does not already say what the default is."""

    def _get_help_string(self, action):
        if action.default in (None, False, []) or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


def flags_of(cls, *names: str, **changed: dict) -> Parser:
    """A group of the flags of dataclass `cls`'s fields (those in `names`, in its order; every flagged field
    without), each as its field declares it, with what `changed[field]` says instead ({"default": ..., "help":
    ...}) for a command that takes it otherwise."""
    p = Parser(add_help=False)
    for f in flaglib.flagged_fields(cls):
        if names and f.name not in names:
            continue
        declared = dataclasses.replace(f.metadata["flag"], **changed.get(f.name, {}))
        how = {
            "type": declared.type,
            "choices": declared.choices,
            "metavar": declared.metavar,
            "action": declared.action,
        }
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            *declared.aliases,
            default=flaglib.default_of(f, declared),
            help=declared.help() if callable(declared.help) else declared.help,
            **{k: v for k, v in how.items() if v is not None},
        )
    return p


# ------------------------------------------------------------------------------ the run's flags

RUN_DESCRIPTION = (
    "Train the same ResNet-18 (or LeNet) on the same Fashion-MNIST batches, or torchvision's "
    "ResNet-50 on the same ImageNet-shaped images, with synchronous data parallelism in PyTorch, JAX, "
    "MXNet/Gluon and Keras 3, time every run with one rule, and write a Markdown report under "
    "reports/."
)

# The groups of run's request, in the order --help shows them (RunRequest's own order but nodes after data)
RUN_GROUPS = (
    WhatRuns,
    DevicesRequest,
    RecipeRequest,
    DataRequest,
    NodeRequest,
    Levers,
    EachRun,
    OutputRequest,
)


def run_parents() -> list[Parser]:
    """The flag groups of `run` (and of the bare `python -m harness`, which is `run`): its request's, and the two
    that choose another command (--list, --resume)."""
    return [*(flags_of(group) for group in RUN_GROUPS), run_command_flags()]


def run_command_flags() -> Parser:
    """run's flags that are no part of a request: they make it list, or take up a report's own command."""
    p = Parser(add_help=False)
    p.add_argument(
        "--list",
        action="store_true",
        help="show the backends, strategies and devices, then exit (the same as the `list` subcommand)",
    )
    p.add_argument(
        "--resume",
        type=flaglib.absolute_path,
        metavar="REPORT_DIR",
        help="take up a report again: its own command is planned again, every run that finished there is kept, "
        "and only the others run (give no other flag); the new report says which report it resumed",
    )
    return p


def list_parents() -> list[Parser]:
    """`list`: which devices would run (--device), and what every backend declares."""
    return [
        flags_of(
            DevicesRequest,
            "device",
            device={
                "help": "auto: the GPUs if any are found, else simulated CPU devices; cpu: simulated; "
                "gpu: refuse to list without one"
            },
        )
    ]

"""How a setting is asked for on the command line, declared on the setting itself: a dataclass field's metadata
holds its flag (the help, and how argparse reads the value), and harness/arguments.py `flags_of` makes a
command's flags from the fields, as flax makes a flag of every config field. The flag's name is the field's
(`--channels-last` asks for `channels_last`); its default is the field's, unless the flag says otherwise."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A flag's default where it is the field's own
FIELDS_OWN = object()


@dataclass(frozen=True)
class Flag:
    """A field's flag. `help` may be a function, called when the parser is made (a text that reads the backends'
    declarations). `default` is the flag's where it differs from the field's: None where "not given" is what the
    plan needs to know (the preset's precision, a compile mode asked for)."""

    help: str | Callable[[], str]
    aliases: tuple[str, ...] = ()
    type: Callable | None = None
    choices: tuple | None = None
    metavar: str | None = None
    action: Any = None  # argparse's: "store_true", "append", BooleanOptionalAction
    default: Any = FIELDS_OWN


def flag(help: str | Callable[[], str], **how) -> dict:
    """The metadata of a field asked for by a flag: `field(default=..., metadata=flag("what it does", ...))`."""
    return {"flag": Flag(help, **how)}


def flagged_fields(cls) -> list[dataclasses.Field]:
    """The fields of dataclass `cls` that a flag asks for."""
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]


def default_of(f: dataclasses.Field, declared: Flag | None = None) -> Any:
    """The value a field's flag (`declared`, where a command takes it otherwise) gives when it is not given."""
    declared = (declared or f.metadata["flag"]).default
    if declared is not FIELDS_OWN:
        return declared
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


# ------------------------------------------------------------------ the types of values a flag takes


def nonempty(value: str) -> str:
    """An empty value is refused rather than read as "not given" (`--gpus ''`)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def name_list(value: str) -> str:
    """A comma list naming at least one thing (`--strategy ,` is not "every strategy")."""
    if not any(part.strip() for part in value.split(",")):
        raise argparse.ArgumentTypeError(f"{value!r} names nothing")
    return value


def absolute_path(value: str) -> str:
    """A non-empty path, made absolute now, since workers run from the project root."""
    return os.path.abspath(nonempty(value))

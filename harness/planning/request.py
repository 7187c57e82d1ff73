"""What a benchmark session is asked for, typed: the command line's words become a `RunRequest` once, at the
command's door (harness/arguments.py `request_of`), and below the commands the plan, the data, the nodes and the
session read it, never the parser's Namespace. `parity`'s is `run`'s with its own settled (`replace`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from common import config as configlib
from common.config import ConfigError
from harness.errors import UsageError
from harness.nodes.nodes import NodeRequest


@dataclass(frozen=True)
class WhatRuns:
    """The backends and strategies asked for, their options, the interpreters to use, and --best."""

    backend: str
    strategy: str | None
    option: list[str]
    python: list[str]
    best: bool


@dataclass(frozen=True)
class DevicesRequest:
    """The device kind and the device counts (None: the default for the kind and the nodes)."""

    device: str
    gpus: str | None


@dataclass(frozen=True)
class RecipeRequest:
    """The training recipe: the preset and the values that override its own (None: the preset's)."""

    preset: str
    model: str | None
    epochs: int | None
    batch_size: int | None
    lr: float | None
    init: str | None
    seed: int
    bn: str
    timed_steps: int | None
    target_accuracy: float | None


@dataclass(frozen=True)
class DataRequest:
    """The data part of a request: the dataset, its folder, the image side and the subset sizes asked for (None:
    the dataset's, the preset's or the model's)."""

    dataset: str | None
    data_dir: str | None
    image_size: int | None
    train_size: int | None = None
    test_size: int | None = None


@dataclass(frozen=True)
class LeverRequest:
    """The speed levers as asked (precision None: the preset's; compile_mode None: not given), the batches put
    ahead, and the compile cache folder."""

    precision: str | None
    compile: bool
    compile_mode: str | None
    channels_last: bool
    resident_data: bool
    prefetch: int
    compile_cache: str | None


@dataclass(frozen=True)
class EachRun:
    """What every run does beside training: its trials, threads, timeout, profile, weights and the check."""

    repeat: int
    threads: int | None
    timeout: float
    profile: int
    profile_epoch: bool
    load_weights: str | None
    save_weights: str | None
    check: bool


@dataclass(frozen=True)
class OutputRequest:
    """What is written and said: the report's folder, the console, --json's line, --dry-run."""

    out: str
    quiet: bool
    json: bool
    dry_run: bool


@dataclass(frozen=True)
class RunRequest:
    """Every flag of `python -m harness run` (harness/arguments.py's run_parents say what each means), by its name
    there, in the groups the plan and the config take whole."""

    runs: WhatRuns
    devices: DevicesRequest
    nodes: NodeRequest
    recipe: RecipeRequest
    data: DataRequest
    levers: LeverRequest
    each_run: EachRun
    output: OutputRequest

    def replaced(self, **changes) -> RunRequest:
        """The request with `changes` (flag names) made in the groups that hold them."""
        groups = {}
        for group in fields(self):
            part = getattr(self, group.name)
            mine = {k: changes.pop(k) for k in [f.name for f in fields(part)] if k in changes}
            groups[group.name] = replace(part, **mine) if mine else part
        if changes:
            raise TypeError(f"no such flag in a RunRequest: {', '.join(changes)}")
        return RunRequest(**groups)


def check_shared(seed: int, lr: float | None, timeout: float, threads: int | None = None) -> None:
    """The value checks `run` and `check` share (common/config.py): bad input is a UsageError."""
    try:
        configlib.check_seed(seed)
        configlib.check_timeout(timeout)
        configlib.check_threads(threads)
        if lr is not None:
            configlib.check_lr(lr)
    except ConfigError as e:
        raise UsageError(str(e)) from None

"""What a benchmark session is asked for, typed: the command line's words become a `RunRequest` once, at the
command's door (harness/arguments.py `request_of`), and below the commands the plan, the data, the nodes and the
session read it, never the parser's Namespace. `parity`'s is `run`'s with its own settled (`replace`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from common import config as configlib
from common.config import ConfigError
from harness.errors import UsageError
from harness.nodes.nodes import NodeRequest


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
class RunRequest:
    """Every flag of `python -m harness run` (harness/arguments.py's run_parents say what each means), by its
    name there."""

    # what runs
    backend: str
    strategy: str | None
    option: list[str]
    python: list[str]
    best: bool
    # where: the devices and the nodes
    device: str
    gpus: str | None
    nodes: str | None
    node_rank: int | None
    coordinator: str | None
    master_addr: str | None
    master_port: str | None
    local_addr: str | None
    interface: str | None
    join_timeout: float
    peer_timeout: float
    # the recipe (None: the preset's)
    preset: str
    model: str | None
    dataset: str | None
    data_dir: str | None
    image_size: int | None
    epochs: int | None
    batch_size: int | None
    lr: float | None
    train_size: int | None
    test_size: int | None
    init: str | None
    seed: int
    bn: str
    precision: str | None
    timed_steps: int | None
    target_accuracy: float | None
    # the levers
    compile: bool
    compile_mode: str
    channels_last: bool
    resident_data: bool
    prefetch: int
    compile_cache: str | None
    # each run
    repeat: int
    threads: int | None
    timeout: float
    profile: int
    profile_epoch: bool
    load_weights: str | None
    save_weights: str | None
    check: bool
    # what is written and said
    out: str
    quiet: bool
    json: bool
    dry_run: bool

    @property
    def node_request(self) -> NodeRequest:
        return NodeRequest(**{f.name: getattr(self, f.name) for f in fields(NodeRequest)})

    @property
    def data(self) -> DataRequest:
        return DataRequest(**{f.name: getattr(self, f.name) for f in fields(DataRequest)})


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

"""What `python -m harness check` hands each backend's check worker, and the keys its measurements are stored
under: the one definition that harness/checking/workers.py and equivalence.py (the harness side) and
common/measurements.py (the worker side) share.

A job is JSON written by the harness and read by a worker in another environment: `CheckJob.load` treats it
as untrusted input and refuses a malformed one in one line (JobError).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace

from common.config import BN_MODES

SEPARATOR = "|"
# A strategy's float64 run (dtype="float64": the strategy's own code path) is stored as <strategy>:float64.
FLOAT64 = ":float64"
# The reference backend's own float64 runs, stored where a strategy's name would be; never a strategy. FLOAT64_RUN
# is the whole trace on the CPU (the float32 floor). IN_ORDER and PERMUTED are the float64 floor, how far float64
# rounding alone moves each quantity the float64 rows compare: the same math over the first steps, once as the
# batches come and once with the images of every device's shard permuted (labels with them). The mean loss, the
# summed gradients and BatchNorm's batch statistics do not change in exact arithmetic, only the order of their sums.
FLOAT64_RUN = "float64"
IN_ORDER, PERMUTED = "float64-in-order", "float64-permuted"
FLOOR_RUNS = (IN_ORDER, PERMUTED)
REFERENCE_RUNS = (FLOAT64_RUN, *FLOOR_RUNS)

FORWARD_MODES = ("train", "eval")  # BatchNorm's modes in the forward measurements
DEVICE_KINDS = ("cpu", "gpu")


@dataclass(frozen=True, order=True)
class MeasurementKey:
    """One measured configuration: `model|strategy|devices|bn` in the measurement file, each quantity under the
    key and its part (`lenet|ddp|2|local|grad|fc1.weight`). `strategy` may carry FLOAT64 (the strategy's float64
    run) or be one of REFERENCE_RUNS. Ordered as the tuple (model, strategy, devices, bn)."""

    model: str
    strategy: str
    devices: int
    bn: str

    def __post_init__(self):
        for name in ("model", "strategy", "bn"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or SEPARATOR in value:
                raise ValueError(
                    f"a measurement key's {name} must be a name without {SEPARATOR!r}: {value!r}"
                )
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError(
                f"a measurement key's devices must be a positive whole number: {self.devices!r}"
            )

    def to_str(self) -> str:
        return SEPARATOR.join((self.model, self.strategy, str(self.devices), self.bn))

    @classmethod
    def parse(cls, text: str) -> MeasurementKey:
        """The key `model|strategy|devices|bn`; ValueError in one line if `text` is not one."""
        parts = text.split(SEPARATOR) if isinstance(text, str) else []
        if len(parts) != 4 or not parts[2].isdigit():
            raise ValueError(f"not a measurement key (model|strategy|devices|bn): {text!r}")
        model, strategy, devices, bn = parts
        return cls(model, strategy, int(devices), bn)

    def part(self, *names: str) -> str:
        """Where one quantity of this run is stored: part("loss"), part("grad", "fc1.weight")."""
        return SEPARATOR.join((self.to_str(), *names))

    def float64(self) -> MeasurementKey:
        """The same configuration's float64 run."""
        return replace(self, strategy=self.strategy + FLOAT64)

    def run_of(self, strategy: str) -> MeasurementKey:
        """Another run of the same model, devices and BatchNorm mode (a reference run: FLOAT64_RUN, IN_ORDER)."""
        return replace(self, strategy=strategy)

    def on(self, devices: int) -> MeasurementKey:
        """The same run on another device count."""
        return replace(self, devices=devices)

    @property
    def is_strategy_run(self) -> bool:
        """A strategy's float32 run: not its float64 run and not one of the reference's own float64 runs."""
        return self.strategy not in REFERENCE_RUNS and not self.strategy.endswith(FLOAT64)


def forward_key(model: str, mode: str, dtype: str = "float32") -> str:
    """Where the logits of the first batch (1 device, BatchNorm in `mode`: train or eval) are stored."""
    if dtype == "float64":  # (the reference backend's own, to measure its float32 rounding)
        return SEPARATOR.join((model, FLOAT64_RUN, "forward", mode))
    return SEPARATOR.join((model, "forward", mode))


def float64_key(model: str, *parts: str) -> str:
    """Where the first batch's mean loss and gradients in float64 (1 device) are stored: float64_key(model,
    "loss"), float64_key(model, "grad", name)."""
    return SEPARATOR.join((model, FLOAT64_RUN, *parts))


def bn_applies(model: str, bn: str) -> bool:
    """Whether BatchNorm mode `bn` makes a configuration of `model` of its own: LeNet has no BatchNorm, so its
    sync runs would be its local ones, and are not measured."""
    return not (bn == "sync" and model == "lenet")


class JobError(ValueError):
    """A check job that is not one; the message says what is wrong, in one line."""


@dataclass(frozen=True)
class CheckJob:
    """One backend's part of `harness check`: the models (each with its canonical weights file), strategies,
    device counts (global) and BatchNorm modes to measure, on the batches file, at learning rate `lr`.
    `float64`: the reference backend, which measures its float64 logits and float64 runs too. `nodes` > 1: this
    is node `node_rank` of that many, joined at `coordinator` (results.json's config keys of the same names)."""

    models: tuple[str, ...]
    strategies: tuple[str, ...]
    devices: tuple[int, ...]
    bn: tuple[str, ...]
    lr: float
    device_kind: str
    float64: bool
    weights: dict[str, str]  # model -> canonical weights file
    batches: str  # the batches file: x and y, one row per step
    nodes: int = 1
    node_rank: int = 0
    coordinator: str | None = None

    def configurations(self, model: str) -> list[tuple[int, str]]:
        """(devices, BatchNorm mode) of every configuration of `model` the job measures, in the order measured."""
        return [(k, bn) for k in self.devices for bn in self.bn if bn_applies(model, bn)]

    def keys(self, model: str) -> list[MeasurementKey]:
        """Every strategy's run of `model` the job measures, in the order measured."""
        return [
            MeasurementKey(model, strategy, k, bn)
            for strategy in self.strategies
            for k, bn in self.configurations(model)
        ]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, data) -> CheckJob:
        """The job a JSON object describes; JobError, in one line, if it is not one."""
        if not isinstance(data, dict):
            raise JobError(f"a check job is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(data) - known):
            raise JobError(f"unknown field {unknown[0]!r}")
        if missing := [name for name in REQUIRED if name not in data]:
            raise JobError(f"missing field {missing[0]!r}")
        for name, value in data.items():
            valid, what = RULES[name]
            if not valid(value):
                raise JobError(f"{name!r} must be {what}, not {value!r:.80}")
        sequences = {name: tuple(data[name]) for name in ("models", "strategies", "devices", "bn")}
        job = cls(**{**data, **sequences, "lr": float(data["lr"])})
        job.check_consistent()
        return job

    def check_consistent(self) -> None:
        """What no single field can say: every model's weights, and a node among the job's nodes."""
        if missing := [m for m in self.models if m not in self.weights]:
            raise JobError(f"no weights file for model {missing[0]!r}")
        if self.node_rank >= self.nodes:
            raise JobError(f"'node_rank' {self.node_rank} is not one of {self.nodes} nodes")
        if self.nodes > 1 and self.coordinator is None:
            raise JobError(f"{self.nodes} nodes need a 'coordinator'")

    @classmethod
    def load(cls, path) -> CheckJob:
        """The job in file `path`, read as untrusted input: JobError in one line, naming the file, if it cannot
        be read or is not a check job."""
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as e:
            raise JobError(f"check job {path}: cannot read it: {e.strerror or e}") from None
        except ValueError as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
            raise JobError(f"check job {path}: not JSON: {e}") from None
        try:
            return cls.from_dict(data)
        except JobError as e:
            raise JobError(f"check job {path}: {e}") from None


# ------------------------------------------------------------------------- the fields of a job file


def _names(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_name(v) for v in value)


def _name(value) -> bool:
    return isinstance(value, str) and bool(value) and SEPARATOR not in value


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _counts(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_whole(v) and v >= 1 for v in value)


def _bn_modes(value) -> bool:
    return isinstance(value, list) and bool(value) and all(v in BN_MODES for v in value)


def _positive_number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _files(value) -> bool:
    return isinstance(value, dict) and all(
        _name(k) and isinstance(v, str) and v for k, v in value.items()
    )


# Each field of a job file: the test its value must pass, and what the error says it must be.
RULES = {
    "models": (_names, "a list of model names"),
    "strategies": (_names, "a list of strategy names"),
    "devices": (_counts, "a list of device counts (whole numbers from 1)"),
    "bn": (_bn_modes, f"a list of BatchNorm modes ({', '.join(BN_MODES)})"),
    "lr": (_positive_number, "a positive number"),
    "device_kind": (lambda v: v in DEVICE_KINDS, " or ".join(map(repr, DEVICE_KINDS))),
    "float64": (lambda v: isinstance(v, bool), "true or false"),
    "weights": (_files, "an object of model name -> weights file"),
    "batches": (lambda v: isinstance(v, str) and bool(v), "a file name"),
    "nodes": (lambda v: _whole(v) and v >= 1, "a whole number from 1"),
    "node_rank": (lambda v: _whole(v) and v >= 0, "a whole number from 0"),
    "coordinator": (lambda v: v is None or (isinstance(v, str) and bool(v)), "HOST:PORT or null"),
}
REQUIRED = [f.name for f in fields(CheckJob) if f.name not in ("nodes", "node_rank", "coordinator")]

"""Result JSON: one per worker run, versioned, always written atomically; and the typed Result the report reads.

status is one of:
  ok           trained and evaluated every epoch
  failed       the worker (or one of its ranks) raised or crashed; `error` holds the tail
  diverged     a loss became NaN/inf
  timeout      the harness killed it after --timeout seconds
  unavailable  refused before starting (backend missing, strategy the hardware cannot run)
  interrupted  the user stopped the run

Schema versions: workers write a plain dict on the wire (new_result + the loop's metrics); the report converts it
once with Result.from_dict and reads attributes after that. Since v2, a run is what Result.to_dict writes: every
field present (null where a run has none) and the config with every RunConfig field. v1 files (older reports'
results.json) may lack fields and config fields added since (prefetch, compile_mode, ...): they still load. v3 (written
from now on) adds to results.json's meta the `provenance` of the report: the suite's version, the git commit, whether
the checkout had uncommitted changes, the host (harness/reporting/provenance.py); v1 and v2 files have none
(unknown). A v3 run also records what its framework compiled in each timed part (`compiles`) and
`epoch_over_steps`, and, with a device trace, `device_busy`; a run read from an older file gets both from its epochs,
step time and profile, the same figures.
"""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from common.config import RunConfig, flat_hints
from common.profiling import kernel_seconds

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # what load_result and load_results_json accept
STATUSES = ("ok", "failed", "diverged", "timeout", "unavailable", "interrupted")
ERROR_TAIL_CHARS = 2000


# The run's figures a worker may write as "nan" or "inf" (common.files.finite).
UNFINITE_FIGURES = ("compile_s", "final_test_acc", "epoch_over_steps", "device_busy")


def _unfinite(value):
    """The reverse of common.files.finite for one value: "nan", "inf", "-inf" back to floats."""
    return float(value) if value in ("nan", "inf", "-inf") else value


# ------------------------------------------------------------------------ the typed result


class _Record:
    """A dataclass read from / written to a JSON object; keys it does not know are kept in `extra`."""

    numeric = True  # its fields are numbers: "nan", "inf" (as common.files.finite writes them) read back as floats

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(
            **{k: _unfinite(v) if cls.numeric else v for k, v in d.items() if k in names},
            extra={k: v for k, v in d.items() if k not in names},
        )

    def to_dict(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"},
            **self.extra,
        }


@dataclass(frozen=True)
class Epoch(_Record):
    """One timed epoch (common/loop.py run_training)."""

    epoch: int | None = None
    time_s: float | None = None
    steps: int | None = None
    images: int | None = None
    images_per_s: float | None = None
    train_loss: float | None = None
    train_acc: float | None = None
    test_acc: float | None = None
    # the host's seconds to assemble and pin (or stage) the epoch's batches before its timer, and inside it the
    # seconds spent putting them on the devices (absent from results written before)
    prepare_s: float | None = None
    feed_s: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepTime(_Record):
    """Steady-state step statistics (common/loop.py step_statistics)."""

    steps: int | None = None
    median_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    images_per_s: float | None = None
    # every timed step's seconds (absent from results written before)
    samples_s: list[float] | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Allreduce(_Record):
    """The strategy's allreduce of a gradient-sized buffer (common/loop.py allreduce_figure)."""

    values: int | None = None
    bytes: int | None = None
    repeats: int | None = None
    median_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    gb_per_s: float | None = None
    share_of_step: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Memory(_Record):
    peak_device_mb: float | None = None  # where the framework exposes it
    peak_host_rss_mb: float | None = None
    parameters_mb: float | None = None  # the parameters one device holds (fsdp: its shards)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SavedWeights(_Record):
    numeric = False
    path: str | None = None
    sha256: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    """One worker run as the report reads it. Build with Result.from_dict (any readable schema)."""

    status: str
    config: RunConfig
    # free-form, per backend (common/sysinfo.py, backends)
    environment: dict = field(default_factory=dict)
    epochs: tuple[Epoch, ...] = ()
    compile_s: float | None = None  # the warm-up step (compilation included)
    # What the framework compiled in each timed part ({"warmup", "epochs", "timed_steps"}; None: not counted).
    compiles: dict | None = None
    # The mean timed epoch over (its steps x the median timed step): common/loop.py's epoch_over_steps.
    epoch_over_steps: float | None = None
    # With a device trace, the share of an epoch's step the device is busy: device_busy() below.
    device_busy: float | None = None
    # The timed epochs' energy from the devices' counters, or why it was not measured (common/energy.py's
    # RunEnergy.record); None in a result from before it was recorded
    energy: dict | None = None
    params: int | None = None
    weights_hash: str | None = None  # the initial weights' canonical fingerprint
    data_hash: str | None = None  # the training batch sequence
    error: str | None = None
    final_test_acc: float | None = None
    # --target-accuracy: {"accuracy", "reached", "epoch", "train_s", "wall_s"} (common/loop.py target_record)
    target: dict | None = None
    saved_weights: SavedWeights | None = None
    step_time: StepTime | None = None
    allreduce: Allreduce | None = None
    # --profile: the trace's name and where a step's time goes (common/profiling.py summary); None without it
    profile: dict | None = None
    # the framework's measured matmul peak on this host (common/loop.py measured_peak); None where not measured
    peak: dict | None = None
    # --grad-dtype bf16: each step's distance from the float32 exchange's (common/after_training.py
    # exchange_rounding), {"against", "steps"}; None for an exact exchange
    rounding: dict | None = None
    memory: Memory | None = None
    test_examples: int | None = None
    train_examples: int | None = None
    log: str | None = None  # set by the harness: logs/<run>.log
    mllog: str | None = (
        None  # set by the harness: logs/<run>.mllog, MLPerf's log lines (common/mllog.py)
    )
    trial: int | None = None  # set by the harness with --repeat: 1, 2, ... (else None)
    extra: dict = field(default_factory=dict)  # top-level fields this version does not know

    PARTS = {
        "step_time": StepTime,
        "allreduce": Allreduce,
        "memory": Memory,
        "saved_weights": SavedWeights,
    }

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        """A validated result dict (see result_problem) of any readable schema."""
        if not isinstance(d, dict) or not isinstance(d.get("config"), dict) or "status" not in d:
            raise ValueError("not a result: it needs a status and a config")
        names = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: _unfinite(v) if k in UNFINITE_FIGURES else v for k, v in d.items() if k in names}
        # A config without prefetch predates the lever: each step copied its own batch (--prefetch 0).
        kw["config"] = RunConfig.from_dict({"prefetch": 0, **d["config"]})
        kw["environment"] = dict(d.get("environment") or {})
        kw["epochs"] = tuple(Epoch.from_dict(e) for e in d.get("epochs") or [])
        for name, part in cls.PARTS.items():
            value = d.get(name)
            kw[name] = (
                part.from_dict(value) if value or (name == "memory" and value is not None) else None
            )
        if kw.get("epoch_over_steps") is None:  # a result from before the figure was recorded
            step_time, epochs = kw.get("step_time"), kw["epochs"]
            kw["epoch_over_steps"] = epoch_over_steps(
                [e.time_s for e in epochs],
                epochs[0].steps if epochs else 0,
                step_time and step_time.median_s,
            )
        if kw.get("device_busy") is None:  # nor this one
            epochs = kw["epochs"]
            kw["device_busy"] = device_busy(
                [e.time_s for e in epochs], epochs[0].steps if epochs else 0, kw.get("profile")
            )
        extra = {k: v for k, v in d.items() if k not in names and k != "schema_version"}
        return cls(**kw, extra=extra)

    def to_dict(self) -> dict:
        """The current schema: every field, in the order the worker writes them."""
        out = {"schema_version": SCHEMA_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            if f.name == "config":
                value = value.to_dict()
            elif f.name == "epochs":
                value = [e.to_dict() for e in value]
            elif f.name == "environment":
                value = dict(value)
            elif isinstance(value, _Record):
                value = value.to_dict()
            out[f.name] = value
        return {**out, **self.extra}

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self) -> dict:
        """The headline numbers: mean over all epochs (as d2l), warm-up excluded by the loop."""
        if not self.epochs:  # evaluation only (--epochs 0 with --load-weights)
            return {} if self.final_test_acc is None else {"test_acc": self.final_test_acc}
        seconds = sum(e.time_s for e in self.epochs)
        return {
            "sec_per_epoch": seconds / len(self.epochs),
            "images_per_s": sum(e.images for e in self.epochs) / seconds,
            "test_acc": self.epochs[-1].test_acc,
            "train_loss": self.epochs[-1].train_loss,
        }


# Above this, a run's timed epochs took more than their steps, each timed alone, account for: the report shows the
# figure. Every strategy measured 0.95-1.25 in a parity run (2 steps an epoch, 2-core CPU), Keras's distribution
# 4.4-6 while it compiled inside its epoch.
CONSISTENCY_LIMIT = 1.3
# Below this, a run's epochs took less than their steps timed alone: each timed step, between two barriers, pays
# alone what an epoch's steps overlap (on a GPU, an asynchronous framework's dispatch and its sync). jax's ResNet-18
# on an H200: 4.0 ms an epoch's step against a 5.08 ms timed one (0.79).
CONSISTENCY_LOW = 0.85


def epoch_over_steps(
    epoch_seconds: list[float], steps: int, median_step_s: float | None
) -> float | None:
    """The mean timed epoch over (its steps x the median timed step): about 1 when an epoch is its steps; well
    above 1 when something is paid inside the epochs but not by a step timed alone (a compile, a re-placement
    of the state, a host sync). None without the figures (no timed steps)."""
    if not epoch_seconds or not steps or not median_step_s:
        return None
    return sum(epoch_seconds) / len(epoch_seconds) / (steps * median_step_s)


def device_busy(epoch_seconds: list[float], steps: int, profile: dict | None) -> float | None:
    """The share of an epoch's step the device is busy: the kernels' seconds per step (the device trace's
    breakdown, common/profiling.py kernel_seconds) over the mean timed epoch's seconds per step. Well below 1, the
    device waits for the host; about 1, the device bounds the run. None without a device trace or epochs."""
    kernels = kernel_seconds(profile)
    if kernels is None or not epoch_seconds or not steps or not sum(epoch_seconds):
        return None
    return kernels / (sum(epoch_seconds) / len(epoch_seconds) / steps)


# ------------------------------------------------------------------------ results on the wire (dicts)


def new_result(config: dict, status: str = "failed") -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "config": config,
        "environment": {},
        "epochs": [],
        "compile_s": None,
        "params": None,
        "weights_hash": None,
        "data_hash": None,
        "error": None,
    }


def failed_result(config: dict, status: str, error: str) -> dict:
    result = new_result(config, status)
    result["error"] = tail(error)
    return result


def tail(text: str, n: int = ERROR_TAIL_CHARS) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (ValueError, RecursionError) as e:  # not JSON (or not UTF-8), or absurdly nested
        raise ValueError(f"{path}: not a JSON file ({type(e).__name__})") from None


def load_result(path, config: dict) -> dict:
    """Read the result of the run given `config` and check it holds what the report reads, with the types it
    expects: a worker's file is untrusted input. ValueError, with a one-line reason, otherwise."""
    result = _read_json(path)
    problem = result_problem(result, config)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return result


# The meta fields the report's header reads (in every schema; `provenance` is checked apart: v1 and v2 lack it).
META_FIELDS = ("run_id", "command", "started", "preset", "data_source")
# results.json's meta["provenance"] (v3; null or absent: unknown), each field null where it could not be found.
PROVENANCE_TYPES = {"version": str, "commit": str, "uncommitted_changes": bool, "host": str}
# provenance["machine"] (common/sysinfo.py machine, with the GPUs the harness found): absent from reports written
# before it was recorded (unknown), each field null where it could not be found; lists hold names.
MACHINE_TYPES = {
    "cpu": str,
    "cpu_vendor": str,
    "cpu_family": int,
    "cpu_model": int,
    "vector_isa": list,
    "cpus": int,
    "gpus": list,
}


def readable_versions() -> str:
    """The readable schemas in words, e.g. "v1, v2 or v3"."""
    names = [f"v{v}" for v in READABLE_VERSIONS]
    return ", ".join(names[:-1]) + " or " + names[-1]


def provenance_problem(provenance) -> str | None:
    """Why `provenance` is not a record the report and compare can print (None: it is, or it is unknown)."""
    if provenance is None:
        return None
    if not isinstance(provenance, dict):
        return f"provenance is a {type(provenance).__name__}, not an object"
    for name, kind in PROVENANCE_TYPES.items():
        value = provenance.get(name)
        if value is not None and not isinstance(value, kind):
            return f"provenance.{name} is a {type(value).__name__}"
    commit = provenance.get("commit")
    if commit is not None and not re.fullmatch(r"[0-9a-f]{7,64}", commit):
        return "provenance.commit is not a git commit id"
    for name in ("version", "host"):  # printed in one line of the header
        value = provenance.get(name)
        if value is not None and not (value and value.isprintable()):
            return f"provenance.{name} is not one line of printable text"
    return machine_problem(provenance.get("machine"))


def machine_problem(machine) -> str | None:
    """Why provenance.machine is not one the report and compare can print (None: it is, or it is unknown)."""
    if machine is None:
        return None
    if not isinstance(machine, dict):
        return f"provenance.machine is a {type(machine).__name__}, not an object"
    for name, kind in MACHINE_TYPES.items():
        value = machine.get(name)
        if value is not None and not _machine_value(value, kind):
            return f"provenance.machine.{name} is not a {MACHINE_WORDS[kind]}"
    return None


MACHINE_WORDS = {str: "line of text", int: "whole number", list: "list of names"}


def _machine_value(value, kind) -> bool:
    if kind is int:
        return type(value) is int and value >= 0
    names = value if kind is list and isinstance(value, list) else [value]
    return isinstance(value, kind) and all(
        isinstance(n, str) and n and n.isprintable() for n in names
    )


def load_results_json(path) -> tuple[list[Result], dict]:
    """A report directory's results.json (or the file itself), of a readable schema: its runs as Results, and its
    meta (everything else, schema_version included). ValueError, with a one-line reason, otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = _read_json(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema_version") not in READABLE_VERSIONS:
        raise ValueError(f"{path}: not a results.json of schema {readable_versions()}")
    if not isinstance(doc.get("runs"), list):
        raise ValueError(f"{path}: it has no list of runs")
    for name in META_FIELDS:
        if not isinstance(doc.get(name), str):
            raise ValueError(f"{path}: {name} is missing or is not a string")
    problem = provenance_problem(doc.get("provenance"))
    if problem:
        raise ValueError(f"{path}: {problem}")
    results = []
    for i, run in enumerate(doc["runs"]):
        problem = result_problem(run)
        if problem:
            raise ValueError(f"{path}: run {i + 1}: {problem}")
        results.append(Result.from_dict(run))
    return results, {k: v for k, v in doc.items() if k != "runs"}


# Optional top-level fields and the types the report can use.
FIELD_TYPES = {
    "environment": dict,
    "error": (str, type(None)),
    "epochs": list,
    "memory": (dict, type(None)),
    "step_time": (dict, type(None)),
    "allreduce": (dict, type(None)),
    "profile": (dict, type(None)),
    "peak": (dict, type(None)),
    "target": (dict, type(None)),
    "weights_hash": (str, type(None)),
    "data_hash": (str, type(None)),
    "log": (str, type(None)),
    "mllog": (str, type(None)),
    "compiles": (dict, type(None)),
    "energy": (dict, type(None)),
    "saved_weights": (dict, type(None)),
}
# An epoch's figures a result must have; the feeding ones may be absent (results written before them).
EPOCH_FEEDING = ("prepare_s", "feed_s")
EPOCH_FIELDS = tuple(f.name for f in fields(Epoch) if f.name not in ("extra", *EPOCH_FEEDING))


def result_problem(result, config: dict | None = None) -> str | None:
    """Why `result` is not a usable result of the run given `config` (None: of a run its own config
    describes), or None."""
    if not isinstance(result, dict) or result.get("schema_version") not in READABLE_VERSIONS:
        return f"not a result of schema {readable_versions()}"
    if not isinstance(result.get("status"), str) or result["status"] not in STATUSES:
        return f"unknown status {result.get('status')!r}"
    if config is not None and result.get("config") != config:
        return "its config is missing or is not the one this run was given"
    if config is None:
        problem = config_problem(result.get("config"))
        if problem:
            return problem
    for name, kinds in FIELD_TYPES.items():
        if name in result and not isinstance(result[name], kinds):
            return f"{name} is a {type(result[name]).__name__}"
    for name in ("params", *UNFINITE_FIGURES):
        if result.get(name) is not None and not _number(result[name]):
            return f"{name} is not a number"
    compiles = result.get("compiles") or {}
    if not all(type(n) is int and n >= 0 for n in compiles.values()):
        return "compiles holds something other than counts"
    problem = energy_problem(result.get("energy"), len(result.get("epochs") or []))
    if problem:
        return problem
    environment = result.get("environment") or {}
    if not isinstance(environment.get("devices") or [], list) or not isinstance(
        environment.get("precision") or {}, dict
    ):
        return "environment.devices or environment.precision has the wrong type"
    if result.get("trial") is not None and not (
        type(result["trial"]) is int and result["trial"] >= 1
    ):
        return "trial is not a positive whole number"
    return _metrics_problem(result) if result["status"] == "ok" else None


# The energy record's figures: each a finite number, never negative (a count of joules, watts or images per joule)
ENERGY_FIGURES = (
    "joules_per_epoch",
    "images_per_joule",
    "average_w",
    "per_counter_w",
    "to_target_j",
)


def energy_problem(energy, epochs: int) -> str | None:
    """Why a result's `energy` is not a record the report can show of its `epochs` epochs (None: it is, or there is
    none)."""
    if energy is None:
        return None
    if not isinstance(energy.get("measured"), bool):
        return "energy.measured is not true or false"
    if not energy["measured"]:
        return None if isinstance(energy.get("why"), str) else "energy.why is not a reason"
    if not isinstance(energy.get("scope"), str):
        return "energy.scope is not a string"
    joules = energy.get("epochs_j")
    figures = [energy.get(name) for name in ENERGY_FIGURES]
    if not isinstance(joules, list) or not all(_number(j) and j >= 0 for j in joules):
        return "energy.epochs_j is not a list of joules"
    if len(joules) != epochs:
        return f"energy.epochs_j has {len(joules)} epochs, the run {epochs}"
    if not all(value is None or (_number(value) and value >= 0) for value in figures):
        return "an energy figure is not a number of at least 0"
    return None


def _config_types() -> dict:
    kinds = {}
    for name, hint in flat_hints().items():
        args = (
            typing.get_args(hint)
            if typing.get_origin(hint) in (typing.Union, type(int | None))
            else (hint,)
        )
        kinds[name] = tuple(
            {float: (int, float)}.get(a, (typing.get_origin(a) or a,)) for a in args
        )
    return {name: tuple(t for group in groups for t in group) for name, groups in kinds.items()}


CONFIG_TYPES = _config_types()


def config_problem(config) -> str | None:
    """Why `config` is not a run config RunConfig.from_dict can read (types only: a config that later rules
    would refuse still describes the run that had it), or None."""
    if not isinstance(config, dict):
        return "its config is missing"
    for name in ("backend", "strategy", "devices"):
        if name not in config:
            return f"its config lacks {name}"
    for name, kinds in CONFIG_TYPES.items():
        value = config.get(name)
        if name in config and (
            not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds
        ):
            return f"config.{name} is a {type(value).__name__}"
    if config["devices"] < 1:
        return "config.devices is not positive"
    return None


def _metrics_problem(result: dict) -> str | None:
    for epoch in result.get("epochs") or []:
        if not isinstance(epoch, dict) or not all(
            _number(epoch.get(name)) for name in EPOCH_FIELDS
        ):
            return f"an epoch record lacks one of {', '.join(EPOCH_FIELDS)} (finite numbers)"
        if any(
            epoch.get(name) is not None and not (_number(epoch[name]) and epoch[name] >= 0)
            for name in EPOCH_FEEDING
        ):
            return f"an epoch's {' or '.join(EPOCH_FEEDING)} is not a finite number of seconds"
        if epoch["time_s"] <= 0:
            return "an epoch took no time"
    required = {
        "step_time": ("median_s", "p10_s", "p90_s", "steps"),
        "allreduce": ("median_s", "bytes"),
        "memory": (),
    }
    optional = {
        "step_time": ("images_per_s",),
        "allreduce": ("gb_per_s", "share_of_step"),
        "memory": ("peak_device_mb", "peak_host_rss_mb", "parameters_mb"),
    }
    for name in required:
        part = result.get(name)
        if part is None:
            continue
        if not all(_number(part.get(k)) for k in required[name]) or not all(
            part.get(k) is None or _number(part[k]) for k in optional[name]
        ):
            return f"{name} lacks a field or has one that is not a number"
    problem = (
        profile_problem(result.get("profile"))
        or peak_problem(result.get("peak"))
        or target_problem(result.get("target"), len(result.get("epochs") or []))
        or rounding_problem(result.get("rounding"))
    )
    if problem:
        return problem
    samples = (result.get("step_time") or {}).get("samples_s")
    if samples is not None and not (
        isinstance(samples, list) and all(_number(s) and s > 0 for s in samples)
    ):
        return "step_time.samples_s is not a list of positive numbers"
    return None


def target_problem(target, epochs: int) -> str | None:
    """Why a run's --target-accuracy record (common/loop.py target_record) is not one the report can rank, or
    None. A run stops at the epoch that reaches its target: its last of `epochs`."""
    if target is None:
        return None
    if not (_number(target.get("accuracy")) and 0 < target["accuracy"] <= 1):
        return "target.accuracy is not an accuracy"
    if not isinstance(target.get("reached"), bool):
        return "target.reached is not true or false"
    if not target["reached"]:
        return None
    if not (type(target.get("epoch")) is int and target["epoch"] == epochs >= 1):
        return "target.epoch is not the run's last epoch"
    if not all(_number(target.get(k)) and target[k] > 0 for k in ("train_s", "wall_s")):
        return "target.train_s or target.wall_s is not a positive number"
    return None


def profile_problem(profile) -> str | None:
    """Why a run's profile record (common/profiling.py summary) is not one the report can show, or None."""
    if profile is None:
        return None
    if not isinstance(profile.get("steps"), int) or profile["steps"] < 1:
        return "profile.steps is not a positive whole number"
    if not _number(profile.get("step_s")):
        return "profile.step_s is not a number"
    trace = profile.get("trace")
    if trace is not None and not (
        isinstance(trace, str)
        and trace
        and not trace.startswith("/")
        and ".." not in trace.split("/")
    ):
        return "profile.trace is not a path inside the run's traces folder"
    if not isinstance(profile.get("error"), (str, type(None))):
        return "profile.error is not text"
    seconds = profile.get("seconds")
    if profile.get("error") is None and not (
        isinstance(seconds, dict)
        and seconds
        and all(isinstance(k, str) and _number(v) and v >= 0 for k, v in seconds.items())
    ):
        return "profile.seconds is not a table of seconds"
    for name in ("coverage", "trace_span_s"):
        if profile.get(name) is not None and not _number(profile[name]):
            return f"profile.{name} is not a number"
    launches = profile.get("launches")
    if launches is not None and not (
        isinstance(launches, dict)
        and set(launches) == {"graphs", "kernels"}
        and all(_number(v) and v >= 0 for v in launches.values())
    ):
        return "profile.launches is not a count of graphs and kernels"
    return None


def peak_problem(peak) -> str | None:
    """Why a run's measured peak (common/loop.py measured_peak) is not one the report can use, or None."""
    if peak is None:
        return None
    tflops = peak.get("tflops")
    if not isinstance(tflops, dict) or not all(
        isinstance(k, str) and (v is None or _number(v) and v > 0) for k, v in tflops.items()
    ):
        return "peak.tflops is not a table of positive rates"
    return None


def rounding_problem(rounding) -> str | None:
    """Why a run's measured rounding (common/after_training.py exchange_rounding) is not one the report can use,
    or None."""
    if rounding is None:
        return None
    if not isinstance(rounding, dict) or not isinstance(rounding.get("against"), str):
        return "rounding lacks what it is measured against"
    steps = rounding.get("steps")
    if not (isinstance(steps, list) and steps and all(_number(d) and d >= 0 for d in steps)):
        return "rounding.steps is not a list of distances"
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

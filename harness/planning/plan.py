"""Parsing and planning: from the parsed flags to a Plan (one RunConfig per backend x strategy x option
values x levers x device count, and the rows that will not run, with the reason), refusing bad input up front.
The levers are those asked for and, with --best, also the backend's best mode for the devices (its [best]).

Backends are known by their manifest, backends/<name>/backend.toml (common/manifest.py); nothing here
imports a framework or starts a process.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field

from common import levers as leverlib
from common import manifest
from common import weights as weightslib
from common.config import MAX_SIMULATED_DEVICES, ConfigError, RunConfig
from common.flags import default_of
from common.levers import PLAIN, Levers
from common.manifest import (
    BEST_LEVERS,
    Manifest,
    engine_refusal,
    missing_strategy,
    strategy_refusal,
)
from common.nodes import NodeSpec
from harness.errors import UsageError
from harness.nodes import nodes as nodelib
from harness.nodes.nodes import Topology
from harness.planning.datasets import check_subset_sizes, explicit_size, resolve_data, settle_data
from harness.planning.presets import PRESETS, Preset
from harness.planning.request import RunRequest, check_shared
from harness.processes import devices as devicelib

MAX_REPEAT = 100  # --repeat: trials of each configuration


# ------------------------------------------------------------------------- parsing


def parse_backends(text: str) -> list[str]:
    names = []
    for part in text.split(","):
        if part.strip().lower() == "all":
            names += list(manifest.known())
            continue
        name = manifest.canonical_name(part)
        if name is None:
            raise UsageError(f"unknown backend {part.strip()!r}; choose from {manifest.choices()}")
        names.append(name)
    return list(dict.fromkeys(names))


def most_nodes(nodes: str | None) -> int:
    """The largest node count --nodes names (a list, as --gpus is), 1 without it; bad input in one line."""
    return max(nodelib.parse_counts(nodes)) if nodes else 1


def parse_gpus(text: str) -> list[int]:
    parts = text.split(",")
    if len(parts) > 1 and not all(p.strip() for p in parts):
        # (1,,2 is a typo, not 1,2: the missing count may have been the one meant)
        raise UsageError(f"--gpus {text!r} has an empty element: give counts like 1,2,4")
    try:
        counts = [int(x) for x in parts if x.strip()]
    except ValueError:
        raise UsageError(
            f"--gpus takes a device count or a list like 1,2,4 (got {text!r})"
        ) from None
    if not counts:
        raise UsageError("--gpus needs at least one device count")
    for n in counts:
        if n < 1:
            raise UsageError(f"--gpus must be at least 1 (got {n})")
    return sorted(set(counts))


def parse_pythons(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        backend = manifest.canonical_name(name) if sep else None
        if backend is None or not path:
            raise UsageError(
                f"--python takes BACKEND=PATH, e.g. torch=/usr/bin/python3 (got {item!r})"
            )
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise UsageError(f"--python {name}: {path} is not an executable file")
        out[backend] = os.path.abspath(path)  # workers run from the project root, not from here
    return out


def parse_options(items: list[str], backends: dict[str, Manifest]) -> dict[str, list[str]]:
    """{name: [values]} from --option NAME=V1,V2, checked against what the selected backends declare."""
    declared = {name: o for b in backends.values() for name, o in b.options.items()}
    out = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not values:
            raise UsageError(f"--option takes NAME=VALUE (got {item!r})")
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise UsageError(
                f"unknown option {name!r} for the selected backends (they declare: {known})"
            )
        chosen = [v.strip() for v in values.split(",") if v.strip()]
        for v in chosen:
            if v not in declared[name].values:
                raise UsageError(
                    f"--option {name}={v}: choose from {', '.join(declared[name].values)}"
                )
        out[name] = list(dict.fromkeys(chosen))
    return out


def check_options_apply(
    options: dict[str, list[str]], backends: dict[str, Manifest], strategies
) -> None:
    """An option no selected strategy has would be dropped without a word (kvstore with MXNet scratch): refuse it."""
    for name in options:
        users = [
            f"{b} {s}"
            for b, picks in strategies.items()
            for s, _ in picks
            if name in backends[b].options_for(s)
        ]
        if not users:
            owners = [
                f"{b.name} {', '.join(b.options[name].strategies or b.strategies)}"
                for b in backends.values()
                if name in b.options
            ]
            raise UsageError(
                f"--option {name} does not apply to the selected strategies "
                f"(it applies to: {'; '.join(owners)})"
            )


def option_variants(
    backend: Manifest, strategy: str, asked: dict[str, list[str]], several_nodes: bool = False
) -> list[dict[str, str]]:
    """Every combination of the asked values of the options this strategy has, defaults for the rest (on
    several nodes, an option's default across nodes where it has one: MXNet's dist_sync kvstore)."""
    variants = [{}]
    for name, option in backend.options_for(strategy).items():
        default = option.nodes_default if several_nodes and option.nodes_default else option.default
        variants = [{**v, name: value} for v in variants for value in asked.get(name, [default])]
    return variants


# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    configs: list[RunConfig] = field(default_factory=list)
    not_run: list[tuple[RunConfig, str]] = field(default_factory=list)  # with the reason
    backends: dict[str, Manifest] = field(default_factory=dict)
    pythons: dict[str, str] = field(default_factory=dict)
    preset: str = ""
    topology: Topology = field(default_factory=Topology)
    device_kind: str = "cpu"
    gpus: list[str] = field(default_factory=list)
    detection: str = ""  # how the GPUs were found, or why the devices are simulated
    data_source: str = ""
    repeat: int = 1  # trials of each config (--repeat)
    # --best: what it does for each backend on these devices, one line each (the dry run's and the report's)
    best: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> list[tuple[RunConfig, int | None]]:
        """What runs, in order: each config with its trial number (None without --repeat). Trials are interleaved
        (every config's first trial, then every second one, ...) so that a slow spell of the host is spread over
        the configurations instead of falling on one."""
        if self.repeat == 1:
            return [(cfg, None) for cfg in self.configs]
        return [
            (trial_config(cfg, trial), trial)
            for trial in range(1, self.repeat + 1)
            for cfg in self.configs
        ]


def trial_config(cfg: RunConfig, trial: int) -> RunConfig:
    """A trial's config. With --target-accuracy, each trial after the first trains on a batch order of its own
    (order seed = seed + trial - 1) from the same initial weights: every framework is deterministic here, so
    repeating one order would repeat one time to target, and the spread that rounding alone gives a run's
    convergence would stay unmeasured (docs/time-to-accuracy.md)."""
    if cfg.target_accuracy is None or trial == 1:
        return cfg
    return dataclasses.replace(cfg, order_seed=cfg.seed + trial - 1)


@dataclass
class Devices:
    kind: str  # "gpu" or "cpu" (simulated)
    gpus: list[str]
    why: str  # devices.Detection.how, or "--device cpu"

    @property
    def line(self) -> str:
        """The one line printed before anything runs (and atop --list)."""
        if self.kind == "gpu":
            return f"devices: {devicelib.describe(self.gpus)}, {self.why}"
        return f"devices: simulated CPU devices ({self.why})"


def choose_devices(device: str) -> Devices:
    """The devices of --device `device` (auto, gpu or cpu)."""
    if device == "cpu":
        return Devices("cpu", [], "--device cpu")  # asked for: no need to look for GPUs
    found = devicelib.detect()
    if device == "gpu" and not found.gpus:
        raise UsageError(f"--device gpu: no GPU is visible ({found.how})")
    return Devices("gpu" if found.gpus else "cpu", found.gpus, found.how)


def check_device_counts(
    counts: list[int], kind: str, gpus: list[str], how: str = "", nodes_here: int = 1
) -> None:
    """`counts` devices per node, `nodes_here` nodes on this host (loopback nodes share its devices)."""
    if nodes_here > 1:
        needed = max(counts) * nodes_here
        if kind == "gpu" and needed > len(gpus):
            raise UsageError(
                f"{nodes_here} nodes x --gpus {max(counts)} on this host need {needed} GPUs; "
                f"{len(gpus)} are visible" + (f" ({how})" if how else "")
            )
        if kind == "cpu" and needed > MAX_SIMULATED_DEVICES:
            raise UsageError(
                f"{nodes_here} nodes x --gpus {max(counts)}: at most {MAX_SIMULATED_DEVICES} simulated "
                "CPU devices on one host"
            )
    if kind == "gpu" and max(counts) > len(gpus):
        listed = "; ".join(f"{i}: {g}" for i, g in enumerate(gpus))
        raise UsageError(
            f"--gpus {max(counts)} asks for more devices than the {len(gpus)} visible GPU(s) ({listed})"
            + (f", {how}" if how else "")
        )
    if kind == "cpu" and max(counts) > MAX_SIMULATED_DEVICES:
        raise UsageError(
            f"--gpus {max(counts)}: at most {MAX_SIMULATED_DEVICES} simulated CPU devices"
        )


def select_strategies(
    strategy: str | None,
    backends: dict[str, Manifest],
    kind: str,
    bn: str = "local",
    nodes: int = 1,
    variants: bool = False,
):
    """{backend: [(strategy, reason-not-run or None)]} of --strategy `strategy` (a comma list; None: every one, the
    variants, backend.toml's `variant` strategies, only if `variants`), refusing what cannot run if it was asked for
    (on any node count of the sweep, `nodes` the smallest)."""
    asked = [s.strip() for s in strategy.split(",") if s.strip()] if strategy else None
    if asked:
        for s in asked:
            if backends and not any(s in b.strategies for b in backends.values()):
                raise UsageError(unknown_strategy(s, backends))
    chosen = {}
    for b in backends.values():
        picks = []
        for s in asked or [s.name for s in b.strategies.values() if variants or not s.variant]:
            if s not in b.strategies:
                continue
            reason = strategy_refusal(b, s, kind, bn, nodes)
            if reason and asked:
                raise UsageError(f"strategy {s!r} cannot run here: {reason}")
            picks.append((s, reason))
        chosen[b.name] = picks
    return chosen


def unknown_strategy(strategy: str, backends: dict[str, Manifest]) -> str:
    """No selected backend runs `strategy`: each one's reason where its backend.toml gives one, else its
    strategies."""
    if refused := [b for b in backends.values() if strategy in b.strategies_refused]:
        return "; ".join(missing_strategy(b, strategy) for b in refused)
    offered = "; ".join(f"{b.name}: {', '.join(b.strategies)}" for b in backends.values())
    return f"unknown strategy {strategy!r} for the selected backends ({offered})"


def check_best(request: RunRequest) -> None:
    """--best decides the levers of backend.toml's [best]: one of them asked for as well is a contradiction."""
    # (a lever not asked for holds its flag's default: None for a compile mode, so that `--compile-mode default`
    # asks for a mode as well)
    unasked = {f.name: default_of(f) for f in dataclasses.fields(Levers)}
    given = {
        leverlib.flag_words(name, True): getattr(request.levers, name) != unasked[name]
        for name in BEST_LEVERS
    }
    explicit = [flag for flag, asked in given.items() if asked]
    if request.runs.best and explicit:
        raise UsageError(
            f"--best chooses {', '.join(given)} per backend (its backend.toml's [best]); "
            f"drop {', '.join(explicit)} or --best"
        )


def asked_levers(request: RunRequest) -> Levers:
    """The levers of the run as asked, every one (a compile mode not given: the default mode)."""
    return dataclasses.replace(
        request.levers, compile_mode=request.levers.compile_mode or PLAIN["compile_mode"]
    )


def lever_variants(request: RunRequest, backend: Manifest, kind: str) -> list[Levers]:
    """The levers of each row a strategy gets: the run as asked and, with --best, the same with the backend's best
    mode on top (one row where its best is its default)."""
    asked = asked_levers(request)
    best = backend.best.on(kind)
    if not request.runs.best or not best:
        return [asked]
    return [asked, dataclasses.replace(asked, **best)]


def best_note(backend: Manifest, kind: str) -> str:
    """What --best does for `backend` on `kind` devices, in one line."""
    best = backend.best.on(kind)
    if not best:
        return f"{backend.name}: best is the default: {backend.best.why}"
    switched = Levers(**best).on
    return f"{backend.name}: best switches on {', '.join(switched)}: {backend.best.why}"


def refused_levers(request: RunRequest, backends: dict[str, Manifest], kind: str) -> dict[str, str]:
    """{backend: why it cannot run the asked levers}; an error if no selected backend can."""
    asked = asked_levers(request).asked
    if request.levers.compile_mode not in (None, "default") and not request.levers.compile:
        raise UsageError(f"--compile-mode {request.levers.compile_mode} needs --compile")
    if request.levers.compile_mode == "reduce-overhead" and kind != "gpu":
        raise UsageError(
            "--compile-mode reduce-overhead captures CUDA graphs; there are none on the CPU"
        )
    if asked.get("precision") == "tf32" and kind != "gpu":
        raise UsageError(
            "--precision tf32: TF32 is a mode of NVIDIA tensor cores (Ampere and later); "
            "there is none on the CPU"
        )
    refused = {}
    for b in backends.values():
        reasons = leverlib.refusals(b.levers, asked)
        if reasons:
            refused[b.name] = f"{b.name} refuses " + "; ".join(reasons)
    runnable = [b for b in backends.values() if b.name not in refused]
    if asked and not runnable:
        raise UsageError("; ".join(refused.values()) or "no selected backend runs these levers")
    return refused


@dataclass(frozen=True)
class Row:
    """One planned run's place in the sweep: the backend's strategy with its options and levers, on `devices`
    devices in all over `nodes`."""

    backend: str
    strategy: str
    options: dict[str, str]
    levers: Levers
    nodes: NodeSpec
    devices: int
    kind: str  # the device kind, "gpu" or "cpu" (simulated)


# The request's flags every run takes as they are (RunConfig's names), by the request's group that holds them
AS_ASKED = {
    "data": ("dataset", "image_size"),
    "recipe": ("seed", "bn"),
    "each_run": ("timeout", "threads", "profile", "profile_epoch", "compile_cache"),
}


def as_asked(request: RunRequest) -> dict:
    """The flags of AS_ASKED, by their names."""
    return {
        name: getattr(getattr(request, group), name)
        for group, names in AS_ASKED.items()
        for name in names
    }


def recipe(preset: Preset, devices: int) -> dict:
    """What `preset` trains on `devices` devices (the flags already in it), by RunConfig's names."""
    return {
        "model": preset.model,
        "epochs": preset.epochs,
        "batch_size": preset.batch(devices),
        "lr": preset.learning_rate(devices),
        "train_size": explicit_size(preset.train_size, preset.dataset, 0),
        "test_size": explicit_size(preset.test_size, preset.dataset, 1),
        "init": preset.init,
        "timed_steps": preset.timed_steps,
        "target_accuracy": preset.target_accuracy,
    }


def absolute(path: str | None) -> str | None:
    """A path the workers, which run from the project root, read as the user meant it."""
    return os.path.abspath(path) if path else None


def make_config(request: RunRequest, preset: Preset, row: Row, data_dir: str | None) -> RunConfig:
    """The run of `row`: `preset`'s recipe, the request's settings, the row's levers and nodes."""
    cfg = RunConfig(
        backend=row.backend,
        strategy=row.strategy,
        devices=row.devices,
        device_kind=row.kind,
        simulated=(row.kind == "cpu"),
        options=row.options,
        levers=row.levers,
        nodes=row.nodes,
        data_dir=data_dir,
        **recipe(preset, row.devices),
        **as_asked(request),
        load_weights=absolute(request.each_run.load_weights),
        save_weights=absolute(request.each_run.save_weights),
    )
    try:
        return cfg.validate()
    except ConfigError as e:
        raise UsageError(str(e)) from None


def default_gpus(topology, kind: str, gpus: list[str]) -> list[int]:
    """--gpus when not given: the GPUs per node a launcher gives (Slurm's), else 1 and 2 (1 across nodes, or with
    a single GPU)."""
    given = nodelib.launcher_gpus()
    if given:
        return [given]
    return [1] if max(topology.counts) > 1 else [1, 2] if kind == "cpu" or len(gpus) >= 2 else [1]


def build_plan(request: RunRequest) -> Plan:
    names = parse_backends(request.runs.backend)
    check_best(request)
    pythons = parse_pythons(request.runs.python)
    devices = choose_devices(request.devices.device)
    kind, gpus = devices.kind, devices.gpus
    topology = nodelib.from_request(request.nodes)
    counts = (
        parse_gpus(request.devices.gpus)
        if request.devices.gpus is not None
        else default_gpus(topology, kind, gpus)
    )
    check_device_counts(
        counts, kind, gpus, devices.why, max(topology.counts) if topology.loopback else 1
    )
    check_shared(
        seed=request.recipe.seed,
        lr=request.recipe.lr,
        timeout=request.each_run.timeout,
        threads=request.each_run.threads,
    )
    if os.path.exists(request.output.out) and not os.path.isdir(request.output.out):
        raise UsageError(f"--out {request.output.out} exists and is not a directory")

    preset_name = (
        request.recipe.preset
        if request.recipe.preset != "auto"
        else ("d2l" if kind == "gpu" else "quick")
    )
    overridden = PRESETS[preset_name].with_flags(request.recipe, request.data, request.levers)
    preset, request = settle_data(request, overridden)
    backends = {n: manifest.load(n) for n in names}
    options = parse_options(request.runs.option, backends)
    strategies = select_strategies(
        request.runs.strategy, backends, kind, request.recipe.bn, min(topology.counts)
    )
    check_options_apply(options, backends, strategies)
    refused = refused_levers(request, backends, kind)
    data_dir, data_source, sizes = resolve_data(
        request.data, preset.model, (preset.train_size, preset.test_size)
    )
    check_subset_sizes(request.data, sizes)

    if not 1 <= request.each_run.repeat <= MAX_REPEAT:
        raise UsageError(
            f"--repeat must be between 1 and {MAX_REPEAT} (got {request.each_run.repeat})"
        )
    plan = Plan(
        backends=backends,
        pythons=pythons,
        device_kind=kind,
        gpus=gpus,
        detection=devices.why,
        data_source=data_source,
        preset=preset.title,
        topology=topology,
        repeat=request.each_run.repeat,
    )
    if request.runs.best:
        plan.best = {name: best_note(backends[name], kind) for name in names}
    sweep = Sweep(kind, counts, topology, options)
    for name in names:
        for strategy, reason in strategies[name]:  # (none: no asked strategy is this backend's)
            reason = reason or refused.get(name)
            for row in rows(request, sweep, backends[name], strategy):
                cfg = make_config(request, preset, row, data_dir)
                why = reason or engine_refusal(backends[name], strategy, row.nodes.count)
                if why:
                    plan.not_run.append((cfg, why))
                else:
                    plan.configs.append(cfg)
    check_weights_flags(request, plan)
    if request.each_run.compile_cache and plan.configs:  # (an absolute folder: RunConfig.validate)
        check_writable_folder(request.each_run.compile_cache, "--compile-cache")
    plan.configs = measuring_peaks(plan.configs)
    return plan


@dataclass(frozen=True)
class Sweep:
    """What every strategy's rows are swept over: the device counts per node (--gpus), the node counts this host
    takes part in, and the options asked for (--option, {name: [values]})."""

    kind: str  # the device kind, "gpu" or "cpu" (simulated)
    counts: list[int]
    topology: Topology
    options: dict[str, list[str]]


def rows(request: RunRequest, sweep: Sweep, backend: Manifest, strategy: str):
    """Every row of one strategy, in the plan's order: a variant's device counts together, so that the report's
    scaling reads each variant's rows."""
    topology = sweep.topology
    for m in filter(topology.runs_here, topology.counts):
        for variant in option_variants(backend, strategy, sweep.options, m > 1):
            for levers in lever_variants(request, backend, sweep.kind):
                for n in sweep.counts:
                    yield Row(
                        backend.name, strategy, variant, levers, topology.spec(m), n * m, sweep.kind
                    )


def measuring_peaks(configs: list[RunConfig]) -> list[RunConfig]:
    """The configs with the first of each backend asked to measure its framework's matmul peak after training:
    once per backend and device kind, which every row of that backend is held to (the report's machine limit)."""
    seen, out = set(), []
    for cfg in configs:
        first = (cfg.backend, cfg.device_kind) not in seen
        seen.add((cfg.backend, cfg.device_kind))
        out.append(dataclasses.replace(cfg, measure_peak=True) if first else cfg)
    return out


def check_weights_flags(request: RunRequest, plan: Plan) -> None:
    if request.each_run.load_weights:
        try:
            weightslib.load(
                request.each_run.load_weights, plan.configs[0].model if plan.configs else None
            )
        except weightslib.WeightsError as e:
            raise UsageError(str(e)) from None
    if request.each_run.save_weights is None:
        return
    if len(plan.runs) != 1:
        raise UsageError(
            f"--save-weights needs exactly one run (this request has {len(plan.runs)}): "
            "choose one --backend, --strategy and --gpus count, without --repeat"
        )
    if plan.configs[0].epochs == 0:
        raise UsageError(
            "--save-weights with --epochs 0: nothing is trained to save "
            "(the loaded weights are already in the --load-weights file)"
        )
    check_writable_file(request.each_run.save_weights, "--save-weights")


def check_writable_file(path: str, flag: str) -> None:
    """Refused before training rather than after it: PATH must not be a directory, and a file must be writable
    in its nearest existing ancestor (missing directories are created when the file is written)."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; name a file")
    probe_writable(nearest_existing(os.path.dirname(path)), path, flag)


def check_writable_folder(path: str, flag: str) -> None:
    """A folder flag (--compile-cache): PATH must not be a file, and a file must be writable in it, or in its
    nearest existing ancestor where it is yet to be made."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a file; name a folder")
    probe_writable(nearest_existing(path), path, flag)


def nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def probe_writable(folder: str, path: str, flag: str) -> None:
    """A probe file made and removed in `folder`, where PATH will be written: what the kernel says now (a
    read-only or pseudo file system, no permission, a full disk) is said before anything runs, not after."""
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dpbench-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {folder}: {e.strerror or e}") from None

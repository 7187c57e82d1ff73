"""`python -m harness`: validate the request, run every (backend, strategy, devices), write the report."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import data as datalib
from common import levers as leverlib
from common import weights as weightslib
from common import config as configlib
from common.config import BN_MODES, COMPILE_MODES, DATASETS, MODELS, PRECISIONS, ConfigError, RunConfig
from harness import devices as devicelib
from harness import envs, interrupts, registry, report, runner

DEFAULT_TIMEOUT = 3600.0

# d2l's recipe (GPU) and a quick CPU preset that finishes in a few minutes on 2 cores.
# Batch and learning rate are per device and scale with the device count, as d2l does
# (bs 256 / lr 0.1 on one GPU, bs 512 / lr 0.2 on two); --batch-size / --lr fix them instead.
PRESETS = {
    "d2l": {"title": "d2l recipe", "model": "resnet18", "epochs": 10, "batch_per_device": 256,
            "lr_per_device": 0.1, "train_size": None, "test_size": None, "timed_steps": 50},
    "quick": {"title": "CPU quick preset (data subset)", "model": "resnet18", "epochs": 2,
              "batch_per_device": 32, "lr_per_device": 0.05, "train_size": 2048, "test_size": 1000,
              "timed_steps": 10},
}


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(f"{message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where the help text does not already say what the default is."""

    def _get_help_string(self, action):
        if action.default in (None, False, []) or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


def nonempty(value: str) -> str:
    """An argparse type: an empty value is refused rather than read as "not given" (`--gpus ''`)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def name_list(value: str) -> str:
    """An argparse type: a comma list naming at least one thing (`--strategy ,` is not "every strategy")."""
    if not any(part.strip() for part in value.split(",")):
        raise argparse.ArgumentTypeError(f"{value!r} names nothing")
    return value


def absolute_path(value: str) -> str:
    """An argparse type: a non-empty path, made absolute now, since workers run from the project root."""
    return os.path.abspath(nonempty(value))


def check_shared(seed=0, lr=None, timeout=DEFAULT_TIMEOUT, threads=None) -> None:
    """The checks the main command and `harness check` share (common/config.py)."""
    try:
        configlib.check_seed(seed)
        configlib.check_timeout(timeout)
        configlib.check_threads(threads)
        if lr is not None:
            configlib.check_lr(lr)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m harness",
        description="Train the same ResNet-18 (or LeNet) on the same Fashion-MNIST batches with synchronous "
                    "data parallelism in PyTorch, JAX and MXNet, time every run with one rule, and write a "
                    "Markdown report under reports/.",
        epilog="Subcommands: `python -m harness test` runs the test suite (each backend inside its own "
               "environment). Examples: `python -m harness --backend torch --gpus 2`, "
               "`python -m harness --backend all --gpus 1,2 --strategy ddp,pmap`.",
        formatter_class=HelpFormatter)
    p.add_argument("--backend", type=name_list, default="all",
                   help="torch (alias pytorch), jax, mxnet, all, or a comma list")
    p.add_argument("--gpus", type=name_list, default=None,
                   help="data-parallel devices: a count (2) or a sweep (1,2,4). Default: 1,2 "
                        "(1 with a single GPU). Without GPUs these are simulated CPU devices")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                   help="auto: the GPUs if any are found (nvidia-smi, else the driver's /proc files), else "
                        "simulated CPU devices; cpu: simulated even where GPUs exist; gpu: refuse to run without one")
    p.add_argument("--strategy", type=name_list, default=None,
                   help="comma list (torch: scratch, dp, ddp). Default: every strategy that runs on this hardware")
    p.add_argument("--preset", choices=("auto", *PRESETS), default="auto",
                   help="d2l: 10 epochs, full data, batch 256 and lr 0.1 per device; quick: 2 epochs on "
                        "2,048/1,000 images, batch 32 and lr 0.05 per device. auto: d2l on GPUs, quick on CPU")
    p.add_argument("--model", choices=MODELS, default=None, help="network (default: the preset's, resnet18)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch, split evenly across the devices "
                        "(default: the preset's per-device batch x devices)")
    p.add_argument("--lr", type=float, default=None,
                   help="SGD learning rate (default: the preset's per-device lr x devices)")
    p.add_argument("--train-size", type=int, default=None,
                   help="train on the first N training images (default: the preset's)")
    p.add_argument("--test-size", type=int, default=None,
                   help="evaluate on the first N test images (default: the preset's)")
    p.add_argument("--dataset", choices=DATASETS, default="fashion-mnist",
                   help="synthetic: random images for smoke runs, labelled as such in the report")
    p.add_argument("--data-dir", type=absolute_path, default=None,
                   help="directory with the four Fashion-MNIST IDX files (.gz or not)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of the batch order")
    p.add_argument("--out", type=absolute_path, default="reports", help="reports are written to OUT/<run-id>/")
    p.add_argument("--python", action="append", type=nonempty, default=[], metavar="BACKEND=PATH",
                   help="run BACKEND with this interpreter (it must have the framework) instead of .venvs/BACKEND/")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds before a run is killed")
    p.add_argument("--threads", type=int, default=None,
                   help=f"CPU threads per worker process, 1 to {configlib.MAX_THREADS} "
                        "(default: the cores shared among the processes)")
    p.add_argument("--bn", choices=BN_MODES, default="local",
                   help="BatchNorm across devices: local (each device its shard's statistics, as d2l) or sync "
                        "(statistics over the global batch: k-device training is 1-device training)")
    p.add_argument("--load-weights", type=absolute_path, default=None, metavar="PATH",
                   help="start from these canonical weights (a file written by --save-weights, any backend); "
                        "with --epochs 0 they are only evaluated")
    p.add_argument("--save-weights", type=absolute_path, default=None, metavar="PATH",
                   help="write the trained weights, canonical, to PATH "
                        "(a run of one backend, strategy and device count)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="run a small equivalence check (`python -m harness check`: 5 steps on a few images) over "
                        "this report's backends, strategies and devices first, and put its table in the report")
    p.add_argument("--init", choices=weightslib.INITS, default="d2l",
                   help="initial weights: d2l (kernels ~ N(0, 0.01), the seeds' recipe) or he (the same draws "
                        "rescaled to He's std sqrt(2 / fan_in))")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (TF32 off, set explicitly), tf32 (TF32 matmuls and convolutions; NVIDIA GPUs) or bf16 "
                        "(bfloat16 compute, float32 weights and SGD); backends without it are reported as refused")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile for torch, hybridize for MXNet; JAX steps are always jit-compiled")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="with --compile, torch only: torch.compile's mode (reduce-overhead: CUDA graphs, GPU only; "
                        "max-autotune: autotuned kernels, long compiles)")
    p.add_argument("--channels-last", action="store_true", help="torch only: NHWC memory format for model and batches")
    p.add_argument("--resident-data", action="store_true",
                   help="copy each epoch's batches to the devices before its timer starts (no host-to-device "
                        "copy inside the timed steps)")
    p.add_argument("--prefetch", type=int, default=2, metavar="N",
                   help="put each batch on the devices N batches ahead of its step (pinned host memory and a copy "
                        "stream on CUDA), so copies overlap compute; 0: each step copies its own batch")
    p.add_argument("--timed-steps", type=int, default=None,
                   help="steps timed one by one after training, for the step-time median and spread "
                        "(default: the preset's; 0 skips them and the allreduce figure)")
    p.add_argument("--option", action="append", type=nonempty, default=[], metavar="NAME=VALUE[,VALUE]",
                   help="a backend-specific option declared in its backend.toml (see --list), e.g. kvstore=local; "
                        "several values run one variant each, e.g. hybridize=on,off")
    p.add_argument("--list", action="store_true", help="show the backends, strategies and devices, then exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only a line per finished run")
    return p


# ------------------------------------------------------------------------- parsing

def parse_backends(text: str) -> list[str]:
    names = []
    for part in text.split(","):
        if part.strip().lower() == "all":
            names += registry.KNOWN
            continue
        name = registry.canonical_name(part)
        if name is None:
            raise UsageError(f"unknown backend {part.strip()!r}; choose from torch (pytorch), jax, mxnet, all")
        names.append(name)
    return list(dict.fromkeys(names))


def parse_gpus(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus takes a device count or a list like 1,2,4 (got {text!r})") from None
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
        backend = registry.canonical_name(name) if sep else None
        if backend is None or not path:
            raise UsageError(f"--python takes BACKEND=PATH, e.g. torch=/usr/bin/python3 (got {item!r})")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise UsageError(f"--python {name}: {path} is not an executable file")
        out[backend] = os.path.abspath(path)   # workers run from the project root, not from here
    return out


def parse_options(items: list[str], backends: dict[str, registry.Backend]) -> dict[str, list[str]]:
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
            raise UsageError(f"unknown option {name!r} for the selected backends (they declare: {known})")
        chosen = [v.strip() for v in values.split(",") if v.strip()]
        for v in chosen:
            if v not in declared[name].values:
                raise UsageError(f"--option {name}={v}: choose from {', '.join(declared[name].values)}")
        out[name] = list(dict.fromkeys(chosen))
    return out


def check_options_apply(options: dict[str, list[str]], backends: dict[str, registry.Backend], strategies) -> None:
    """An option no selected strategy has would be dropped without a word (kvstore with MXNet scratch): refuse it."""
    for name in options:
        users = [f"{b} {s}" for b, picks in strategies.items() for s, _ in picks if name in backends[b].options_for(s)]
        if not users:
            owners = [f"{b.name} {', '.join(b.options[name].strategies or b.strategies)}"
                      for b in backends.values() if name in b.options]
            raise UsageError(f"--option {name} does not apply to the selected strategies "
                             f"(it applies to: {'; '.join(owners)})")


def option_variants(backend: registry.Backend, strategy: str, asked: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the asked values of the options this strategy has, defaults for the rest."""
    variants = [{}]
    for name, option in backend.options_for(strategy).items():
        variants = [{**v, name: value} for v in variants for value in asked.get(name, [option.default])]
    return variants


# --------------------------------------------------------------------------- plan

@dataclass
class Plan:
    configs: list[RunConfig] = field(default_factory=list)
    not_run: list[tuple[RunConfig, str]] = field(default_factory=list)   # with the reason
    backends: dict[str, registry.Backend] = field(default_factory=dict)
    pythons: dict[str, str] = field(default_factory=dict)
    preset: str = ""
    device_kind: str = "cpu"
    gpus: list[str] = field(default_factory=list)
    detection: str = ""          # how the GPUs were found, or why the devices are simulated
    data_source: str = ""


@dataclass
class Devices:
    kind: str                    # "gpu" or "cpu" (simulated)
    gpus: list[str]
    why: str                     # devices.Detection.how, or "--device cpu"

    @property
    def line(self) -> str:
        """The one line printed before anything runs (and atop --list)."""
        if self.kind == "gpu":
            return f"devices: {devicelib.describe(self.gpus)}, {self.why}"
        return f"devices: simulated CPU devices ({self.why})"


def choose_devices(args) -> Devices:
    if args.device == "cpu":
        return Devices("cpu", [], "--device cpu")   # asked for: no need to look for GPUs
    found = devicelib.detect()
    if args.device == "gpu" and not found.gpus:
        raise UsageError(f"--device gpu: no GPU is visible ({found.how})")
    return Devices("gpu" if found.gpus else "cpu", found.gpus, found.how)


def check_device_counts(counts: list[int], kind: str, gpus: list[str], how: str = "") -> None:
    if kind == "gpu" and max(counts) > len(gpus):
        listed = "; ".join(f"{i}: {g}" for i, g in enumerate(gpus))
        raise UsageError(f"--gpus {max(counts)} asks for more devices than the {len(gpus)} visible GPU(s) ({listed})"
                         + (f", {how}" if how else ""))
    if kind == "cpu" and max(counts) > devicelib.MAX_SIMULATED:
        raise UsageError(f"--gpus {max(counts)}: at most {devicelib.MAX_SIMULATED} simulated CPU devices")


def select_strategies(args, backends: dict[str, registry.Backend], kind: str, bn: str = "local"):
    """{backend: [(strategy, reason-not-run or None)]}, refusing what cannot run if it was asked for."""
    asked = [s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy else None
    if asked:
        implemented = [b for b in backends.values() if b.implemented]
        for s in asked:
            if implemented and not any(s in b.strategies for b in implemented):
                offered = "; ".join(f"{b.name}: {', '.join(b.strategies)}" for b in implemented)
                raise UsageError(f"unknown strategy {s!r} for the selected backends ({offered})")
    chosen = {}
    for b in backends.values():
        if not b.implemented:
            chosen[b.name] = []
            continue
        picks = []
        for s in (asked or list(b.strategies)):
            if s not in b.strategies:
                continue
            needs = b.strategies[s].requires
            reason = None
            if needs == "cuda" and kind != "gpu":
                reason = f"{b.name} {s} needs CUDA GPUs; none is present ({b.strategies[s].summary})"
            elif bn not in b.strategies[s].bn:
                reason = f"{b.name} {s} has no {bn} BatchNorm (it runs: {', '.join(b.strategies[s].bn)})"
            if reason and asked:
                raise UsageError(f"strategy {s!r} cannot run here: {reason}")
            picks.append((s, reason))
        chosen[b.name] = picks
    return chosen


def refused_levers(args, backends: dict[str, registry.Backend], kind: str) -> dict[str, str]:
    """{backend: why it cannot run the asked levers}; an error if no selected backend can."""
    asked = leverlib.asked(precision=args.precision, compile=args.compile, compile_mode=args.compile_mode,
                           channels_last=args.channels_last, resident_data=args.resident_data)
    if args.compile_mode != "default" and not args.compile:
        raise UsageError(f"--compile-mode {args.compile_mode} needs --compile")
    if args.compile_mode == "reduce-overhead" and kind != "gpu":
        raise UsageError("--compile-mode reduce-overhead captures CUDA graphs; there are none on the CPU")
    if asked.get("precision") == "tf32" and kind != "gpu":
        raise UsageError("--precision tf32: TF32 is a mode of NVIDIA tensor cores (Ampere and later); "
                         "there is none on the CPU")
    refused = {}
    for b in backends.values():
        if not b.implemented:
            continue
        reasons = leverlib.refusals(b.declared_levers, asked)
        if reasons:
            refused[b.name] = f"{b.name} refuses " + "; ".join(reasons)
    runnable = [b for b in backends.values() if b.implemented and b.name not in refused]
    if asked and not runnable:
        raise UsageError("; ".join(refused.values()) or "no selected backend runs these levers")
    return refused


def resolve_data(args) -> tuple[str | None, str, tuple[int, int]]:
    """(data directory, where the data comes from, (training images, test images)).

    The files are read and verified here, once, so that bad data is one error before anything runs."""
    if args.dataset == "synthetic":
        return None, "synthetic (random images; not Fashion-MNIST)", datalib.SYNTHETIC_SIZES
    try:
        path = datalib.locate_or_download(args.data_dir)
        sizes = datalib.verify(path)
    except datalib.DataError as e:
        raise UsageError(str(e)) from None
    return str(path), f"Fashion-MNIST IDX files in {path} (SHA-256 verified before the runs and by each worker)", sizes


def check_subset_sizes(args, sizes: tuple[int, int]) -> None:
    """--train-size / --test-size may not ask for more images than the dataset has (they would be clipped
    while the report claimed the number asked for)."""
    for flag, asked, available, split in (("--train-size", args.train_size, sizes[0], "training"),
                                          ("--test-size", args.test_size, sizes[1], "test")):
        if asked is not None and asked > available:
            raise UsageError(f"{flag} {asked} is more than the {available} {split} images of {args.dataset}")


def make_config(args, preset: dict, backend: str, strategy: str, options: dict, n: int, kind: str,
                data_dir: str | None) -> RunConfig:
    """One run: the preset's values unless a flag overrides them; batch and lr scale with n by default."""
    cfg = RunConfig(
        backend=backend, strategy=strategy, devices=n, device_kind=kind, simulated=(kind == "cpu"),
        model=args.model or preset["model"],
        epochs=args.epochs if args.epochs is not None else preset["epochs"],
        batch_size=args.batch_size if args.batch_size is not None else preset["batch_per_device"] * n,
        lr=args.lr if args.lr is not None else preset["lr_per_device"] * n,
        train_size=args.train_size if args.train_size is not None else preset["train_size"],
        test_size=args.test_size if args.test_size is not None else preset["test_size"],
        dataset=args.dataset, data_dir=data_dir, seed=args.seed, timeout=args.timeout,
        threads=args.threads, options=options, bn=args.bn, init=args.init,
        precision=args.precision, compile=args.compile, channels_last=args.channels_last,
        resident_data=args.resident_data, compile_mode=args.compile_mode, prefetch=args.prefetch,
        timed_steps=args.timed_steps if args.timed_steps is not None else preset["timed_steps"],
        load_weights=os.path.abspath(args.load_weights) if args.load_weights else None,
        save_weights=os.path.abspath(args.save_weights) if args.save_weights else None)
    try:
        return cfg.validate()
    except ConfigError as e:
        raise UsageError(str(e)) from None


def build_plan(args) -> Plan:
    names = parse_backends(args.backend)
    pythons = parse_pythons(args.python)
    devices = choose_devices(args)
    kind, gpus = devices.kind, devices.gpus
    counts = parse_gpus(args.gpus) if args.gpus is not None else ([1, 2] if kind == "cpu" or len(gpus) >= 2 else [1])
    check_device_counts(counts, kind, gpus, devices.why)
    check_shared(seed=args.seed, lr=args.lr, timeout=args.timeout, threads=args.threads)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} exists and is not a directory")

    preset_name = args.preset if args.preset != "auto" else ("d2l" if kind == "gpu" else "quick")
    preset = PRESETS[preset_name]
    backends = {n: registry.load(n) for n in names}
    options = parse_options(args.option, backends)
    strategies = select_strategies(args, backends, kind, args.bn)
    check_options_apply(options, backends, strategies)
    refused = refused_levers(args, backends, kind)
    data_dir, data_source, sizes = resolve_data(args)
    check_subset_sizes(args, sizes)

    plan = Plan(backends=backends, pythons=pythons, device_kind=kind, gpus=gpus, detection=devices.why,
                data_source=data_source, preset=preset["title"])
    for name in names:
        for strategy, reason in strategies[name] or [("-", backends[name].reason)]:
            reason = reason or refused.get(name)
            for variant in option_variants(backends[name], strategy, options):
                for n in counts:
                    cfg = make_config(args, preset, name, strategy, variant, n, kind, data_dir)
                    if reason:
                        plan.not_run.append((cfg, reason))
                    else:
                        plan.configs.append(cfg)
    check_weights_flags(args, plan)
    return plan


def check_weights_flags(args, plan: Plan) -> None:
    if args.load_weights:
        try:
            weightslib.load(args.load_weights, plan.configs[0].model if plan.configs else None)
        except weightslib.WeightsError as e:
            raise UsageError(str(e)) from None
    if args.save_weights is None:
        return
    if len(plan.configs) != 1:
        raise UsageError(f"--save-weights needs exactly one run (this request has {len(plan.configs)}): "
                         "choose one --backend, --strategy and --gpus count")
    if plan.configs[0].epochs == 0:
        raise UsageError("--save-weights with --epochs 0: nothing is trained to save "
                         "(the loaded weights are already in the --load-weights file)")
    check_writable_file(args.save_weights, "--save-weights")


def check_writable_file(path: str, flag: str) -> None:
    """Refused before training rather than after it: PATH must not be a directory, and its nearest existing
    ancestor (missing directories are created when the file is written) must be a writable directory."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; name a file")
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"{flag} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise UsageError(f"{flag} {path}: {ancestor} is not writable")


# ---------------------------------------------------------------------------- run

def print_listing(devices: Devices) -> None:
    print(devices.line)
    for b in registry.all_backends().values():
        if not b.implemented:
            print(f"  {b.name:6} unavailable: {b.reason}")
            continue
        for s in b.strategies.values():
            needs = f" [needs {s.requires}]" if s.requires else ""
            print(f"  {b.name:6} {s.name:8} {s.summary}{needs}")
        for o in b.options.values():
            where = f" ({', '.join(o.strategies)})" if o.strategies else ""
            print(f"  {b.name:6} --option {o.name}={'|'.join(o.values)} (default {o.default}){where}: {o.summary}")
        for lever in b.levers.values():
            flag = "--" + lever.name.replace("_", "-") + (f" {'|'.join(lever.values)}" if lever.values else "")
            what = lever.summary or ""
            if lever.refused:
                what += ("; " if what else "") + f"refused{' otherwise' if lever.values else ''}: {lever.refused}"
            print(f"  {b.name:6} {flag}: {what}")


def backend_python(name: str, plan: Plan, say) -> str:
    if name in plan.pythons:
        return plan.pythons[name]
    return str(envs.ensure(name, plan.backends[name].requirements, say=say))


def execute(plan: Plan, workdir: Path, console: runner.Console, results: list[dict]) -> None:
    """Run the planned configs in order, appending each one's result to `results` as it ends; never lets
    one failure stop the others. An interrupt propagates: `results` then holds the runs that finished,
    and plan.configs[len(results):] are the ones that did not."""
    pythons: dict[str, str | Exception] = {}
    for cfg in plan.configs:
        if cfg.backend not in pythons:
            try:
                pythons[cfg.backend] = backend_python(cfg.backend, plan, console.say)
            except envs.EnvError as e:
                pythons[cfg.backend] = e
        python = pythons[cfg.backend]
        if isinstance(python, Exception):
            result = runner.not_run_result(cfg, "failed", f"environment setup failed: {python}")
            console.finished(cfg, result)
        else:
            result = runner.run(cfg, python, workdir, console)
        results.append(result)


def equivalence(plan: Plan, console: runner.Console) -> dict:
    """A small `harness check` over what this report runs, for its Equivalence section."""
    from harness import check
    counts = sorted({c.devices for c in plan.configs}) or [1]
    strategies = {}
    for c in plan.configs:
        strategies.setdefault(c.backend, [])
        if c.strategy not in strategies[c.backend]:
            strategies[c.backend].append(c.strategy)
    steps, batch = 5, 8 * math.lcm(*counts)
    cfg = plan.configs[0] if plan.configs else None
    if cfg is None:
        return {}
    dataset = (datalib.synthetic(steps * batch, 10, cfg.seed) if cfg.dataset == "synthetic"
               else datalib.load_fashion_mnist(Path(cfg.data_dir), steps * batch, 10))
    rows, failures, hashes = check.run_checks(plan.backends, plan.pythons, [cfg.model], strategies, counts, [cfg.bn],
                                              steps, batch, 0.1, cfg.seed, dataset, plan.device_kind,
                                              cfg.timeout, say=console.say, init=cfg.init)
    return {"rows": [r.__dict__ for r in rows], "failures": failures, "weights_hash": hashes,
            "setup": f"{cfg.model} ({cfg.init} init), {steps} steps of batch {batch} ({cfg.dataset}), lr 0.1, "
                     f"float32, bn {cfg.bn}",
            "table": check.table(rows)}


def run_benchmark(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print_listing(choose_devices(args))
        return 0
    plan = build_plan(args)
    console = runner.Console(quiet=args.quiet)
    meta = {
        "command": "python -m harness " + " ".join(shlex.quote(a) for a in argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "preset": plan.preset,
        "device_kind": plan.device_kind,
        "gpus": plan.gpus,
        "detection": plan.detection,
        "data_source": plan.data_source,
        "backends": sorted(plan.backends),
    }
    with create_staging(args.out, sorted(plan.backends)) as staging:
        results = run_all(plan, args, console, meta, staging.path)
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        interrupts.finishing()   # from here on a signal must not lose the results: it only sets the exit status
        final = save_report(staging, results, meta)
    console.say("\n" + "\n".join(report.summary_table(report.with_scaling(results))))
    if final is None:
        return interrupts.exit_status() or 1
    console.say(f"\nReport: {final / 'report.md'}")
    bad = [r for r in results if r["status"] not in ("ok", "unavailable")]
    return interrupts.exit_status() or (1 if bad else 0)


def create_staging(out: str, backends: list[str]) -> report.Staging:
    """The report's staging directory, made before any work starts: an --out that cannot hold a report
    (under a file, read-only, a name too long) fails now, in one line, not after hours of training."""
    try:
        return report.Staging(Path(out), backends).create()
    except OSError as e:
        raise UsageError(f"--out {out}: {e.strerror or e}") from None


def run_all(plan: Plan, args, console: runner.Console, meta: dict, workdir: Path) -> list[dict]:
    """The equivalence check, then every run. An interrupt (Ctrl-C, SIGTERM, SIGHUP) at any point ends
    them: the runs that finished keep their results, the others are reported as interrupted."""
    results = [runner.not_run_result(cfg, "unavailable", reason) for cfg, reason in plan.not_run]
    finished: list[dict] = []
    try:
        # Printed even with --quiet: which devices ran is what a result means, and it is one line.
        console.say(Devices(plan.device_kind, plan.gpus, plan.detection).line)
        cfg0 = (plan.configs or [c for c, _ in plan.not_run])[0]
        console.say(f"Preset: {plan.preset}: {cfg0.model}, {cfg0.epochs} epoch(s), "
                    f"train {cfg0.train_size or 'all'} / test {cfg0.test_size or 'all'} images; "
                    f"{len(plan.configs)} run(s)")
        if args.check:
            meta["equivalence"] = {"interrupted": True}   # replaced by the table if the check finishes
            meta["equivalence"] = equivalence(plan, console)
        execute(plan, workdir, console, finished)
    except KeyboardInterrupt as e:
        why = f"interrupted by {e}" if str(e) else "interrupted by the user"
        console.say(f"Interrupted ({str(e) or 'SIGINT'}): writing the report with the runs finished so far")
        # execute() appends one result per config, in order: the rest never finished
        finished += [runner.not_run_result(cfg, "interrupted", why) for cfg in plan.configs[len(finished):]]
    return results + finished


def save_report(staging: report.Staging, results: list[dict], meta: dict) -> Path | None:
    """The report's directory; None if it could not be written (a full disk, say), after one line
    saying where the results were kept instead."""
    try:
        return staging.commit(results, meta)
    except OSError as e:
        kept = staging.rescue(results, meta)
        print(f"harness: error: could not write the report in {staging.out}: {e.strerror or e}; "
              f"the results are kept in {kept}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["test"]:
            from harness import testing
            return testing.main(argv[1:])
        with interrupts.handled():   # SIGTERM and SIGHUP stop the harness the way Ctrl-C does
            try:
                if argv[:1] == ["check"]:
                    from harness import check
                    return check.main(argv[1:])
                return run_benchmark(argv)
            except KeyboardInterrupt:   # while planning, before anything ran: nothing to report
                print("harness: interrupted", file=sys.stderr)
                return interrupts.exit_status() or 130
    except UsageError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2

"""What a benchmark session is asked for, typed: the command line's words become a `RunRequest` once, at the
command's door (harness/arguments.py `request_of`), and below the commands the plan, the data, the nodes and the
session read it, never the parser's Namespace. `parity`'s is `run`'s with its own settled (`replace`).

Each field is its own flag (common/flags.py): its help and how its value is read are declared here, beside it,
and nowhere else (the levers' in common/levers.py, the nodes' in harness/nodes/nodes.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace

from common import config as configlib
from common import manifest
from common import weights as weightslib
from common.config import BN_MODES, DATASETS, MODELS, ConfigError
from common.flags import absolute_path, flag, name_list, nonempty
from common.levers import Levers
from harness.errors import UsageError
from harness.nodes.nodes import NodeRequest
from harness.planning.presets import PRESETS

DEFAULT_TIMEOUT = 3600.0
DEVICE_CHOICES = ("auto", "gpu", "cpu")


def backends_help() -> str:
    return f"{manifest.choices()}, or a comma list (default: all)"


@dataclass(frozen=True)
class WhatRuns:
    """The backends and strategies asked for, their options, the interpreters to use, and --best."""

    backend: str = field(default="all", metadata=flag(backends_help, type=name_list))
    strategy: str | None = field(
        default=None,
        metadata=flag(
            "comma list (e.g. ddp,fsdp; `list` names every backend's). Default: every strategy that runs on "
            "this hardware, but the variants (fsdp), which run when named",
            type=name_list,
        ),
    )
    option: list[str] = field(
        default_factory=list,
        metadata=flag(
            "a backend-specific option declared in its backend.toml (see `list`), e.g. kvstore=local; "
            "several values run one variant each, e.g. hybridize=on,off",
            action="append",
            type=nonempty,
            metavar="NAME=VALUE[,VALUE]",
        ),
    )
    python: list[str] = field(
        default_factory=list,
        metadata=flag(
            "run BACKEND with this interpreter (it must have the framework) instead of .venvs/BACKEND/",
            action="append",
            type=nonempty,
            metavar="BACKEND=PATH",
        ),
    )
    best: bool = field(
        default=False,
        metadata=flag(
            "beside each run as asked, the same run in its framework's documented fastest mode for the "
            "device (backend.toml's [best]: torch.compile with CUDA graphs and channels-last on a GPU, "
            "MXNet's static hybridize, ...); one row where the best is the default (JAX). It chooses "
            "--compile, --compile-mode and --channels-last; the other flags apply to both rows",
            action="store_true",
        ),
    )


@dataclass(frozen=True)
class DevicesRequest:
    """The device kind and the device counts (None: the default for the kind and the nodes)."""

    device: str = field(
        default="auto",
        metadata=flag(
            "auto: the GPUs if any are found (nvidia-smi, else the driver's /proc files), else "
            "simulated CPU devices; cpu: simulated even where GPUs exist; gpu: refuse to run without one",
            choices=DEVICE_CHOICES,
        ),
    )
    gpus: str | None = field(
        default=None,
        metadata=flag(
            "data-parallel devices: a count (2) or a sweep (1,2,4). Default: Slurm's GPUs per node "
            "(SLURM_GPUS_ON_NODE) where it gives them, else 1,2 (1 with a single GPU). Without GPUs these are "
            "simulated CPU devices",
            type=name_list,
        ),
    )


@dataclass(frozen=True)
class RecipeRequest:
    """The training recipe: the preset and the values that override its own (None: the preset's)."""

    preset: str = field(
        default="auto",
        metadata=flag(
            "d2l: 10 epochs, full data, batch 256 and lr 0.1 per device; quick: 2 epochs on "
            "2,048/1,000 images, batch 32 and lr 0.05 per device. auto: d2l on GPUs, quick on CPU. "
            "resnet50: ResNet-50 on 5,120/1,000 synthetic 224x224 images, 1 epoch, batch 256 and lr 0.1 "
            "per device, bf16 (a GPU's throughput); resnet50-quick: a few steps of ResNet-50 on 32x32 "
            "synthetic images, batch 4 per device (CPU). d2l-target: d2l stopped at 0.91 test accuracy; "
            "lenet-target: LeNet on all of Fashion-MNIST to its target on a CPU (docs/time-to-accuracy.md)",
            choices=("auto", *PRESETS),
        ),
    )
    model: str | None = field(
        default=None,
        metadata=flag("network (default: the preset's, resnet18)", choices=MODELS),
    )
    epochs: int | None = field(
        default=None,
        metadata=flag(
            "epochs (default: the preset's); with --target-accuracy, the most epochs a run may take",
            type=int,
        ),
    )
    batch_size: int | None = field(
        default=None,
        metadata=flag(
            "global batch, split evenly across the devices (default: the preset's per-device batch x devices)",
            type=int,
        ),
    )
    lr: float | None = field(
        default=None,
        metadata=flag(
            "SGD learning rate (default: the preset's per-device lr x devices)", type=float
        ),
    )
    init: str | None = field(
        default=None,
        metadata=flag(
            "initial weights: d2l (kernels ~ N(0, 0.01), the seeds' recipe) or he (the same draws "
            "rescaled to He's std sqrt(2 / fan_in)). Default: the preset's (he for lenet-target, whose "
            "ReLU LeNet does not learn from d2l's small kernels; d2l otherwise)",
            choices=weightslib.INITS,
        ),
    )
    seed: int = field(
        default=0,
        metadata=flag("seed of the initial weights and of the batch order", type=int),
    )
    bn: str = field(
        default="local",
        metadata=flag(
            "BatchNorm across devices: local (each device its shard's statistics, as d2l) or sync "
            "(statistics over the global batch: k-device training is 1-device training)",
            choices=BN_MODES,
        ),
    )
    timed_steps: int | None = field(
        default=None,
        metadata=flag(
            "steps timed one by one after training, for the step-time median and spread "
            "(default: the preset's; 0 skips them and the allreduce figure)",
            type=int,
        ),
    )
    target_accuracy: float | None = field(
        default=None,
        metadata=flag(
            "stop each run after the first epoch whose test accuracy reaches A (0 < A <= 1; evaluated after "
            "every epoch, outside the timed loop), and report its time to target: the timed seconds of its "
            "epochs up to there, and the epoch (docs/time-to-accuracy.md). Default: the preset's, else none",
            type=float,
            metavar="A",
        ),
    )


@dataclass(frozen=True)
class DataRequest:
    """The data part of a request: the dataset, its folder, the image side and the subset sizes asked for (None:
    the dataset's, the preset's or the model's)."""

    dataset: str | None = field(
        default=None,
        metadata=flag(
            "fashion-mnist (lenet, resnet18); imagenet: an ImageNet-layout folder (--data-dir) "
            "(resnet50); synthetic and imagenet-synthetic: random images of either shape for speed "
            "runs, labelled as such in the report. Default: the preset's, else the model's "
            "(imagenet-synthetic for resnet50 without --data-dir)",
            choices=DATASETS,
        ),
    )
    data_dir: str | None = field(
        default=None,
        metadata=flag(
            "directory with the four Fashion-MNIST IDX files (.gz or not; or torchvision's download "
            "root, ROOT/FashionMNIST/raw/), or with --dataset imagenet a folder DIR/train/<class>/*.JPEG "
            "and DIR/val/<class>/*.JPEG",
            type=absolute_path,
        ),
    )
    image_size: int | None = field(
        default=None,
        metadata=flag(
            "side of ImageNet-shaped images, resized and centre-cropped once before the runs "
            "(default: the preset's, else 224; resnet50 takes 32 and more)",
            type=int,
            metavar="PX",
        ),
    )
    train_size: int | None = field(
        default=None,
        metadata=flag("train on the first N training images (default: the preset's)", type=int),
    )
    test_size: int | None = field(
        default=None,
        metadata=flag("evaluate on the first N test images (default: the preset's)", type=int),
    )


@dataclass(frozen=True)
class EachRun:
    """What every run does beside training: its trials, threads, timeout, profile, weights, the check and the
    compile cache folder."""

    repeat: int = field(
        default=1,
        metadata=flag(
            "train each configuration K times, each in a fresh process, trials interleaved; the report "
            "gives the median and range over the trials kept (default 1). `compare` tests the "
            "step-time samples of every trial",
            type=int,
            metavar="K",
        ),
    )
    threads: int | None = field(
        default=None,
        metadata=flag(
            f"CPU threads per worker process, 1 to {configlib.MAX_THREADS} "
            "(default: the cores shared among the processes)",
            type=int,
        ),
    )
    timeout: float = field(
        default=DEFAULT_TIMEOUT,
        metadata=flag(
            "seconds before a run is killed (and the longest wait for a node to join)", type=float
        ),
    )
    profile: int = field(
        default=0,
        metadata=flag(
            "record N more steps of every run with its framework's profiler, after everything timed (no "
            "timed figure changes): a trace per run and rank in the report's traces/, and a table of where a "
            "step's time goes (docs/profiling.md). Default 0: none",
            type=int,
            metavar="N",
        ),
    )
    profile_epoch: bool = field(
        default=False,
        metadata=flag(
            "record the --profile steps as an epoch runs them, not each between two barriers: one barrier "
            "before the first and one after the last, each batch put ahead of its step, so the trace shows "
            "the input path and any wait between steps (docs/profiling.md)",
            action="store_true",
        ),
    )
    load_weights: str | None = field(
        default=None,
        metadata=flag(
            "start from these canonical weights (a file written by --save-weights, any backend); "
            "with --epochs 0 they are only evaluated",
            type=absolute_path,
            metavar="PATH",
        ),
    )
    save_weights: str | None = field(
        default=None,
        metadata=flag(
            "write the trained weights, canonical, to PATH "
            "(a run of one backend, strategy and device count)",
            type=absolute_path,
            metavar="PATH",
        ),
    )
    check: bool = field(
        default=True,
        metadata=flag(
            "run a small equivalence check (`python -m harness check`: 5 steps on a few images) over "
            "this report's backends, strategies and devices first, and put its table in the report",
            action=argparse.BooleanOptionalAction,
        ),
    )
    compile_cache: str | None = field(
        default=None,
        metadata=flag(
            "keep every framework's compile cache (TorchInductor's and Triton's, JAX's) in DIR, shared by "
            "every run and trial, and by later commands given the same DIR: warm-ups are then warm. "
            "Default: each run starts cold, its caches in a fresh folder of its own",
            type=absolute_path,
            metavar="DIR",
        ),
    )


@dataclass(frozen=True)
class OutputRequest:
    """What is written and said: the report's folder, the console, --json's line, --dry-run."""

    out: str = field(
        default="reports",
        metadata=flag("reports are written to OUT/<run-id>/", type=absolute_path),
    )
    quiet: bool = field(
        default=False,
        metadata=flag("no progress bar, only a line per finished run", action="store_true"),
    )
    json: bool = field(
        default=False,
        metadata=flag(
            "end with one line of JSON on the standard output (the report's folder and each configuration's "
            "figures) instead of the report's folder alone; progress and diagnostics are on the standard "
            "error",
            action="store_true",
        ),
    )
    dry_run: bool = field(
        default=False,
        metadata=flag(
            "print every planned run and every refusal with its reason, and exit 0: nothing is trained, no "
            "environment is built",
            action="store_true",
        ),
    )


@dataclass(frozen=True)
class RunRequest:
    """Every flag of `python -m harness run` (harness/arguments.py's run_parents say what each means), by its name
    there, in the groups the plan and the config take whole."""

    runs: WhatRuns
    devices: DevicesRequest
    nodes: NodeRequest
    recipe: RecipeRequest
    data: DataRequest
    levers: Levers
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

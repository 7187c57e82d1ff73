"""The command line's vocabulary: argument types, the one-line-error parser, and the flag groups that
the subcommands share (as argparse parent parsers), so that a flag is declared once.

Each group is made by a function, a fresh parser per call: a subcommand that needs another default
(`check` compares 1,2 devices by default, `run` chooses from the hardware) says so in the call.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing

from common import config as configlib
from common import manifest
from common import weights as weightslib
from common.config import BN_MODES, DATASETS, MODELS
from common.levers import COMPILE_MODES, PRECISIONS
from common.nodes import NodeSpec
from harness.errors import UsageError
from harness.planning.presets import PRESETS

DEFAULT_TIMEOUT = 3600.0
# across hosts: a host may be minutes late (building its environments on first use)
DEFAULT_JOIN_TIMEOUT = 300.0


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


# ------------------------------------------------------------------ shared flag groups (parent parsers)


def _group() -> Parser:
    return Parser(add_help=False)


def backends_flags(help: str = "") -> Parser:
    p = _group()
    p.add_argument(
        "--backend",
        type=name_list,
        default="all",
        help=help or f"{manifest.choices()}, or a comma list (default: all)",
    )
    return p


def python_flags(
    help: str = "run BACKEND with this interpreter (it must have the framework) "
    "instead of .venvs/BACKEND/",
) -> Parser:
    p = _group()
    p.add_argument(
        "--python", action="append", type=nonempty, default=[], metavar="BACKEND=PATH", help=help
    )
    return p


def devices_flags(gpus_default: str | None, gpus_help: str) -> Parser:
    """--gpus, --device, --strategy: which devices and strategies run."""
    p = _group()
    p.add_argument("--gpus", type=name_list, default=gpus_default, help=gpus_help)
    p.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="auto: the GPUs if any are found (nvidia-smi, else the driver's /proc files), else "
        "simulated CPU devices; cpu: simulated even where GPUs exist; gpu: refuse to run without one",
    )
    p.add_argument(
        "--strategy",
        type=name_list,
        default=None,
        help="comma list (torch: scratch, dp, ddp). Default: every strategy that runs on this hardware",
    )
    return p


def data_flags() -> Parser:
    p = _group()
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default=None,
        help="fashion-mnist (lenet, resnet18); imagenet: an ImageNet-layout folder (--data-dir) "
        "(resnet50); synthetic and imagenet-synthetic: random images of either shape for speed "
        "runs, labelled as such in the report. Default: the preset's, else the model's "
        "(imagenet-synthetic for resnet50 without --data-dir)",
    )
    p.add_argument(
        "--data-dir",
        type=absolute_path,
        default=None,
        help="directory with the four Fashion-MNIST IDX files (.gz or not; or torchvision's download "
        "root, ROOT/FashionMNIST/raw/), or with --dataset imagenet a folder DIR/train/<class>/*.JPEG "
        "and DIR/val/<class>/*.JPEG",
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
        metavar="PX",
        help="side of ImageNet-shaped images, resized and centre-cropped once before the runs "
        "(default: the preset's, else 224; resnet50 takes 32 and more)",
    )
    return p


def training_flags(
    lr_default: float | None,
    lr_help: str,
    batch_default: int | None,
    batch_help: str,
    init_help: str,
    init_default: str | None = "d2l",
) -> Parser:
    """--batch-size, --lr, --seed, --init: what one SGD step starts from and does."""
    p = _group()
    p.add_argument("--batch-size", type=int, default=batch_default, help=batch_help)
    p.add_argument("--lr", type=float, default=lr_default, help=lr_help)
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the initial weights and of the batch order"
    )
    p.add_argument("--init", choices=weightslib.INITS, default=init_default, help=init_help)
    return p


def nodes_flags(hosts: bool = True) -> Parser:
    """--nodes (and, for runs across hosts, --node-rank and --coordinator): harness/nodes/nodes.py."""
    p = _group()
    p.add_argument(
        "--nodes",
        "--nnodes",
        type=name_list,
        default=None,
        metavar="M",
        help="nodes (hosts) x --gpus devices each: a count (2) or a sweep (1,2). Without --node-rank "
        "all nodes run on this host as process groups over 127.0.0.1 (simulated). Default: 1, "
        "or the launcher's: Slurm's task count under srun (one task per node), WORLD_SIZE where torchrun's "
        "or Kubernetes' variables are set (docs/nodes.md)",
    )
    if hosts:
        p.add_argument(
            "--node-rank",
            "--node_rank",
            type=int,
            default=None,
            metavar="R",
            help="this host's node (0..M-1) of a run across hosts: run the same command on every host",
        )
        p.add_argument(
            "--coordinator",
            type=nonempty,
            default=None,
            metavar="HOST:PORT",
            help="with --node-rank: where node 0 listens (its engine's rendezvous), reachable from every "
            "host; under Slurm: the first host of the job, port 29500; under torchrun's or Kubernetes' "
            "variables: MASTER_ADDR:MASTER_PORT",
        )
        p.add_argument(
            "--master-addr",
            "--master_addr",
            type=nonempty,
            default=None,
            metavar="HOST",
            help="torchrun's spelling: --coordinator HOST:PORT with --master-port PORT (default 29500)",
        )
        p.add_argument(
            "--master-port",
            "--master_port",
            type=int,
            default=None,
            metavar="PORT",
            help="torchrun's spelling, with --master-addr",
        )
        p.add_argument(
            "--join-timeout",
            type=float,
            default=DEFAULT_JOIN_TIMEOUT,
            metavar="S",
            help="across hosts: how long the nodes wait for each other before each run, after which "
            "the run fails naming the node that did not come (default: %(default)g)",
        )
        p.add_argument(
            "--peer-timeout",
            type=float,
            default=NodeSpec.peer_timeout,
            metavar="S",
            help="across hosts: how long a node may go unheard mid-run (the harnesses exchange heartbeats) "
            "before every other host stops its workers and fails the run naming it; the engines' own "
            "timeouts are set from it (default: %(default)g)",
        )
        p.add_argument(
            "--interface",
            type=nonempty,
            default=None,
            metavar="NAME",
            help="across hosts: the network interface this host's engines use (gloo, NCCL, ps-lite). "
            "Default: the one holding the address the other nodes reach this host at",
        )
        p.add_argument(
            "--local-addr",
            type=nonempty,
            default=None,
            metavar="ADDR",
            help="across hosts: this host's address for the engines, instead of the one found",
        )
    return p


def timeout_flags(default: float, help: str) -> Parser:
    p = _group()
    p.add_argument("--timeout", type=float, default=default, help=help)
    return p


def threads_flags() -> Parser:
    p = _group()
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"CPU threads per worker process, 1 to {configlib.MAX_THREADS} "
        "(default: the cores shared among the processes)",
    )
    return p


# ------------------------------------------------------------------------------ the run's flags

RUN_DESCRIPTION = (
    "Train the same ResNet-18 (or LeNet) on the same Fashion-MNIST batches, or torchvision's "
    "ResNet-50 on the same ImageNet-shaped images, with synchronous data parallelism in PyTorch, JAX, "
    "MXNet/Gluon and Keras 3, time every run with one rule, and write a Markdown report under "
    "reports/."
)


def run_parents() -> list[Parser]:
    """The flag groups of `run` (and of the bare `python -m harness`, which is `run`)."""
    return [
        backends_flags(),
        devices_flags(
            None,
            "data-parallel devices: a count (2) or a sweep (1,2,4). Default: Slurm's GPUs per node "
            "(SLURM_GPUS_ON_NODE) where it gives them, else 1,2 (1 with a single GPU). Without GPUs these are "
            "simulated CPU devices",
        ),
        training_flags(
            None,
            "SGD learning rate (default: the preset's per-device lr x devices)",
            None,
            "global batch, split evenly across the devices "
            "(default: the preset's per-device batch x devices)",
            "initial weights: d2l (kernels ~ N(0, 0.01), the seeds' recipe) or he (the same draws "
            "rescaled to He's std sqrt(2 / fan_in)). Default: the preset's (he for lenet-target, whose "
            "ReLU LeNet does not learn from d2l's small kernels; d2l otherwise)",
            init_default=None,
        ),
        data_flags(),
        nodes_flags(),
        python_flags(),
        timeout_flags(
            DEFAULT_TIMEOUT,
            "seconds before a run is killed (and the longest wait for a node to join)",
        ),
        threads_flags(),
        run_flags(),
    ]


def run_flags() -> Parser:
    """The flags only `run` has: the preset and what it overrides, the levers, weights, output."""
    p = _group()
    p.add_argument(
        "--preset",
        choices=("auto", *PRESETS),
        default="auto",
        help="d2l: 10 epochs, full data, batch 256 and lr 0.1 per device; quick: 2 epochs on "
        "2,048/1,000 images, batch 32 and lr 0.05 per device. auto: d2l on GPUs, quick on CPU. "
        "resnet50: ResNet-50 on 5,120/1,000 synthetic 224x224 images, 1 epoch, batch 256 and lr 0.1 "
        "per device, bf16 (a GPU's throughput); resnet50-quick: a few steps of ResNet-50 on 32x32 "
        "synthetic images, batch 4 per device (CPU). d2l-target: d2l stopped at 0.91 test accuracy; "
        "lenet-target: LeNet on all of Fashion-MNIST to its target on a CPU (docs/time-to-accuracy.md)",
    )
    p.add_argument(
        "--model", choices=MODELS, default=None, help="network (default: the preset's, resnet18)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs (default: the preset's); with --target-accuracy, the most epochs a run may take",
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=None,
        metavar="A",
        help="stop each run after the first epoch whose test accuracy reaches A (0 < A <= 1; evaluated after "
        "every epoch, outside the timed loop), and report its time to target: the timed seconds of its epochs "
        "up to there, and the epoch (docs/time-to-accuracy.md). Default: the preset's, else none",
    )
    p.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="train on the first N training images (default: the preset's)",
    )
    p.add_argument(
        "--test-size",
        type=int,
        default=None,
        help="evaluate on the first N test images (default: the preset's)",
    )
    p.add_argument(
        "--out", type=absolute_path, default="reports", help="reports are written to OUT/<run-id>/"
    )
    p.add_argument(
        "--bn",
        choices=BN_MODES,
        default="local",
        help="BatchNorm across devices: local (each device its shard's statistics, as d2l) or sync "
        "(statistics over the global batch: k-device training is 1-device training)",
    )
    p.add_argument(
        "--load-weights",
        type=absolute_path,
        default=None,
        metavar="PATH",
        help="start from these canonical weights (a file written by --save-weights, any backend); "
        "with --epochs 0 they are only evaluated",
    )
    p.add_argument(
        "--save-weights",
        type=absolute_path,
        default=None,
        metavar="PATH",
        help="write the trained weights, canonical, to PATH "
        "(a run of one backend, strategy and device count)",
    )
    p.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a small equivalence check (`python -m harness check`: 5 steps on a few images) over "
        "this report's backends, strategies and devices first, and put its table in the report",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="fp32 (TF32 off, set explicitly), tf32 (TF32 matmuls and convolutions; NVIDIA GPUs) or bf16 "
        "(bfloat16 compute, float32 weights and SGD); backends without it are reported as refused. "
        "Default: the preset's (bf16 for resnet50, else fp32)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile for torch (and Keras's ddp), hybridize for MXNet; JAX steps (and Keras's "
        "distribution) are always jit-compiled",
    )
    p.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default=None,
        help="with --compile, torch only: torch.compile's mode (not given: default; reduce-overhead: CUDA "
        "graphs, GPU only; max-autotune: autotuned kernels, long compiles)",
    )
    p.add_argument(
        "--channels-last",
        action="store_true",
        help="NHWC: torch's memory format for model and batches (Keras's models are NHWC, its own default, "
        "with or without it)",
    )
    p.add_argument(
        "--resident-data",
        action="store_true",
        help="copy each epoch's batches to the devices before its timer starts (no host-to-device "
        "copy inside the timed steps)",
    )
    p.add_argument(
        "--best",
        action="store_true",
        help="beside each run as asked, the same run in its framework's documented fastest mode for the "
        "device (backend.toml's [best]: torch.compile with CUDA graphs and channels-last on a GPU, "
        "MXNet's static hybridize, ...); one row where the best is the default (JAX). It chooses "
        "--compile, --compile-mode and --channels-last; the other flags apply to both rows",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=2,
        metavar="N",
        help="put each batch on the devices N batches ahead of its step (pinned host memory and a copy "
        "stream on CUDA), so copies overlap compute; 0: each step copies its own batch",
    )
    p.add_argument(
        "--compile-cache",
        type=absolute_path,
        default=None,
        metavar="DIR",
        help="keep every framework's compile cache (TorchInductor's and Triton's, JAX's) in DIR, shared by "
        "every run and trial, and by later commands given the same DIR: warm-ups are then warm. Default: "
        "each run starts cold, its caches in a fresh folder of its own",
    )
    p.add_argument(
        "--timed-steps",
        type=int,
        default=None,
        help="steps timed one by one after training, for the step-time median and spread "
        "(default: the preset's; 0 skips them and the allreduce figure)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="record N more steps of every run with its framework's profiler, after everything timed (no "
        "timed figure changes): a trace per run and rank in the report's traces/, and a table of where a "
        "step's time goes (docs/profiling.md). Default 0: none",
    )
    p.add_argument(
        "--profile-epoch",
        action="store_true",
        help="record the --profile steps as an epoch runs them, not each between two barriers: one barrier "
        "before the first and one after the last, each batch put ahead of its step, so the trace shows the "
        "input path and any wait between steps (docs/profiling.md)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="train each configuration K times, each in a fresh process, trials interleaved; the report "
        "gives the median and range over the trials kept (default 1). `compare` tests the "
        "step-time samples of every trial",
    )
    p.add_argument(
        "--option",
        action="append",
        type=nonempty,
        default=[],
        metavar="NAME=VALUE[,VALUE]",
        help="a backend-specific option declared in its backend.toml (see `list`), e.g. kvstore=local; "
        "several values run one variant each, e.g. hybridize=on,off",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="show the backends, strategies and devices, then exit (the same as the `list` subcommand)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar, only a line per finished run"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print every planned run and every refusal with its reason, and exit 0: nothing is trained, no "
        "environment is built",
    )
    p.add_argument(
        "--resume",
        type=absolute_path,
        metavar="REPORT_DIR",
        help="take up a report again: its own command is planned again, every run that finished there is kept, "
        "and only the others run (give no other flag); the new report says which report it resumed",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="end with one line of JSON on the standard output (the report's folder and each configuration's "
        "figures) instead of the report's folder alone; progress and diagnostics are on the standard error",
    )
    return p


def list_parents() -> list[Parser]:
    """`list`: which devices would run (--device), and what every backend declares."""
    p = _group()
    p.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="auto: the GPUs if any are found, else simulated CPU devices; cpu: simulated; "
        "gpu: refuse to list without one",
    )
    return [p]

"""The GPU reference, in the order that buys the most certainty per minute of GPU time, in pieces that each fit a
ten-minute slot on a host without network:

 1. torch-best      torch as written and at its best (--best: torch.compile with CUDA graphs, channels-last) on
                    the d2l recipe in bf16, batches resident on the device, scratch and ddp, 4 epochs, profiled,
                    torch's own log of the graphs it captured in each worker's log
 2. jax-resident    JAX beside it on the same card: pmap and sharding with resident batches, 4 epochs, profiled
 3. torch-graphs    CUDA graphs alone (compile reduce-overhead), torch scratch, 2 epochs
 4-5. resnet50-torch-*  torchvision's ResNet-50 throughput preset in torch, channels-last, then compiled too
 6. keras           Keras ddp and distribution on the d2l recipe in bf16, 2 epochs (Keras's wheels are carried)
 7. resnet50-jax-resident  JAX sharding's ResNet-50 with resident batches
 8-10. torch-*      each other torch lever alone (compile, resident data, channels-last), 2 epochs
 11. parity         each strategy beside its framework's own loop
 12-13. gpu-tests   the tests that skip without a GPU: torch's CUDA tests and jax's GPU tests
 14. check          `harness check --gpus 1 --model resnet18`, torch and jax
 15-16. d2l-*       the d2l recipe (ResNet-18, 10 epochs, all 60,000/10,000 images, batch 256, lr 0.1) in bf16,
                    then fp32: torch scratch and ddp, jax pmap and sharding, one GPU
 17. profile        the bf16 runs again, 2 epochs, profiled
 18. resnet50       ResNet-50, torch and jax as they are, profiled
 19. d2l-target     time to 0.91 test accuracy in bf16, 3 trials each on their own batch orders
 20-21.             the whole torch and jax suites (`harness test`)

    python3 benchmarks/gpu_reference.py prepare              # where there is network: .data/ and .whl/ to carry
    python3 benchmarks/gpu_reference.py prepare --tests      # ... with the test tools' wheels (pieces 20-21)
    python3 benchmarks/gpu_reference.py list                 # the pieces, their minutes and commands
    python3 benchmarks/gpu_reference.py run --budget 8       # on the GPU host: the first pieces that fit 8 minutes
    python3 benchmarks/gpu_reference.py run --piece 4        # one piece
    python3 benchmarks/gpu_reference.py run --piece 10,7     # these pieces, in this order
    python3 benchmarks/gpu_reference.py run --smoke          # the training pieces on the CPU, cut to a few steps

--budget picks pieces in order while their estimated minutes fit, and is also a deadline: a piece still running
when the budget is spent is stopped with SIGTERM, so that its harness writes the runs that finished into its
report before the slot ends (a command killed from outside would leave nothing). The estimates are minutes on one
H200, measured where the table says so.

`prepare` copies the four Fashion-MNIST files into .data/fashion-mnist/ and downloads, into .whl/, the wheels of
Keras and the two of its dependencies a GPU host may lack (namex, optree), and with --tests those of the harness's
test tools (ruff, import-linter, mlperf-logging, jsonschema), for Python 3.12 on x86-64: the GPU host has numpy,
matplotlib, tqdm, pillow, pytest, torch, jax, flax, optax, pandas and scipy. Both folders are ignored by git and
travel with the working tree (the test tools' wheels are left out by default: with the data and the committed
reports they would pass the size a working tree may have). `run` installs the carried wheels into the interpreter
if it lacks them, then runs each piece with that interpreter for torch, JAX and Keras (--python); the reports land
in reports/ as usual.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data" / "fashion-mnist"
WHEELS = ROOT / ".whl"
FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
# pip name: module name. mlperf-logging comes without its dependencies (pandas, scipy, pyyaml), which the GPU host
# has and which would not fit the carried tree.
TEST_TOOLS = {
    "ruff": "ruff",
    "import-linter": "importlinter",
    "mlperf-logging": "mlperf_logging",
    "jsonschema": "jsonschema",
}
WITHOUT_DEPENDENCIES = ("mlperf-logging",)
# Keras has never been on the GPU host: it and the two of its dependencies the host lacks travel as wheels (pure
# Python but optree), installed without dependencies (numpy, absl-py, rich, h5py, ml-dtypes are there).
KERAS = {"keras": "keras", "namex": "namex", "optree": "optree"}
PLATFORMS = [
    arg
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
]  # pip matches each tag exactly: the host's and the older ones it runs
TRAIN = ["--gpus", "1", "--preset", "d2l"]
BOTH = ["--backend", "torch,jax", "--strategy", "scratch,ddp,pmap,sharding"]
# The pieces after the check ran it already (piece 3): their minutes go to training and its traces.
PROFILED = ["--profile", "5", "--no-check"]
D2L_BF16 = [*TRAIN, "--precision", "bf16"]
# CUDA graphs: what XLA does with every step, and what --best switches on for torch on a GPU with channels-last
GRAPHS = ["--compile", "--compile-mode", "reduce-overhead"]
TORCH_SCRATCH = ["--backend", "torch", "--strategy", "scratch"]
LEVER_EPOCHS = ["--epochs", "2", "--no-check"]
RESNET50_TORCH = ["--backend", "torch", "--preset", "resnet50", "--gpus", "1"]
PROFILED_3 = [
    "--profile",
    "3",
    "--no-check",
]  # ResNet-50's steps are long: three profiled are enough
# torch's own words on its CUDA graphs (captured, or skipped and why), in each worker's log beside the report
TORCH_GRAPH_LOGS = {"TORCH_LOGS": "cudagraphs,perf_hints"}


@dataclass(frozen=True)
class Piece:
    name: str
    # minutes on one H200, the machine's start not counted: the earlier pieces measured (the first four took 71 s,
    # 21 s, over 120 s and 237 s; a profiled 2-epoch d2l run about 22 s), the compiled ones estimated with margin
    minutes: float
    args: list[
        str
    ]  # harness arguments; for a "pytest" piece: the backend and pytest's -k selection
    env: dict | None = None  # added to the piece's environment


# In the order of what the next GPU hour must buy: each framework at its best (torch with CUDA graphs, beside JAX
# on the same card), what each torch lever gives alone, ResNet-50 at its best, Keras's first GPU run; then the
# reference pieces that earlier leases ran (correctness, the d2l recipe, the rest).
PIECES = [
    Piece(
        "torch-best",
        2.5,
        [
            "--backend",
            "torch",
            "--strategy",
            "scratch,ddp",
            *D2L_BF16,
            "--best",
            "--resident-data",
            "--epochs",
            "4",
            *PROFILED,
        ],
        TORCH_GRAPH_LOGS,
    ),
    Piece(
        "jax-resident",
        1.0,
        ["--backend", "jax", *D2L_BF16, "--resident-data", "--epochs", "4", *PROFILED],
    ),
    Piece(
        "torch-graphs", 0.8, [*TORCH_SCRATCH, *D2L_BF16, *GRAPHS, *LEVER_EPOCHS], TORCH_GRAPH_LOGS
    ),
    Piece("resnet50-torch-channels-last", 1.0, [*RESNET50_TORCH, "--channels-last", *PROFILED_3]),
    Piece(
        "resnet50-torch-compile",
        1.5,
        [*RESNET50_TORCH, "--channels-last", "--compile", *PROFILED_3],
    ),
    Piece("keras", 2.0, ["--backend", "keras", *D2L_BF16, *LEVER_EPOCHS]),
    Piece(
        "resnet50-jax-resident",
        1.2,
        [
            "--backend",
            "jax",
            "--strategy",
            "sharding",
            "--preset",
            "resnet50",
            "--gpus",
            "1",
            "--resident-data",
            "--no-check",
        ],
    ),
    Piece("torch-compile", 0.6, [*TORCH_SCRATCH, *D2L_BF16, "--compile", *LEVER_EPOCHS]),
    Piece("torch-resident", 0.4, [*TORCH_SCRATCH, *D2L_BF16, "--resident-data", *LEVER_EPOCHS]),
    Piece(
        "torch-channels-last", 0.4, [*TORCH_SCRATCH, *D2L_BF16, "--channels-last", *LEVER_EPOCHS]
    ),
    Piece("parity", 10.0, ["parity", "--backend", "torch,jax", "--gpus", "1"]),
    Piece("gpu-tests-torch", 1.5, ["pytest", "torch", "cuda"]),
    Piece("gpu-tests-jax", 0.5, ["pytest", "jax", "gpu"]),
    Piece("check", 3.0, ["check", "--backend", "torch,jax", "--gpus", "1", "--model", "resnet18"]),
    Piece("d2l-bf16", 4.5, [*BOTH, *TRAIN, "--precision", "bf16"]),
    Piece("d2l-fp32", 6.0, [*BOTH, *TRAIN, "--precision", "fp32"]),
    Piece("profile", 2.0, [*BOTH, *TRAIN, "--precision", "bf16", "--epochs", "2", *PROFILED]),
    Piece(
        "resnet50",
        3.0,
        ["--backend", "torch,jax", "--preset", "resnet50", "--gpus", "1", *PROFILED],
    ),
    Piece(
        "d2l-target",
        5.0,
        [
            *BOTH,
            "--gpus",
            "1",
            "--preset",
            "d2l-target",
            "--precision",
            "bf16",
            "--repeat",
            "3",
            "--no-check",
        ],
    ),
    Piece("test-torch", 10.0, ["test", "--backend", "torch"]),
    Piece("test-jax", 10.0, ["test", "--backend", "jax"]),
]
# --smoke: the training pieces on the CPU with the d2l preset cut to a few steps
SMOKE = [
    "--device",
    "cpu",
    "--epochs",
    "1",
    "--train-size",
    "512",
    "--test-size",
    "256",
    "--timed-steps",
    "2",
]
# parity: each strategy beside its framework's own loop, 4 trials of each side at batch 256 (10 minutes)
PARITY_GPU = ["--device", "gpu", "--repeat", "4"]
PARITY_SMOKE = ["--device", "cpu", "--batch-size", "8", "--repeat", "2", "--timed-steps", "3"]


def command(args: list[str], python: str | None, smoke: bool) -> list[str]:
    """The command of a piece, with the host's interpreter for torch and JAX (None: the backends' own
    environments, for a smoke run) and the carried data."""
    sub = args[0] if args[0] in ("check", "parity", "test", "pytest") else None
    if sub == "pytest":  # one backend's GPU-only tests, in the interpreter that has its framework
        backend, selection = args[1], args[2]
        test_file = str(ROOT / "tests" / "backends" / f"test_{backend}.py")
        return [python or sys.executable, "-m", "pytest", "-q", "-rs", test_file, "-k", selection]
    if smoke:  # CUDA graphs: there are none on the CPU
        args = without_graphs(args)
    harness = [python or sys.executable, "-m", "harness", *args]
    # (a backend a piece does not run ignores its --python)
    pythons = (
        [a for name in ("torch", "jax", "keras") for a in ("--python", f"{name}={python}")]
        if python
        else []
    )
    if sub == "test":  # the harness's tests, then the backend's on the GPU
        return harness + (["--python", f"{args[2]}={python}"] if python else [])
    data = ["--data-dir", str(DATA)] if DATA.is_dir() else []
    if sub == "check":
        return harness + pythons + data + (["--device", "cpu"] if smoke else [])
    if sub == "parity":
        return harness + pythons + data + (PARITY_SMOKE if smoke else PARITY_GPU)
    return harness + pythons + data + (SMOKE if smoke else ["--device", "gpu"])


def without_graphs(args: list[str]) -> list[str]:
    """The arguments without `--compile-mode reduce-overhead`."""
    k = next((i for i in range(len(args) - 1) if args[i : i + 2] == GRAPHS[1:]), None)
    return args if k is None else args[:k] + args[k + 2 :]


def piece_env(piece: Piece) -> dict:
    """A pytest piece runs inside one backend, as `harness test` would run it (DPBENCH_BACKEND); a piece's own
    variables are added."""
    env = {**os.environ, **(piece.env or {})}
    if piece.args[0] == "pytest":
        env["DPBENCH_BACKEND"] = piece.args[1]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def within_budget(pieces: list[Piece], minutes: float | None) -> list[Piece]:
    """The pieces, in order, while their estimated minutes add up to at most `minutes` (None: all)."""
    if minutes is None:
        return pieces
    chosen, total = [], 0.0
    for piece in pieces:
        if total + piece.minutes > minutes:
            break
        chosen.append(piece)
        total += piece.minutes
    return chosen


def prepare(source: Path, tests: bool) -> int:
    missing = [f for f in FILES if not (source / f).is_file()]
    if missing:
        print(
            f"gpu_reference: error: {source} lacks {', '.join(missing)} (--data-dir)",
            file=sys.stderr,
        )
        return 2
    DATA.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        shutil.copyfile(source / f, DATA / f)
    tools = pinned(ROOT / "harness" / "requirements.txt", TEST_TOOLS) if tests else []
    keras = pinned(ROOT / "backends" / "keras" / "requirements.txt", KERAS)
    keras += [name for name in KERAS if name not in {p.split("==")[0] for p in keras}]
    alone = [p for p in tools if p.split("==")[0] in WITHOUT_DEPENDENCIES] + keras
    download = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--dest",
        str(WHEELS),
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        *PLATFORMS,
    ]
    with_dependencies = [p for p in tools if p not in alone]
    status = subprocess.run(download + with_dependencies).returncode if with_dependencies else 0
    status = status or subprocess.run(download + ["--no-deps", *alone]).returncode
    if status:
        print("gpu_reference: error: pip could not download the wheels to carry", file=sys.stderr)
        return 1
    print(f"Carried: {DATA} and the wheels of {', '.join(tools + keras)} in {WHEELS}")
    return 0


def pinned(requirements: Path, packages: dict[str, str]) -> list[str]:
    """The pins (NAME==VERSION) of `packages` in a requirements file."""
    pins = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    return [p for p in pins if p.split("==")[0] in packages]


def install_carried(python: str | None) -> None:
    """The test tools `harness test` needs and Keras, from .whl/, into this interpreter when it runs the pieces and
    lacks them."""
    if python != sys.executable or not WHEELS.is_dir():
        return
    pip = [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS)]
    tools = carried(lacking(TEST_TOOLS))
    if tools:
        subprocess.run(pip + tools, check=False)
    keras = carried(lacking(KERAS))
    if keras:
        subprocess.run(pip + ["--no-deps", *keras], check=False)


def carried(names: list[str]) -> list[str]:
    """The packages among `names` whose wheel is in .whl/ (a wheel's file name spells '-' as '_')."""
    return [n for n in names if any(WHEELS.glob(f"{n.replace('-', '_')}-*.whl"))]


def lacking(packages: dict[str, str]) -> list[str]:
    """The pip names of the packages whose module this interpreter cannot import."""
    return [name for name, module in packages.items() if importlib.util.find_spec(module) is None]


# After SIGTERM a harness writes the runs that finished into its report, then exits: the time it is given for that.
STOP_GRACE_S = 30


def run(pieces: list[Piece], python: str | None, smoke: bool, deadline: float | None) -> int:
    """Each piece in turn, each stopped with SIGTERM where `deadline` (a time.monotonic() instant) passes."""
    install_carried(python)
    failed, timings = [], []
    for piece in pieces:
        cmd = command(piece.args, python, smoke)
        print(f"\n== piece {piece.name}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        child = subprocess.Popen(cmd, cwd=ROOT, env=piece_env(piece))
        try:
            status = wait_until(child, deadline)
        # Ctrl-C, SIGTERM, SIGHUP: the piece's harness writes what finished, then stops
        except KeyboardInterrupt:
            stop(child)
            print(
                f"\ninterrupted in piece {piece.name}; its report holds the runs that finished",
                file=sys.stderr,
            )
            return 130
        timings.append(f"{piece.name} {time.monotonic() - started:.0f} s")
        if status is None:
            stop(child)
            failed.append(f"{piece.name} (cut off at the budget)")
            break
        if status:
            failed.append(piece.name)
    print(f"\ntime per piece: {', '.join(timings)}")
    failures = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"{len(timings) - len(failed)} of {len(pieces)} pieces ok{failures}")
    return 1 if failed else 0


def wait_until(child: subprocess.Popen, deadline: float | None) -> int | None:
    """The child's exit status, or None if it is still running at `deadline`."""
    try:
        return child.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def stop(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes (got {text!r})")
    return value


def piece_numbers(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be piece numbers, comma-separated (got {text!r})")


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="copy the data and download the wheels to carry")
    p.add_argument(
        "--data-dir", default="/usr/share/datasets/fashion-mnist", help="the Fashion-MNIST files"
    )
    p.add_argument(
        "--tests",
        action="store_true",
        help="also the test tools' wheels (pieces test-torch, test-jax)",
    )
    for name, text in (("list", "print the pieces and their commands"), ("run", "run the pieces")):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--piece",
            type=piece_numbers,
            default=None,
            metavar="K[,K...]",
            help=f"only these pieces (1..{len(PIECES)}), in the order given",
        )
        p.add_argument(
            "--budget",
            type=positive_minutes,
            default=None,
            metavar="MINUTES",
            help="the first pieces whose estimated minutes fit, each stopped (its report kept) once the "
            "budget is spent (default: every piece, no deadline)",
        )
        p.add_argument(
            "--python",
            default=None,
            help="the interpreter with torch and JAX (default: this one; with --smoke, the backends' "
            "own environments)",
        )
        p.add_argument("--smoke", action="store_true", help="on the CPU, cut to a few steps")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        return prepare(Path(args.data_dir), args.tests)
    outside = [k for k in args.piece or () if not 1 <= k <= len(PIECES)]
    if outside:
        print(
            f"gpu_reference: error: --piece must be 1..{len(PIECES)} (got {outside[0]})",
            file=sys.stderr,
        )
        return 2
    pieces = PIECES if args.piece is None else [PIECES[k - 1] for k in args.piece]
    pieces = within_budget(pieces, args.budget)
    if not pieces:
        print(f"gpu_reference: error: no piece fits {args.budget:g} minutes", file=sys.stderr)
        return 2
    python = args.python or (None if args.smoke else sys.executable)
    if args.action == "list":
        for piece in pieces:
            i = PIECES.index(piece) + 1
            print(
                f"{i}. {piece.name} (~{piece.minutes:g} min): {' '.join(command(piece.args, python, args.smoke)[1:])}"
            )
        return 0
    deadline = None if args.budget is None else time.monotonic() + 60 * args.budget
    return run(pieces, python, args.smoke, deadline)


if __name__ == "__main__":
    sys.exit(main())

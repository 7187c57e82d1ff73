"""The GPU reference: the d2l recipe (ResNet-18, 10 epochs, all of Fashion-MNIST, batch 256, lr 0.1) on one GPU,
torch and JAX, fp32 / tf32 / bf16 and the speed levers, then the check, parity and the GPU tests, in pieces of
at most ten minutes each, on a host without network.

    python3 benchmarks/gpu_reference.py prepare            # where there is network: .data/ and .whl/ to carry
    python3 benchmarks/gpu_reference.py list               # the pieces and their commands
    python3 benchmarks/gpu_reference.py run                # on the GPU host: every piece in turn
    python3 benchmarks/gpu_reference.py run --piece 4      # one piece (each fits a ten-minute slot)
    python3 benchmarks/gpu_reference.py run --smoke        # the same pieces on the CPU, cut to a few steps

`prepare` copies the four Fashion-MNIST files into .data/fashion-mnist/ and downloads, into .whl/, the wheels of
the harness's lint tools (ruff, import-linter) for Python 3.12 on x86-64: the GPU host has numpy, matplotlib,
tqdm, pillow, pytest, torch, jax, flax and optax, but not those. Both folders are ignored by git and travel with
the working tree. `run` installs the carried wheels into the interpreter if it lacks them, then runs each piece
with that interpreter for torch and JAX (--python); the reports land in reports/ as usual.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import subprocess
import sys
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
LINT_TOOLS = {"ruff": "ruff", "import-linter": "importlinter"}  # pip name: module name
PLATFORMS = [
    arg
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
]  # pip matches each tag exactly: the host's and the older ones it runs
TRAIN = ["--gpus", "1", "--preset", "d2l"]

# (name, harness arguments). Each piece is one harness command of at most ten minutes on an H100/H200.
PIECES = [
    ("fp32", ["--backend", "torch,jax", *TRAIN, "--precision", "fp32"]),
    ("tf32", ["--backend", "torch,jax", *TRAIN, "--precision", "tf32"]),
    ("bf16", ["--backend", "torch,jax", *TRAIN, "--precision", "bf16"]),
    (
        "bf16-torch-levers",
        [
            "--backend",
            "torch",
            *TRAIN,
            "--precision",
            "bf16",
            "--compile",
            "--channels-last",
            "--resident-data",
        ],
    ),
    ("bf16-jax-levers", ["--backend", "jax", *TRAIN, "--precision", "bf16", "--resident-data"]),
    ("check", ["check", "--backend", "torch,jax", "--gpus", "1"]),
    ("parity", ["parity", "--backend", "torch,jax", "--gpus", "1"]),
    ("test-torch", ["test", "--backend", "torch"]),
    ("test-jax", ["test", "--backend", "jax"]),
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
    """The harness command of a piece, with the host's interpreter for torch and JAX (None: the backends' own
    environments, for a smoke run) and the carried data."""
    sub = args[0] if args[0] in ("check", "parity", "test") else None
    harness = [python or sys.executable, "-m", "harness", *args]
    # (a backend a piece does not run ignores its --python)
    pythons = ["--python", f"torch={python}", "--python", f"jax={python}"] if python else []
    if sub == "test":  # the harness's tests, then the backend's on the GPU
        return harness + (["--python", f"{args[2]}={python}"] if python else [])
    data = ["--data-dir", str(DATA)] if DATA.is_dir() else []
    if sub == "check":
        return harness + pythons + (["--device", "cpu"] if smoke else [])
    if sub == "parity":
        return harness + pythons + data + (PARITY_SMOKE if smoke else PARITY_GPU)
    return harness + pythons + data + (SMOKE if smoke else ["--device", "gpu"])


def prepare(source: Path) -> int:
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
    pins = [
        line.split("#")[0].strip()
        for line in (ROOT / "harness" / "requirements.txt").read_text().splitlines()
    ]
    tools = [p for p in pins if p.split("==")[0] in LINT_TOOLS]
    status = subprocess.run(
        [
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
            *tools,
        ]
    ).returncode
    if status:
        print(
            "gpu_reference: error: pip could not download the lint tools' wheels", file=sys.stderr
        )
        return 1
    print(f"Carried: {DATA} and the wheels of {', '.join(tools)} in {WHEELS}")
    return 0


def install_carried(python: str | None) -> None:
    """The lint tools `harness test` needs, from .whl/, into this interpreter when it runs the pieces and lacks them."""
    if python != sys.executable or not WHEELS.is_dir():
        return
    lacking = [
        name for name, module in LINT_TOOLS.items() if importlib.util.find_spec(module) is None
    ]
    if lacking:
        subprocess.run(
            [python, "-m", "pip", "install", "--no-index", "--find-links", str(WHEELS), *lacking],
            check=False,
        )


def run(pieces: list[tuple[str, list[str]]], python: str | None, smoke: bool) -> int:
    install_carried(python)
    failed = []
    for name, args in pieces:
        cmd = command(args, python, smoke)
        print(f"\n== piece {name}: {' '.join(cmd[1:])}", flush=True)
        child = subprocess.Popen(cmd, cwd=ROOT)
        try:
            status = child.wait()
        except (
            KeyboardInterrupt
        ):  # Ctrl-C, SIGTERM, SIGHUP: the piece's harness writes what finished, then stops
            child.send_signal(signal.SIGTERM)
            child.wait()
            print(
                f"\ninterrupted in piece {name}; its report holds the runs that finished",
                file=sys.stderr,
            )
            return 130
        if status:
            failed.append(name)
    failures = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"\n{len(pieces) - len(failed)} of {len(pieces)} pieces ok{failures}")
    return 1 if failed else 0


def interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, interrupt)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="copy the data and download the wheels to carry")
    p.add_argument(
        "--data-dir", default="/usr/share/datasets/fashion-mnist", help="the Fashion-MNIST files"
    )
    for name, text in (("list", "print the pieces and their commands"), ("run", "run the pieces")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--piece", type=int, default=None, help=f"only piece K (1..{len(PIECES)})")
        p.add_argument(
            "--python",
            default=None,
            help="the interpreter with torch and JAX (default: this one; with --smoke, the backends' "
            "own environments)",
        )
        p.add_argument("--smoke", action="store_true", help="on the CPU, cut to a few steps")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        return prepare(Path(args.data_dir))
    if args.piece is not None and not 1 <= args.piece <= len(PIECES):
        print(
            f"gpu_reference: error: --piece must be 1..{len(PIECES)} (got {args.piece})",
            file=sys.stderr,
        )
        return 2
    pieces = PIECES if args.piece is None else [PIECES[args.piece - 1]]
    python = args.python or (None if args.smoke else sys.executable)
    if args.action == "list":
        for i, (name, piece) in enumerate(pieces, start=args.piece or 1):
            print(f"{i}. {name}: {' '.join(command(piece, python, args.smoke)[1:])}")
        return 0
    return run(pieces, python, args.smoke)


if __name__ == "__main__":
    sys.exit(main())

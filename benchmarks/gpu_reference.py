"""The GPU reference, in the order that buys the most certainty per minute of GPU time, in pieces that each fit a
ten-minute slot on a host without network:

 1. gpu-tests-torch  torch's CUDA tests first: among them, that the steps of an epoch, fed as it feeds them, never
                    make the host wait for the device nor allocate page-locked memory
 2. torch-fed       torch scratch as written by default (batches pinned before the timer, copied a step ahead) on
                    the d2l recipe in bf16, 2 epochs, profiled as an epoch runs (--profile-epoch: the feeding shows)
 3. torch-resident  the same with resident batches, minutes later on the same card: their ratio is the feeding's cost
 4. keras           Keras ddp and distribution on the d2l recipe in bf16, 2 epochs, profiled (Keras's wheels carried)
 5. parity          each strategy of torch, JAX and Keras beside its framework's own loop, 3 trials a side
 6. d2l-best        the d2l recipe's 10 epochs at each framework's best: torch scratch (--best) and JAX, resident
 7. keras-compile   Keras ddp with --compile, given the time it needs once, torch's graph breaks and recompiles logged
 8. readme          the README's table in one sitting: torch, JAX and Keras as written and at their best, 3 epochs
 9. resnet50-jax-resident  JAX sharding's ResNet-50 with resident batches
 10. torch-best     torch as written and at its best on the d2l recipe in bf16, resident, scratch and ddp, 4 epochs,
                    profiled, torch's own log of the graphs it captured in each worker's log
 11. jax-resident   JAX beside it: pmap and sharding with resident batches, 4 epochs, profiled
 12. torch-graphs   CUDA graphs alone (compile reduce-overhead), torch scratch, 2 epochs
 13-14. resnet50-torch-*  torchvision's ResNet-50 throughput preset in torch, channels-last, then compiled too
 15-16. torch-*     each other torch lever alone (compile, channels-last), 2 epochs
 17. gpu-tests-jax  jax's GPU tests
 18. check          `harness check --gpus 1 --model resnet18`, torch and jax
 19-20. d2l-*       the d2l recipe (ResNet-18, 10 epochs, all 60,000/10,000 images, batch 256, lr 0.1) in bf16,
                    then fp32: torch scratch and ddp, jax pmap and sharding, one GPU
 21. profile        the bf16 runs again, 2 epochs, profiled
 22. resnet50       ResNet-50, torch and jax as they are, profiled
 23. d2l-target     time to 0.91 test accuracy in bf16, 3 trials each on their own batch orders
 24-25.             the whole torch and jax suites (`harness test`)

    python3 benchmarks/gpu_reference.py prepare              # where there is network: .data/ and .whl/ to carry
    python3 benchmarks/gpu_reference.py prepare --tests      # ... with the test tools' wheels (pieces 24-25)
    python3 benchmarks/gpu_reference.py list                 # the pieces, their minutes and commands
    python3 benchmarks/gpu_reference.py run --budget 8       # on the GPU host: the first pieces that fit 8 minutes
    python3 benchmarks/gpu_reference.py run --piece 4        # one piece
    python3 benchmarks/gpu_reference.py run --piece 10,7     # these pieces, in this order
    python3 benchmarks/gpu_reference.py run --smoke          # the training pieces on the CPU, cut to a few steps
    python3 benchmarks/gpu_reference.py run --fresh --piece 4  # piece 4 again from the start, whatever it left

--budget picks, among the pieces not done yet, pieces in order while their estimated minutes fit, and is also a
deadline: a piece still running
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

`run` takes up where the last one stopped, by default: a lease ends at its budget and the next is a fresh machine,
and a forgotten flag would pay again for every run already finished, where a piece to measure again costs only
--fresh. Each piece's state is read first, and `list` shows it:
 - done: skipped, with one line naming the report that holds its runs. A benchmark piece (`run`-type and parity) is
   done when its report in reports/ was written by a harness that ended its session and no run there was
   interrupted (a run that failed is the piece's finding, not a cut: `python -m harness --resume REPORT` runs it
   again). The pieces that write no report (the tests, the check) are done once they ended by themselves with
   status 0, which the script records by their command in reports/gpu-reference-done.json.
 - cut off: its report has interrupted runs (stopped at the budget), or a killed harness left it (`-killed`):
   the piece runs as `python -m harness [parity] --resume REPORT`, so its finished runs are kept, not paid for
   twice; its estimate is the share of its runs left.
 - not started (no report of its command, no mark): it runs from the start.
A piece's report is the latest in reports/ whose results.json records the piece's own command (the same flags,
interpreters and data): a report of another command, a smoke run's say, is not this piece's. The commands name the
data and the tests relative to the project's root, so that they are the same on every machine. A results.json or
done-file that cannot be read is said in one line and counts for no piece: the piece runs again from the start.
--fresh ignores every report and mark and runs the pieces from the start (after the harness refused to resume a
report because the code changed since, say).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data" / "fashion-mnist"
REPORTS = ROOT / "reports"
# The pieces that write no report (the tests, the check): each one's command, once it ended by itself with status 0.
MARKS = "gpu-reference-done.json"
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
# Python but optree), installed without dependencies (numpy, absl-py, rich, h5py, ml-dtypes are there); so does
# nvidia-ml-py (pure Python), which reads the GPUs' energy counters (common/energy.py).
KERAS = {"keras": "keras", "namex": "namex", "optree": "optree", "nvidia-ml-py": "pynvml"}
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
SHARDED_RESNET50 = [*RESNET50_TORCH, "--strategy", "ddp,fsdp", "--no-check"]
PROFILED_3 = [
    "--profile",
    "3",
    "--no-check",
]  # ResNet-50's steps are long: three profiled are enough
# torch's own words on its CUDA graphs (captured, or skipped and why), in each worker's log beside the report
TORCH_GRAPH_LOGS = {"TORCH_LOGS": "cudagraphs,perf_hints"}
# ... and on where dynamo breaks a Keras model into graphs and why it compiles one again
KERAS_COMPILE_LOGS = {"TORCH_LOGS": "graph_breaks,recompiles"}
# the profiled steps as an epoch runs them: the trace holds the input path and any wait between steps
FED_PROFILE = ["--profile", "5", "--profile-epoch"]


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


# In the order of what the next GPU minutes must buy: what feeding costs torch as written (found by the CUDA tests,
# measured against resident batches on the same card), Keras's GPU runs, parity on the GPU, the d2l recipe at each
# framework's best and the README's table; then the pieces earlier leases ran.
PIECES = [
    # what the feeding costs, found and proven: the CUDA tests (the fed steps neither synchronise the host with the
    # device nor allocate page-locked memory), then torch as written by default beside resident batches, same card
    Piece("gpu-tests-torch", 1.5, ["pytest", "torch", "cuda"]),
    Piece("torch-fed", 0.6, [*TORCH_SCRATCH, *D2L_BF16, *LEVER_EPOCHS, *FED_PROFILE]),
    Piece("torch-resident", 0.4, [*TORCH_SCRATCH, *D2L_BF16, "--resident-data", *LEVER_EPOCHS]),
    # Keras on both its frameworks, profiled (the syncs and device ops a step), then every framework against its
    # own idiom, then each framework at its best for the d2l recipe's 10 epochs
    Piece("keras", 2.5, ["--backend", "keras", *D2L_BF16, *LEVER_EPOCHS, "--profile", "3"]),
    Piece("parity", 9.0, ["parity", "--backend", "torch,jax,keras", "--gpus", "1"]),
    Piece(
        "d2l-best",
        5.0,
        [
            "--backend",
            "torch,jax",
            "--strategy",
            "scratch,pmap,sharding",
            *D2L_BF16,
            "--best",
            "--resident-data",
            "--no-check",
        ],
        TORCH_GRAPH_LOGS,
    ),
    # Keras's ddp compiled, given the time it needs once, with torch's words on its graph breaks and recompiles
    Piece(
        "keras-compile",
        6.0,
        ["--backend", "keras", "--strategy", "ddp", *D2L_BF16, "--compile", *LEVER_EPOCHS],
        KERAS_COMPILE_LOGS,
    ),
    # the README's table in one sitting: each framework as written and at its best, one card
    Piece(
        "readme",
        8.0,
        ["--backend", "torch,jax,keras", *D2L_BF16, "--best", "--epochs", "3", "--no-check"],
        TORCH_GRAPH_LOGS,
    ),
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
    # the pieces earlier leases ran: each framework at its best, each torch lever alone, ResNet-50, the reference
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
    Piece("torch-compile", 0.6, [*TORCH_SCRATCH, *D2L_BF16, "--compile", *LEVER_EPOCHS]),
    Piece(
        "torch-channels-last", 0.4, [*TORCH_SCRATCH, *D2L_BF16, "--channels-last", *LEVER_EPOCHS]
    ),
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
    # the sharded variants' single-device overheads, before a multi-GPU host is lent: ResNet-50 ddp against fsdp
    # in both reshard modes (ZeRO-3, ZeRO-2), then with the gradients exchanged in bf16
    Piece(
        "resnet50-sharded",
        1.5,
        [*SHARDED_RESNET50, "--option", "reshard_after_forward=true,false"],
    ),
    Piece("resnet50-sharded-bf16-grads", 1.0, [*SHARDED_RESNET50, "--grad-dtype", "bf16"]),
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
# parity: each strategy of torch, JAX and Keras beside its framework's own loop, 3 trials of each side at batch 256,
# the fixed design (95% intervals), so that the three frameworks fit one command
PARITY_GPU = ["--device", "gpu", "--repeat", "3", "--max-trials", "3"]
PARITY_SMOKE = ["--device", "cpu", "--batch-size", "8", "--repeat", "2", "--timed-steps", "3"]


def command(args: list[str], python: str | None, smoke: bool) -> list[str]:
    """The command of a piece, with the host's interpreter for torch and JAX (None: the backends' own
    environments, for a smoke run) and the carried data. It runs in the project's root, and names its files
    relative to it: the same piece is the same command on every machine, which is how its report is found."""
    sub = args[0] if args[0] in ("check", "parity", "test", "pytest") else None
    if sub == "pytest":  # one backend's GPU-only tests, in the interpreter that has its framework
        backend, selection = args[1], args[2]
        test_file = f"tests/backends/test_{backend}.py"
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
    data = ["--data-dir", str(DATA.relative_to(ROOT))] if DATA.is_dir() else []
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


def within_budget(
    pieces: list[Piece], minutes: float | None, cost=lambda piece: piece.minutes
) -> list[Piece]:
    """The pieces, in order, while their estimated minutes (`cost`: what is left of each) add up to at most
    `minutes` (None: all)."""
    if minutes is None:
        return pieces
    chosen, total = [], 0.0
    for piece in pieces:
        if total + cost(piece) > minutes:
            break
        chosen.append(piece)
        total += cost(piece)
    return chosen


# ------------------------------------------------------------------ where each piece stands (see the docstring)

DONE, CUT_OFF, NOT_STARTED = "done", "cut off", "not started"
# A run's status in results.json (common/results.py's STATUSES): anything else is a damaged report.
RUN_STATUSES = ("ok", "failed", "diverged", "timeout", "unavailable", "interrupted")
HARNESS = ["python", "-m", "harness"]  # how results.json's "command" begins


@dataclass(frozen=True)
class State:
    kind: str = NOT_STARTED
    report: str = ""  # the report that holds its runs, relative to the project's root
    what: str = ""  # what is known of it, in words
    left: float = 1.0  # the share of its estimated minutes still to run


def writes_report(piece: Piece) -> bool:
    return piece.args[0] not in ("check", "test", "pytest")


def shown(path: Path) -> str:
    """A path as the user knows it: relative to the project's root where it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def read_reports(say) -> dict[tuple[str, ...], list[tuple[Path, dict]]]:
    """Every report in reports/ by its command's words after `python -m harness`, oldest first (a run id begins
    with the time it started). A results.json that cannot be read counts for no piece, in one line."""
    found: dict[tuple[str, ...], list[tuple[Path, dict]]] = {}
    for path in sorted(REPORTS.glob("*/results.json")):
        try:
            words, doc = read_report(path)
        except ValueError as e:
            say(f"{shown(path)} cannot be read ({e}): it counts for no piece")
            continue
        if words[:3] == HARNESS:
            found.setdefault(tuple(words[3:]), []).append((path.parent, doc))
    return found


def read_report(path: Path) -> tuple[list[str], dict]:
    """A results.json's command, in words, and the document; ValueError, in words, if it has none (untrusted)."""
    try:
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise ValueError(e.strerror or type(e).__name__) from None
    except (UnicodeDecodeError, RecursionError):
        raise ValueError("not JSON") from None
    # (json.JSONDecodeError is a ValueError, and says where the text breaks)
    if not isinstance(doc, dict) or not isinstance(doc.get("command"), str):
        raise ValueError("it records no command")
    return shlex.split(doc["command"]), doc


def report_state(folder: Path, doc: dict) -> State:
    """A piece's report read: done, or cut off (interrupted runs, or a killed harness's report, which has no
    "finished"); ValueError, in words, where its runs are not runs."""
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError("it holds no list of runs")
    if not all(isinstance(r, dict) and r.get("status") in RUN_STATUSES for r in runs):
        raise ValueError("a run has no status the harness writes")
    planned = [r for r in runs if r["status"] != "unavailable"]
    left = sum(r["status"] == "interrupted" for r in planned)
    where = shown(folder)
    if not isinstance(doc.get("finished"), str):
        return State(CUT_OFF, where, f"its harness was killed; {where} holds the runs it finished")
    if left:
        return State(
            CUT_OFF,
            where,
            f"{where} holds {len(planned) - left} of its {len(planned)} runs",
            left / len(planned),
        )
    failed = sum(r["status"] != "ok" for r in planned)
    failures = f" ({failed} of them failed)" if failed else ""
    return State(DONE, where, f"{where} holds its runs{failures}", 0.0)


def read_marks(say) -> dict[str, str]:
    """reports/gpu-reference-done.json: each done piece's command, with when it ended; one line if unreadable."""
    path = REPORTS / MARKS
    if not path.exists():
        return {}
    try:
        marks = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        say(f"{shown(path)} cannot be read ({e}): the pieces it marks done run again")
        return {}
    if not isinstance(marks, dict):
        say(f"{shown(path)} is not a map of commands: the pieces it marks done run again")
        return {}
    return {k: v for k, v in marks.items() if isinstance(v, str)}


def mark_key(cmd: list[str]) -> str:
    return shlex.join(cmd[1:])  # the words after the interpreter, as a report records its command


def mark_done(cmd: list[str]) -> None:
    """Records a piece without a report as done (it ended by itself with status 0), written whole or not at all."""
    path = REPORTS / MARKS
    marks = read_marks(lambda line: None)  # (an unreadable file was said when the pieces were read)
    marks[mark_key(cmd)] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    REPORTS.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{MARKS}.tmp")
    staged.write_text(json.dumps(marks, indent=1, sort_keys=True) + "\n")
    os.replace(staged, path)


def piece_states(pieces: list[Piece], python: str | None, smoke: bool, say) -> dict[str, State]:
    """Each piece's state, by its name."""
    reports, marks = read_reports(say), read_marks(say)
    return {
        p.name: piece_state(p, command(p.args, python, smoke), reports, marks, say) for p in pieces
    }


def piece_state(piece: Piece, cmd: list[str], reports: dict, marks: dict[str, str], say) -> State:
    if not writes_report(piece):
        ended = marks.get(mark_key(cmd))
        return (
            State(DONE, "", f"it ended with status 0 at {ended} ({MARKS})", 0.0)
            if ended
            else State()
        )
    found = reports.get(tuple(cmd[3:]))
    if not found:
        return State()
    folder, doc = found[-1]  # the latest: a resumed report holds every run of the one it resumed
    try:
        return report_state(folder, doc)
    except ValueError as e:
        say(
            f"piece {piece.name}: its report {shown(folder)} is damaged ({e}): it runs again from the start"
        )
        return State()


def piece_command(piece: Piece, python: str | None, smoke: bool, state: State) -> list[str]:
    """The piece's command; a cut-off one's is the harness's --resume of its report, which takes no other flag:
    the report's own command is planned again, its finished runs kept."""
    cmd = command(piece.args, python, smoke)
    if state.kind != CUT_OFF:
        return cmd
    return cmd[:3] + (["parity"] if piece.args[0] == "parity" else []) + ["--resume", state.report]


def say_error(line: str) -> None:
    print(f"gpu_reference: {line}", file=sys.stderr)


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


def run(
    pieces: list[Piece],
    python: str | None,
    smoke: bool,
    deadline: float | None,
    states: dict[str, State] | None = None,
) -> int:
    """Each piece in turn (a cut-off one resumed, by `states`), each stopped with SIGTERM where `deadline` (a
    time.monotonic() instant) passes."""
    install_carried(python)
    failed, timings = [], []
    for piece in pieces:
        state = (states or {}).get(piece.name, State())
        cmd = piece_command(piece, python, smoke, state)
        resumed = f", resumed ({state.what})" if state.kind == CUT_OFF else ""
        print(f"\n== piece {piece.name}{resumed}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        child = None
        try:
            with stop_signals_held():
                child = subprocess.Popen(cmd, cwd=ROOT, env=piece_env(piece))
            status = wait_until(child, deadline)
        # Ctrl-C, SIGTERM, SIGHUP: the piece's harness writes what finished, then stops
        except KeyboardInterrupt as e:
            if child is not None:
                stop(child)
            print(
                f"\ninterrupted in piece {piece.name}; its report holds the runs that finished",
                file=sys.stderr,
            )
            return stopped_status(e)
        timings.append(f"{piece.name} {time.monotonic() - started:.0f} s")
        if status is None:
            stop(child)
            failed.append(f"{piece.name} (cut off at the budget)")
            break
        if status == 0 and not writes_report(piece):
            mark_done(cmd)
        if status:
            failed.append(piece.name)
        if status == 2 and state.kind == CUT_OFF:
            number = PIECES.index(piece) + 1
            say_error(
                f"piece {piece.name}: the harness refused to resume {state.report} (another commit made it?); "
                f"`run --fresh --piece {number}` runs it from the start"
            )
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


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt, so that one path stops all three."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interrupt(signum, frame):
    raise Stopped(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_held():
    """A stop signal that arrives while a piece's process starts is held, and raised once its Popen is known: raised
    inside Popen, after the fork, it would lose the process, which would run on unstopped."""
    held = []
    # (a signal this process ignores, as a shell's background job ignores Ctrl-C, stays ignored)
    caught = {sig: handler for sig in STOP_SIGNALS if callable(handler := signal.getsignal(sig))}
    for sig in caught:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in caught.items():
            signal.signal(sig, handler)
    if held:
        caught[held[0]](held[0], None)  # Ctrl-C's KeyboardInterrupt, or Stopped


def stopped_status(error: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process it killed: 130 for Ctrl-C, 143 for SIGTERM, 129
    for SIGHUP."""
    return 128 + getattr(error, "signum", signal.SIGINT)


class Parser(argparse.ArgumentParser):
    """A bad flag is one line on the standard error and exit status 2, with no usage before it."""

    def error(self, message):
        say_error(f"error: {message} (see --help)")
        sys.exit(2)


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


def catch_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def main(argv: list[str] | None = None) -> int:
    catch_stop_signals()
    parser = Parser(
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
            help="the first pieces not done whose estimated minutes (what is left of them) fit, each stopped "
            "(its report kept, to be resumed) once the budget is spent (default: every piece, no deadline)",
        )
        p.add_argument(
            "--python",
            default=None,
            help="the interpreter with torch and JAX (default: this one; with --smoke, the backends' "
            "own environments)",
        )
        p.add_argument("--smoke", action="store_true", help="on the CPU, cut to a few steps")
        p.add_argument(
            "--fresh",
            action="store_true",
            help="run the pieces from the start, as if no report existed (default: a piece done is skipped, "
            "one cut off is resumed from its report)",
        )
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
    python = args.python or (None if args.smoke else sys.executable)
    # (`list` only prints the commands: it may name the interpreter of another machine)
    if args.action == "run" and python is not None and shutil.which(python) is None:
        say_error(f"error: --python {python}: no such interpreter (not an executable file)")
        return 2
    states = {} if args.fresh else piece_states(pieces, python, args.smoke, say_error)

    def state(piece: Piece) -> State:
        return states.get(piece.name, State())

    left = [p for p in pieces if state(p).kind != DONE]
    chosen = within_budget(left, args.budget, lambda p: p.minutes * state(p).left)
    if left and not chosen:
        say_error(f"error: no piece left fits {args.budget:g} minutes")
        return 2
    if args.action == "list":
        for piece in pieces:
            if state(piece).kind == DONE or piece in chosen:
                print(listed(piece, state(piece), python, args.smoke))
        return 0
    for piece in pieces:
        if state(piece).kind == DONE:
            print(f"== piece {piece.name}: done, skipped: {state(piece).what}")
    if not chosen:
        print("Every piece asked for is done (--fresh runs them again)")
        return 0
    deadline = None if args.budget is None else time.monotonic() + 60 * args.budget
    return run(chosen, python, args.smoke, deadline, states)


def listed(piece: Piece, state: State, python: str | None, smoke: bool) -> str:
    """`list`'s line of a piece: its number, name, minutes (what is left of them) and command, or that it is done."""
    head = f"{PIECES.index(piece) + 1}. {piece.name}"
    if state.kind == DONE:
        return f"{head} (~{piece.minutes:g} min): done, {state.what}"
    cmd = " ".join(piece_command(piece, python, smoke, state)[1:])
    if state.kind == CUT_OFF:
        return f"{head} (~{piece.minutes * state.left:.2g} of {piece.minutes:g} min; cut off, {state.what}): {cmd}"
    return f"{head} (~{piece.minutes:g} min): {cmd}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:  # before or between the pieces: nothing of theirs to keep
        say_error("interrupted")
        sys.exit(stopped_status(stopped))

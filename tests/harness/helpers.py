"""Helpers for the harness tests (run in the harness's environment, no framework)."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shlex
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run_harness(
    *args: str, env: dict | None = None, timeout: float = 300, cwd=ROOT
) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` in a subprocess with this interpreter, from `cwd` (the project root by default);
    an `env` value of None unsets that variable."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env = {name: value for name, value in full_env.items() if value is not None}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def harness_in_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` as `cli.main(ARGS)` in this process, with its exit status and what it printed, as
    run_harness gives them. A refusal comes while parsing and planning, before anything starts: it needs no
    interpreter of its own, whose start (0.4 s) was most of such a test. An exception that escapes `main` fails
    the test as a traceback would. test_cli.py's test_missing_data_dir_is_refused proves the process's own refusal."""
    from harness import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = cli.main(list(args))
        except SystemExit as e:  # argparse's own refusals and --help
            status = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(list(args), status, stdout.getvalue(), stderr.getvalue())


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode an array as an IDX file (uint8 elements)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    raw = idx_bytes(array)
    if compress:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def fake_python(tmp_path: Path, body: str, name: str = "fake-python") -> str:
    """An executable standing in for a backend's interpreter (it ignores `-m backends.X ...`)."""
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def fake_nvidia_smi(
    bin_dir: Path,
    gpus: list[str] = (),
    mig_listing: list[str] = (),
    exit_code: int = 0,
    error: str = "",
) -> Path:
    """An `nvidia-smi` in bin_dir: `--query-gpu=...` prints the CSV lines `gpus`, `-L` prints `mig_listing`.

    It uses shell builtins only, so it works with PATH holding nothing but bin_dir.
    """

    def printf(lines):
        return "printf '%s\\n' " + " ".join(map(shlex.quote, lines)) if lines else ":"

    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(
        "#!/bin/sh\n"
        + (f"echo {shlex.quote(error)} >&2\n" if error else "")
        + f'case "$1" in\n  -L) {printf(mig_listing)};;\n  *) {printf(gpus)};;\nesac\n'
        + f"exit {exit_code}\n"
    )
    path.chmod(0o755)
    return path


CPU = ("--device", "cpu")
SYNTHETIC = ("--dataset", "synthetic")
# The run most tests' commands start from: torch's scratch strategy on LeNet, the quickest there is.
TORCH_LENET = ("--backend", "torch", "--strategy", "scratch", "--model", "lenet")


def assert_refused(
    tmp_path, *args, match: str, command=(), dataset=SYNTHETIC, env=None, device=CPU
):
    """`python -m harness [command] ARGS` exits 2 with one line `harness: error: ...MATCH...`, no traceback,
    and (for a benchmark) creates nothing in its --out. Simulated CPU devices unless `device` says otherwise
    (then `env` sets up the GPUs)."""
    out = tmp_path / "reports"
    argv = (*command, *args, *device, *dataset, *(() if command else ("--out", str(out))))
    # a process of its own only where the environment differs: a module may read it when imported
    result = run_harness(*argv, env=env) if env else harness_in_process(*argv)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("harness: error: ") and match in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()

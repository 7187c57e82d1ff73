"""Helpers for the harness tests (run in the harness's environment, no framework)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run_harness(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` in a subprocess with this interpreter."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode an array as an IDX file (uint8 elements)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
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

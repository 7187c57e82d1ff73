"""Figures a worker reports about itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_peak_memory_is_the_workers_own_not_its_parents():
    """A worker started by a 400 MiB process reports its own peak (Linux keeps ru_maxrss across exec)."""
    parent = (
        "import subprocess, sys\n"
        "import numpy as np\n"
        "big = np.ones(400 * 2**20 // 8)\n"
        "child = 'from common import sysinfo; print(sysinfo.peak_rss_mb())'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", parent],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert 1 < float(out.stdout) < 200

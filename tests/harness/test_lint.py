"""The code passes ruff's checks and is laid out as `ruff format` lays it out (both configured in pyproject.toml,
ruff pinned in harness/requirements.txt)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.harness.helpers import ROOT


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff"), (
        "ruff is missing: pip install -r harness/requirements.txt"
    )
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]


def test_the_code_is_laid_out_by_ruff_format():
    """One layout, the formatter's: no line packed denser (or spread thinner) by hand. `ruff format .` fixes it."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]

"""The benchmark scripts run with an interpreter given by --python (a GPU host without network has no pip):
they use it as it is, build nothing, and refuse a path that is not an interpreter with one line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness.helpers import ROOT, fake_python

SCRIPTS = ["benchmarks/profile_torch_step.py"]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_python_that_is_not_an_executable_is_a_usage_error(script, tmp_path):
    out = run_script(script, "--python", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(f"--python {tmp_path / 'missing'} is not an executable file")
    )
    assert "Traceback" not in out.stderr


def test_profile_runs_its_profile_with_the_given_python_and_builds_nothing(tmp_path):
    marker = tmp_path / "called"
    python = fake_python(tmp_path, f'echo "$@" > {marker}')
    out = run_script(
        "benchmarks/profile_torch_step.py", "--python", python, "--steps", "3", "--batch-size", "8"
    )
    assert out.returncode == 0, out.stderr
    called = marker.read_text().split()
    assert called == ["-m", "benchmarks.torch_step_profile", "8", "3", "cpu", "0"]
    # no line about building or rebuilding .venvs/torch
    assert ".venvs/" not in out.stdout + out.stderr

"""Backend tests run inside one backend's environment: `python -m harness test` sets DPBENCH_BACKEND."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import manifest
from harness.envs import worker_env

NAME = os.environ.get("DPBENCH_BACKEND")
ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    if NAME:
        return
    skip = pytest.mark.skip(
        reason="backend tests run inside a backend environment: python -m harness test"
    )
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def backend():
    return importlib.import_module(f"backends.{NAME}")


@pytest.fixture(scope="session")
def meta() -> manifest.Manifest:
    return manifest.load(NAME)


def pytest_generate_tests(metafunc):
    """`strategy` takes each strategy the backend declares in its backend.toml."""
    if "strategy" in metafunc.fixturenames:
        metafunc.parametrize("strategy", list(manifest.load(NAME).strategies) if NAME else ["none"])


def run_backend_worker(tmp_path, **overrides) -> tuple[int, dict]:
    """`python -m backends.<NAME>` end to end on a small synthetic LeNet run: (exit status, result)."""
    cfg = {
        "backend": NAME,
        "devices": 2,
        "model": "lenet",
        "epochs": 2,
        "batch_size": 16,
        "lr": 0.1,
        "train_size": 64,
        "test_size": 40,
        "eval_batch_size": 16,
        "dataset": "synthetic",
        **overrides,
    }
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            f"backends.{NAME}",
            "--config",
            str(tmp_path / "c.json"),
            "--result",
            str(tmp_path / "r.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=300,
    )
    return proc.returncode, json.loads((tmp_path / "r.json").read_text())

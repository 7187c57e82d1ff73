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
from common.backend import Backend
from common.profiling import TRACES_ENV
from common.worker import THREADS_ENV
from harness.processes.envs import worker_env

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
def backend() -> Backend:
    """The backend under test: backends.<NAME>.BACKEND, what the worker and the check worker take."""
    return importlib.import_module(f"backends.{NAME}").BACKEND


@pytest.fixture(scope="session")
def meta() -> manifest.Manifest:
    return manifest.load(NAME)


def pytest_generate_tests(metafunc):
    """`strategy` takes each strategy the backend declares in its backend.toml (a test marked `replicated`: each
    but the variants), `lever` each speed lever."""
    if "strategy" in metafunc.fixturenames:
        metafunc.parametrize("strategy", strategies_of(metafunc) if NAME else ["none"])
    if "lever" in metafunc.fixturenames:
        metafunc.parametrize("lever", list(manifest.load(NAME).levers) if NAME else ["none"])


def strategies_of(metafunc) -> list[str]:
    """The strategies a test runs on. A variant (fsdp) takes its replicated siblings' steps in float64 on 1 and 2
    devices, BatchNorm statistics included (test_strategies_agree_in_float64), so a `replicated` test's claim of
    those steps (k devices as one, float64 as asked, float32 and bf16 near them, batches fed any way) is proven for
    it there; the variant runs the tests of what is its own (its engine, its compiles, its trace, its worker, its
    synchronised BatchNorm)."""
    declared = manifest.load(NAME).strategies
    if metafunc.definition.get_closest_marker("replicated"):
        return [name for name, s in declared.items() if not s.variant]
    return list(declared)


def worker_config(**overrides) -> dict:
    """The run config (--config) of a small synthetic LeNet run on 2 devices."""
    return {
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


def run_backend_worker(tmp_path, **overrides) -> tuple[int, dict]:
    """`python -m backends.<NAME>` end to end on worker_config(**overrides), started as the harness starts it (a
    run's --threads also in THREADS_ENV, for a framework that sizes its threads when imported; --profile's traces
    in tmp_path/traces): (exit status, result). Its standard output is kept in tmp_path/worker.log."""
    cfg = worker_config(**overrides)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    threads = {THREADS_ENV: str(cfg["threads"])} if cfg.get("threads") else {}
    if cfg.get("profile"):
        threads[TRACES_ENV] = str(tmp_path / "traces")
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
        env=worker_env(**threads),
        timeout=300,
    )
    (tmp_path / "worker.log").write_text(proc.stdout)
    return proc.returncode, json.loads((tmp_path / "r.json").read_text())

"""Several nodes on this host over loopback, for the backend tests: each node a `python -m backends.<name>`
process (a check job's measurements, or a training run), all started together, every wait bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from common.measurement_files import MeasurementFile
from common.network import free_port
from harness.processes.envs import worker_env

ROOT = Path(__file__).resolve().parents[2]


def refused_port() -> int:
    """A loopback port nothing listens on (bound and released: a connection to it is refused)."""
    return free_port()


def start_nodes(
    name: str, mode: str, jobs: list[dict], tmp_path: Path, suffix: str
) -> list[subprocess.Popen]:
    """One worker per job (`mode` "--check" or "--config"), started together; results at node<r><suffix>."""
    procs = []
    for rank, job in enumerate(jobs):
        job_path, result = tmp_path / f"node{rank}.json", tmp_path / f"node{rank}{suffix}"
        job_path.write_text(json.dumps(job))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    f"backends.{name}",
                    mode,
                    str(job_path),
                    "--result",
                    str(result),
                ],
                cwd=ROOT,
                env=worker_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(exit status, output) of every node; a node still running after `timeout` is killed and fails the test."""
    out = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"a node did not finish within {timeout} s") from None
        out.append((proc.returncode, text))
    return out


def measure_on_nodes(
    name: str, job: dict, nodes: int, tmp_path: Path, timeout: float = 300, port: int | None = None
) -> list[dict[str, np.ndarray]]:
    """The check job's measurements (common/measurements.py) on `nodes` loopback nodes: every node's arrays."""
    coordinator = f"127.0.0.1:{port or free_port()}"
    jobs = [
        {**job, "nodes": nodes, "node_rank": r, "coordinator": coordinator} for r in range(nodes)
    ]
    finished = finish(start_nodes(name, "--check", jobs, tmp_path, ".npz"), timeout)
    for rank, (code, text) in enumerate(finished):
        assert code == 0, f"node {rank} failed:\n{text[-3000:]}"
    arrays = []
    for rank in range(nodes):
        with MeasurementFile(tmp_path / f"node{rank}.npz") as f:
            arrays.append(dict(f))
    return arrays


def write_check_inputs(tmp_path: Path, model: str, weights: dict, batches: list) -> dict:
    """The shared part of a check job (as harness.check.prepare writes it): weights and batches files."""
    from common import weights as weightslib

    weightslib.save(tmp_path / "w.npz", weights)
    np.savez(
        tmp_path / "batches.npz",
        x=np.stack([b[0] for b in batches]),
        y=np.stack([b[1] for b in batches]),
    )
    return {"weights": {model: str(tmp_path / "w.npz")}, "batches": str(tmp_path / "batches.npz")}

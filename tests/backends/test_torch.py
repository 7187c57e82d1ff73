"""PyTorch-only behaviour: DDP failure handling, dp refusal, the worker end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.backends.conftest import NAME, run_backend_worker

pytestmark = pytest.mark.skipif(NAME != "torch", reason="torch backend only")
ROOT = Path(__file__).resolve().parents[2]


def rank_processes_of(pid: int) -> list[int]:
    """Live children started by multiprocessing spawn (the ranks; not its resource tracker)."""
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    kids.append(int(entry))
    return kids


def fail_on_rank_1(cfg, rank, payload):
    """Rank 1 raises; rank 0 waits in a collective that will never complete."""
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("planted failure in rank 1")
    dist.barrier()
    return "unreachable"


def test_a_failing_rank_fails_the_run_with_its_error_and_leaves_no_process():
    from backends.torch.strategies import launch_ddp
    from common.config import RunConfig
    cfg = RunConfig(backend="torch", strategy="ddp", devices=2, batch_size=8, timeout=120).validate()
    assert rank_processes_of(os.getpid()) == []
    with pytest.raises(RuntimeError) as info:
        launch_ddp(cfg, fail_on_rank_1)
    assert "DDP rank 1 failed" in str(info.value)
    assert "planted failure in rank 1" in str(info.value)
    assert rank_processes_of(os.getpid()) == []


def test_dataparallel_is_refused_without_cuda():
    import torch
    from backends.torch import initial_weights, train_steps
    from common.loop import Unsupported
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(Unsupported, match="needs CUDA"):
        train_steps("dp", "lenet", 1, initial_weights("lenet", 0), [(np.zeros((2, 1, 28, 28), np.float32),
                                                                    np.zeros(2, np.int32))], 0.1)


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "ddp", **overrides})


@pytest.mark.parametrize("name", ["scratch", "ddp"])
def test_worker_trains_and_writes_a_complete_result(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["schema_version"] == 1 and r["params"] == 129_068
    assert [e["epoch"] for e in r["epochs"]] == [1, 2]
    assert all(e["steps"] == 4 and e["images"] == 64 for e in r["epochs"])
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert all(0.0 <= e["test_acc"] <= 1.0 for e in r["epochs"])
    assert r["environment"]["framework"] == "torch" and len(r["environment"]["devices"]) == 2
    assert r["environment"]["processes"] == (2 if name == "ddp" else 1)
    assert len(r["weights_hash"]) == 64 and len(r["data_hash"]) == 64
    assert r["compile_s"] > 0


def test_worker_reports_divergence(tmp_path):
    rc, r = run_worker(tmp_path, strategy="scratch", lr=1e30, epochs=1)
    assert rc == 1 and r["status"] == "diverged"
    assert "training loss became" in r["error"]

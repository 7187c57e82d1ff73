"""Figures a worker reports about itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import sysinfo

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


def test_the_environment_record_keeps_its_json_shape():
    """results.json and the report read these keys: a backend's record, the host and the run config's part, in
    this order."""
    from common import sysinfo
    from common.config import RunConfig
    from common.levers import Levers
    from common.nodes import NodeSpec

    cfg = RunConfig(
        backend="torch",
        strategy="ddp",
        devices=4,
        nodes=NodeSpec(2, coordinator="127.0.0.1:29500"),
        levers=Levers(precision="bf16", compile=True),
    )
    record = sysinfo.EnvironmentRecord(
        framework="torch",
        version="2.0",
        libraries={"extra": "1.0"},
        cuda=None,
        cudnn=None,
        devices=["cpu (simulated device 0)", "cpu (simulated device 1)"],
        framework_gpus=0,
        processes=4,
        threads=3,
        precision={"autocast": "bfloat16"},
        compile="torch.compile",
        input_copies="none",
        sgd_update="torch.optim.SGD",
        collective="gloo",
        batchnorm="local",
        layout="NCHW",
        details={"engine": "torchrun"},
    )
    env = sysinfo.environment(cfg, record)
    host = sysinfo.host()
    assert env == {
        **host,
        "framework": "torch",
        "framework_version": "2.0",
        "libraries": {"extra": "1.0"},
        "cuda": None,
        "cudnn": None,
        "devices": ["cpu (simulated device 0)", "cpu (simulated device 1)"],
        "framework_gpus": 0,
        "nodes": 2,
        "loopback_nodes": True,
        "processes": 4,
        "threads_per_process": 3,
        "precision": {"mode": "bf16", "autocast": "bfloat16"},
        "levers": {
            "precision": "bf16",
            "compile": True,
            "channels_last": False,
            "resident_data": False,
            "prefetch": 2,
            "grad_dtype": "fp32",
            "bucket_mb": 0,
        },
        "compile": "torch.compile",
        "input_copies": "none",
        "sgd_update": "torch.optim.SGD",
        "collective": "gloo",
        "batchnorm": "local",
        "layout": "NCHW",
        "details": {"engine": "torchrun"},
    }
    assert list(env)[len(host) :] == [
        "framework",
        "framework_version",
        "libraries",
        "cuda",
        "cudnn",
        "devices",
        "framework_gpus",
        "nodes",
        "loopback_nodes",
        "processes",
        "threads_per_process",
        "precision",
        "levers",
        "compile",
        "input_copies",
        "sgd_update",
        "collective",
        "batchnorm",
        "layout",
        "details",
    ]


def test_busy_cpu_seconds_count_only_the_cpus_asked_and_not_their_idle_time(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  300 0 90 5000 20 0 6 4 0 0\n"
        "cpu0 100 0 50 1000 7 0 3 2 0 0\n"
        "cpu1 200 0 40 4000 13 0 3 2 0 0\n"
        "intr 12345\n"
    )
    hz = os.sysconf("SC_CLK_TCK")
    assert sysinfo.busy_cpu_seconds({0}, str(stat)) == 155 / hz
    assert sysinfo.busy_cpu_seconds({0, 1}, str(stat)) == 400 / hz
    assert sysinfo.busy_cpu_seconds({0}, str(tmp_path / "absent")) is None

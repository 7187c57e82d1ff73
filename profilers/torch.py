"""torch's profiler and matrix product (profilers/__init__.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from common import sysinfo
from common.config import RunConfig
from common.profiling import Recording


@contextlib.contextmanager
def record(cfg: RunConfig, folder: Path, rank: int):
    """torch.profiler around the block (the CPU's operators, and the CUDA kernels on a GPU); its Chrome trace,
    gzipped, written as rank<r>.trace.json.gz when the block ends."""
    gpu = cfg.device_kind == "gpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    recording = Recording("torch")
    with torch.profiler.profile(activities=activities) as profiler:
        yield recording
    recording.path = folder / f"rank{rank}.trace.json.gz"
    profiler.export_chrome_trace(str(recording.path))


def matmul(cfg: RunConfig, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's current device, waited for: a call to time. On the
    CPU it takes every usable CPU, whatever the run's threads per process: the peak is the host's, and a ddp rank
    has only its share of the threads (the peak is the last thing a run measures, so nothing timed follows)."""
    gpu = cfg.device_kind == "gpu"
    if not gpu:
        torch.set_num_threads(sysinfo.usable_cpus())
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    a, b, c = (torch.randn(n, n, dtype=getattr(torch, dtype), device=device) for _ in range(3))

    def product() -> None:
        torch.mm(a, b, out=c)
        if gpu:
            torch.cuda.synchronize(device)

    return product

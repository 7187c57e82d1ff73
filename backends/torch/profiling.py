"""torch's profiler around the profiled steps (--profile; common/profiling.py reads its trace), and torch's
matrix-multiply peak on this host (the report's measured limit)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from common.profiling import Recording


@contextlib.contextmanager
def record(cfg, folder: Path, rank: int):
    """torch.profiler around the block (the CPU's operators, and the CUDA kernels on a GPU); its Chrome trace,
    gzipped, written as rank<r>.trace.json.gz when the block ends."""
    activities = [ProfilerActivity.CPU]
    if cfg.device_kind == "gpu":
        activities.append(ProfilerActivity.CUDA)
    recording = Recording("torch")
    with torch.profiler.profile(activities=activities) as profiler:
        yield recording
    recording.path = folder / f"rank{rank}.trace.json.gz"
    profiler.export_chrome_trace(str(recording.path))


def matmul(cfg, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, waited for: a call to time."""
    gpu = cfg.device_kind == "gpu"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    a, b, c = (torch.randn(n, n, dtype=getattr(torch, dtype), device=device) for _ in range(3))

    def product() -> None:
        torch.mm(a, b, out=c)
        if gpu:
            torch.cuda.synchronize(device)

    return product

"""MXNet's profiler and matrix product (profilers/__init__.py)."""

from __future__ import annotations

import contextlib
import gzip
import shutil
from pathlib import Path

from common.config import RunConfig
from common.profiling import Recording

import mxnet as mx


@contextlib.contextmanager
def record(cfg: RunConfig, folder: Path, rank: int):
    """MXNet's profiler around the block: its operators, imperative and symbolic (a hybridized network's bulked
    segments), not its C API calls or memory counters, which would make the trace ten times larger; its Chrome
    trace dumped when the block ends and gzipped as rank<r>.trace.json.gz."""
    raw = folder / f"rank{rank}.trace.json"
    mx.profiler.set_config(
        profile_symbolic=True,
        profile_imperative=True,
        profile_memory=False,
        profile_api=False,
        aggregate_stats=False,
        filename=str(raw),
    )
    recording = Recording("mxnet")
    mx.profiler.set_state("run")
    try:
        yield recording
    finally:
        mx.profiler.set_state("stop")
    mx.profiler.dump()
    recording.path = folder / f"rank{rank}.trace.json.gz"
    with open(raw, "rb") as source, gzip.open(recording.path, "wb") as target:
        shutil.copyfileobj(source, target)
    raw.unlink()


def matmul(cfg: RunConfig, n: int, dtype: str):
    """One n x n matrix product in `dtype` on the run's first device (its first GPU, else the CPU), waited for: a
    call to time."""
    device = mx.gpu(cfg.first_gpu) if cfg.device_kind == "gpu" else mx.cpu(0)
    a, b, c = (mx.nd.random.normal(shape=(n, n), ctx=device).astype(dtype) for _ in range(3))

    def product() -> None:
        mx.nd.dot(a, b, out=c)
        c.wait_to_read()

    return product

"""jax's profiler and matrix product (profilers/__init__.py): what jax's backend, Keras's distribution (Keras on
jax) and the flax idiom record with."""

from __future__ import annotations

import contextlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common.config import RunConfig
from common.profiling import Recording


@contextlib.contextmanager
def record(cfg: RunConfig, folder: Path, rank: int):
    """jax.profiler around the block, at the host tracer's verbose level (on the CPU, XLA traces each of its ops
    only there), without Python's calls; TensorBoard's layout under rank<r>/, whose Chrome trace (the
    `*.trace.json.gz` Perfetto opens) the recording names."""
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 3
    options.python_tracer_level = 0
    out = folder / f"rank{rank}"
    recording = Recording("jax")
    with jax.profiler.trace(str(out), profiler_options=options):
        yield recording
    recording.path = next(iter(sorted(out.glob("plugins/profile/*/*.trace.json.gz"))), None)


def matmul(cfg: RunConfig, n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, compiled, waited for: a call to
    time."""
    device = jax.local_devices()[0]
    values = np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)
    a, b = (jax.device_put(jnp.asarray(v, dtype=dtype), device) for v in values)
    product = jax.jit(jnp.matmul)
    return lambda: product(a, b).block_until_ready()

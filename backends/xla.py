"""What the trainers that compile with XLA share, jax's and Keras's distribution (Keras on jax): the count of
XLA's compilations in this process, the key their compiled programs are shared under, and jax's profiler and
matrix-multiply peak (--profile, the report's measured limit). It stands beside the
backends, not in one, so that both use one listener and one key while neither imports the other
(pyproject.toml's import contracts)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common.config import RunConfig
from common.profiling import Recording

# jax's event for one XLA compilation (or a load from a compilation cache): Trainer.compiles() counts them.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiled = 0


def _count_compile(event: str, seconds: float, **metadata) -> None:
    global _compiled
    if event == COMPILE_EVENT:
        _compiled += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def compiled() -> int:
    """The programs XLA has compiled in this process since this module was imported."""
    return _compiled


def program_key(cfg: RunConfig, dtype: str, devices: list, *own) -> tuple:
    """What a trainer's compiled programs are built for, and so shared under (jax.jit keeps its executables in
    one function object): the model, BatchNorm mode, precision, dtype, learning rate, batch size and devices of
    the run, and `own`, what else the caller's programs depend on (its donated arguments, a data format)."""
    return (cfg.model, cfg.bn, cfg.precision, dtype, cfg.lr, cfg.batch_size, tuple(devices), *own)


@contextlib.contextmanager
def record_trace(folder: Path, rank: int):
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


def matmul(n: int, dtype: str):
    """One n x n matrix product in `dtype` on this process's first device, compiled, waited for: a call to
    time."""
    device = jax.local_devices()[0]
    values = np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)
    a, b = (jax.device_put(jnp.asarray(v, dtype=dtype), device) for v in values)
    product = jax.jit(jnp.matmul)
    return lambda: product(a, b).block_until_ready()

"""What the trainers that compile with XLA share, jax's and Keras's distribution (Keras on jax): the count of
XLA's compilations in this process, and the key their compiled programs are shared under. It stands beside the
backends, not in one, so that both use one listener and one key while neither imports the other
(pyproject.toml's import contracts)."""

from __future__ import annotations

import jax

from common.config import RunConfig

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

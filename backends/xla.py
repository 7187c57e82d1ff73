"""What the trainers that compile with XLA share, jax's and Keras's distribution (Keras on jax): the count of
XLA's compilations in this process, the key their compiled programs are shared under, and how far the host may
queue steps ahead of the simulated CPU devices. It stands beside the backends, not in one, so that both use one
listener, one key and one bound while neither imports the other (pyproject.toml's import contracts)."""

from __future__ import annotations

import collections

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
    one function object): the model, BatchNorm mode, precision, gradient exchange (dtype and bucket size), dtype,
    learning rate, batch size and devices of the run, and `own`, what else the caller's programs depend on (its
    donated arguments, a data format)."""
    return (
        cfg.model,
        cfg.bn,
        cfg.levers.precision,
        cfg.levers.grad_dtype,
        cfg.levers.bucket_mb,
        dtype,
        cfg.lr,
        cfg.batch_size,
        tuple(devices),
        *own,
    )


# XLA's CPU client can deadlock when the host queues many steps that hold a collective ahead of the simulated
# devices. Measured on a 2-core host (jax 0.10.2): LeNet on 2 simulated devices, the all-reduce of a step queued
# about 150 steps ahead waited for a device that never joined, and XLA ended the process after its 40 s rendezvous
# timeout; pmap, sharding and Keras's distribution alike, and none with the host kept 8 steps ahead. jax's and
# Keras's own loops queue as far ahead as the host gets, which on a GPU does no harm.
CPU_STEPS_AHEAD = 4


class StepQueue:
    """The outputs of the steps the host has queued and the devices may not have finished: at most `ahead`. Adding
    one more first waits for the oldest, so the devices keep steps queued (the host's dispatch still overlaps their
    work) but never many. `ahead` None: no bound (a GPU)."""

    def __init__(self, ahead: int | None):
        self.ahead = ahead
        self._queued = collections.deque()

    @classmethod
    def for_devices(cls, device_kind: str) -> StepQueue:
        return cls(CPU_STEPS_AHEAD if device_kind == "cpu" else None)

    def add(self, outputs) -> None:
        if self.ahead is None:
            return
        self._queued.append(outputs)
        while len(self._queued) > self.ahead:
            jax.block_until_ready(self._queued.popleft())

    def __len__(self) -> int:
        return len(self._queued)

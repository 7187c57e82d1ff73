"""JAX backend: the backend interface (docs/ARCHITECTURE.md) in JAX, flax (linen) and optax.

  resnet18, lenet,       models.py (and predict's network)
  resnet50
  devices, split,        parallel.py
  allreduce
  TRAINERS, and what     strategies.py (pmap, sharding; the math they share in models.py)
  the entry points call
  environment            environment.py (with the precision settings and float64's computing_in)
  run, the probes,       common/backend.py: written once for every backend
  predict, ...

Simulated devices: without GPUs, a run uses the first N of the CPU devices XLA is asked
for here: a training run's own count (common.worker.DEVICES_ENV), else the most --gpus
may ask for. The flag is read once, when jax initialises its CPU backend, so it is set
before anything in this package imports jax (a count already in XLA_FLAGS is kept). It
changes nothing on the GPUs.
"""

import os

from common.worker import simulated_devices


def _ask_xla_for_cpu_devices(count: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


_ask_xla_for_cpu_devices(simulated_devices())

from backends.jax import distributed, models, strategies  # noqa: E402  (after the XLA flag)
from backends.jax.environment import environment, refusal  # noqa: E402
from backends.jax.models import lenet, resnet18, resnet50  # noqa: E402
from backends.jax.parallel import allreduce, devices, split  # noqa: E402
from backends.jax.strategies import TRAINERS  # noqa: E402
from common.backend import ENTRY_POINTS, Backend  # noqa: E402

NAME = "jax"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# The backend interface (common/backend.py's INTERFACE): its own names, then the entry points, which
# __getattr__ below gives as backends.jax.<entry point>.
__all__ = [
    "NAME",
    "resnet18",
    "lenet",
    "resnet50",
    "devices",
    "split",
    "allreduce",
    "environment",
    "TRAINERS",
    "array",
    "to_numpy",
    "device_of",
    "BACKEND",
    *ENTRY_POINTS,
]


def __getattr__(name: str):
    return BACKEND.entry_point(name)


def to_numpy(a):
    import numpy as np

    return np.asarray(a)


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import jax

    return jax.device_put(values, device)


def device_of(a):
    """The one device a single-device array lives on."""
    (device,) = a.devices()
    return device

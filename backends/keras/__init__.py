"""Keras 3 backend: the backend interface (docs/ARCHITECTURE.md) in Keras, on the framework each strategy runs it on.

  resnet18, lenet,       models.py (keras.layers, one model code for both frameworks; predict's network)
  resnet50
  devices, split,        parallel.py
  allreduce
  TRAINERS, and what     strategies.py (ddp, Keras on torch under DistributedDataParallel, its ranks started by
  the entry points call  distributed.py; distribution, Keras on jax under keras.distribution.DataParallel)
  environment            environment.py
  run, the probes,       common/backend.py: written once for every backend
  predict, ...

Keras picks its framework once, when it is imported (KERAS_BACKEND): jax in the worker's process, torch in the
ddp ranks, which distributed.py starts with KERAS_BACKEND=torch. So it is set here, before anything in this package
imports Keras, unless the environment chose already. Simulated devices: as the jax backend's, the first N of the
CPU devices XLA is asked for before jax is imported (common.worker.simulated_devices; a count already in XLA_FLAGS
is kept).
"""

import os

from common.worker import simulated_devices

os.environ.setdefault("KERAS_BACKEND", "jax")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={simulated_devices()}"
    ).strip()

from backends.keras import distributed, models, strategies  # noqa: E402  (after KERAS_BACKEND and the XLA flag)
from backends.keras.environment import environment, refusal  # noqa: E402
from backends.keras.models import lenet, resnet18, resnet50  # noqa: E402
from backends.keras.parallel import allreduce, device_of, devices, split  # noqa: E402
from backends.keras.strategies import TRAINERS  # noqa: E402
from common.backend import ENTRY_POINTS, Backend  # noqa: E402

NAME = "keras"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# The backend interface (common/backend.py's INTERFACE): its own names, then the entry points, which
# __getattr__ below gives as backends.keras.<entry point>.
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
    import keras

    return keras.ops.convert_to_numpy(a)


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    from backends.keras.parallel import on_device

    return on_device(values, device)

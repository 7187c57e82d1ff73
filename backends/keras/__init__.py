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
imports Keras, unless the environment chose already. Simulated devices: as the jax backend's, the first N of
SIMULATED_DEVICES CPU devices XLA is asked for before jax is imported (a count already in XLA_FLAGS is kept).
"""

import os

from common.config import (
    MAX_SIMULATED_DEVICES as SIMULATED_DEVICES,  # the limit of --gpus on a CPU-only host
)

os.environ.setdefault("KERAS_BACKEND", "jax")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={SIMULATED_DEVICES}"
    ).strip()

from backends.keras import distributed, models, strategies  # noqa: E402  (after KERAS_BACKEND and the XLA flag)
from backends.keras.environment import environment, refusal  # noqa: E402
from backends.keras.models import lenet, resnet18, resnet50  # noqa: E402
from backends.keras.parallel import allreduce, device_of, devices, split  # noqa: E402
from backends.keras.strategies import TRAINERS  # noqa: E402
from common.backend import Backend  # noqa: E402

NAME = "keras"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# Its entry points, as module names (the worker, the check and the tests call backends.<name>.<entry point>).
(
    initial_weights,
    param_count,
    predict,
    run,
    gradients,
    train_trace,
    train_steps,
    float64_gradients,
    float64_reference,
    check_supported,
    session,
) = BACKEND.entry_points()

# The backend interface (common/backend.py's INTERFACE): the same names, in the same order, in every backend.
__all__ = [
    "NAME",
    "resnet18",
    "lenet",
    "resnet50",
    "initial_weights",
    "param_count",
    "devices",
    "split",
    "allreduce",
    "predict",
    "run",
    "environment",
    "gradients",
    "train_trace",
    "train_steps",
    "float64_gradients",
    "float64_reference",
    "check_supported",
    "session",
    "TRAINERS",
    "array",
    "to_numpy",
    "device_of",
    "BACKEND",
]


def to_numpy(a):
    import keras

    return keras.ops.convert_to_numpy(a)


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    from backends.keras.parallel import on_device

    return on_device(values, device)

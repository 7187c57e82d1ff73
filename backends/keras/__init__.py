"""Keras 3 backend: the backend interface (docs/ARCHITECTURE.md) in Keras, on the framework each strategy runs it on.

  resnet18, lenet,       models.py (keras.layers, one model code for both frameworks)
  resnet50
  devices, split,        parallel.py
  allreduce
  run, train_steps,      strategies.py (TRAINERS: ddp, Keras on torch under DistributedDataParallel, its ranks
  train_trace,           started by distributed.py; distribution, Keras on jax under keras.distribution.DataParallel)
  gradients
  environment            environment.py

Keras picks its framework once, when it is imported (KERAS_BACKEND): jax in the worker's process, torch in the
ddp ranks, which distributed.py starts with KERAS_BACKEND=torch. So it is set here, before anything in this package
imports Keras, unless the environment chose already. Simulated devices: as the jax backend's, the first N of
SIMULATED_DEVICES CPU devices XLA is asked for before jax is imported (a count already in XLA_FLAGS is kept).
"""

import os

from common.config import MAX_SIMULATED_DEVICES as SIMULATED_DEVICES   # the limit of --gpus on a CPU-only host

os.environ.setdefault("KERAS_BACKEND", "jax")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={SIMULATED_DEVICES}").strip()

from backends.keras.environment import environment  # noqa: E402  (after KERAS_BACKEND and the XLA flag)
from backends.keras.models import build, count_params, lenet, load_canonical, resnet18, resnet50  # noqa: E402
from backends.keras.parallel import allreduce, device_of, devices, split  # noqa: E402
from backends.keras.strategies import (TRAINERS, float64_gradients, gradients, run, train_steps,  # noqa: E402
                                       train_trace)

NAME = "keras"

# The backend interface (docs/ARCHITECTURE.md): the same names in every backend.
__all__ = ["NAME", "resnet18", "lenet", "resnet50", "initial_weights", "param_count", "devices", "split", "allreduce",
           "predict", "run", "environment", "gradients", "train_trace", "train_steps", "float64_gradients",
           "TRAINERS", "array", "to_numpy", "device_of"]


def initial_weights(model: str, seed: int = 0):
    """The canonical initial weights of `model` (common/weights.py), as every run starts from."""
    from common.architectures import spec
    from common.weights import init_canonical
    return init_canonical(spec(model), seed)


def param_count(model: str) -> int:
    return count_params(build(model))


def predict(model: str, weights, x, train: bool = False, dtype: str = "float32"):
    """Logits (numpy) of `model` with canonical `weights` on a numpy NCHW batch, on one CPU device; train=True
    normalises with the batch's own statistics (the running statistics it would update are dropped)."""
    import keras
    import numpy as np
    from backends.keras.environment import computing_in
    from backends.keras.models import policy
    with computing_in(dtype), keras.device("cpu:0"):
        net = build(model, policy("fp32", dtype))
        load_canonical(net, weights)
        values = [v.value for v in net.trainable_variables], [v.value for v in net.non_trainable_variables]
        logits, _ = net.stateless_call(*values, np.asarray(x, dtype=dtype), training=train)
        return keras.ops.convert_to_numpy(logits)


def to_numpy(a):
    import keras
    return keras.ops.convert_to_numpy(a)


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    from backends.keras.parallel import on_device
    return on_device(values, device)

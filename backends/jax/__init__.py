"""JAX backend: the backend interface (docs/ARCHITECTURE.md) in JAX, flax (linen) and optax.

  resnet18, lenet,       models.py
  resnet50
  devices, split,        parallel.py
  allreduce
  run, train_steps,      strategies.py (TRAINERS: pmap, sharding; the math they share in models.py)
  gradients, train_trace
  environment            environment.py (with the precision settings and float64's computing_in)

Simulated devices: without GPUs, a run uses the first N of SIMULATED_DEVICES CPU
devices that XLA is asked for here. The flag is read once, when jax initialises its
CPU backend, so it is set before anything in this package imports jax (a count already
in XLA_FLAGS is kept). It changes nothing on the GPUs.
"""

import os

from common.config import MAX_SIMULATED_DEVICES as SIMULATED_DEVICES   # the limit of --gpus on a CPU-only host


def _ask_xla_for_cpu_devices(count: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


_ask_xla_for_cpu_devices(SIMULATED_DEVICES)

from backends.jax.environment import environment  # noqa: E402  (after the XLA flag)
from backends.jax.models import (build, count_params, forward, from_canonical, lenet, resnet18,  # noqa: E402
                                 resnet50, spec)
from backends.jax.parallel import allreduce, devices, split  # noqa: E402
from backends.jax.strategies import (TRAINERS, float64_gradients, gradients, run, train_steps,  # noqa: E402
                                     train_trace)

NAME = "jax"

# The backend interface (docs/ARCHITECTURE.md): the same names in every backend.
__all__ = ["NAME", "resnet18", "lenet", "resnet50", "initial_weights", "param_count", "devices", "split",
           "allreduce", "predict", "run", "environment", "gradients", "train_trace", "train_steps",
           "float64_gradients", "TRAINERS", "array", "to_numpy", "device_of"]


def initial_weights(model: str, seed: int = 0):
    """The canonical initial weights of `model` (common/weights.py), as every run starts from."""
    from common.weights import init_canonical
    return init_canonical(spec(build(model)), seed)


def param_count(model: str) -> int:
    return count_params(build(model))


def predict(model: str, weights, x, train: bool = False, dtype: str = "float32"):
    """Logits (numpy) of `model` with canonical `weights` on a numpy NCHW batch, on one CPU device.

    Eval mode normalises with the running statistics; train=True with the batch's own statistics
    (the running statistics it would update are dropped). dtype "float64" computes in float64."""
    import jax
    import numpy as np
    from backends.jax.environment import DTYPES, computing_in, module_dtypes
    # On the CPU at full float32 precision whatever the host has: on a GPU XLA's default would be TF32
    # matmuls, and the equivalence check compares these logits with the other backends' CPU logits.
    with computing_in(dtype), jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
        net = build(model, **module_dtypes("fp32", dtype))
        out = forward(net, from_canonical(net, weights), np.asarray(x, dtype=DTYPES[dtype]), train=train)
        return np.asarray(out[0] if train else out)


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

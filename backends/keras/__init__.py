"""Keras 3 backend: ddp (Keras on torch under DistributedDataParallel, its ranks started by torch's launcher),
distribution (Keras on jax under keras.distribution.DataParallel) and fsdp (Keras on jax under
keras.distribution.ModelParallel, the variables sharded over the batch's devices), strategies.py. What a backend is:
common/backend.py; docs/ARCHITECTURE.md.

Keras picks its framework once, when it is imported (KERAS_BACKEND): jax in the worker's process, torch in the
ddp ranks, which distributed.py starts with KERAS_BACKEND=torch. So it is set here, before anything in this package
imports Keras, unless the environment chose already. Simulated devices: as the jax backend's, the first N of the
CPU devices XLA is asked for before jax is imported (common.worker.ask_xla_for_cpu_devices).
"""

import os

from common.worker import ask_xla_for_cpu_devices

os.environ.setdefault("KERAS_BACKEND", "jax")
ask_xla_for_cpu_devices()

from backends.keras import distributed, environment, models, parallel, strategies  # noqa: E402
from common.backend import Backend, Switches  # noqa: E402
from profilers import keras as profiler  # noqa: E402

# Float32 math as --precision says in the framework this process runs Keras on, before each trainer is built;
# Keras's floatx (and jax_enable_x64 on jax) while a float64 probe computes
SWITCHES = Switches(environment.configure_precision, environment.computing_in)
BACKEND = Backend(
    "keras", models, parallel, strategies, environment, distributed, profiler, SWITCHES
)
